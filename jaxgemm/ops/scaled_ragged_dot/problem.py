"""`ScaledRaggedDotProblem`: one `scaled_ragged_dot_p` call, an FP8 grouped GEMM with scales."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxgemm.gemm import SCALE_DTYPE, SCALE_DTYPES
from jaxgemm.ops.base import Problem
# The result dtypes (bfloat16, float16, float32), the scale kinds and their blocks are
# scaled_matmul's: the same FP8 formats, per expert.
from jaxgemm.ops.scaled_matmul.problem import OUT_DTYPES, SCALE_KINDS, blocks

__all__ = ["OUT_DTYPES", "RAGGED_K_SCALE_KINDS", "SCALE_KINDS", "ScaledRaggedDotProblem",
           "blocks"]

# The ragged-K form's scale kinds: its contraction is the tokens, so no per-row scale.
RAGGED_K_SCALE_KINDS = ("tensor", "block")


@dataclasses.dataclass(frozen=True)
class ScaledRaggedDotProblem(Problem):
  """out[b, rows of g] = (lhs[b, rows of g] * lhs_scale) @ (rhs[b, g] * rhs_scale[b, g]),
  accumulated in fp32, stored in out_dtype; rows in no group are zeros.

  The ragged-M grouped GEMM of `RaggedDotProblem` (lhs (B, M, K) with its rows in G
  contiguous groups whose bounds are a device array, rhs (B, G, K, N), out (B, M, N)),
  of fp8 operands: lhs in `dtype`, rhs in `rhs_dtype` (float8_e4m3fn or float8_e5m2,
  any pairing), with scales of one kind for both, in canonical shapes:

      scale_kind   lhs_scale                  rhs_scale
      "tensor"     ()                         ()
      "row_col"    (B, M, 1)                  (B, G, 1, N)
      "block"      (B, M, ceil(K/128))        (B, G, ceil(K/128), ceil(N/128))

  "block" is the DeepSeek-V3 recipe per expert: 1x128 blocks of the tokens and
  128x128 blocks of each expert's weight; the product is a sum over 128-wide K
  blocks of fp32 partial products, each times its blocks' scales.

  `ragged_contracting=True` is the ragged-K form, the weight gradient (as
  `RaggedDotProblem`'s): lhs (B, M, K) and rhs (B, M, N), both fp8 with their rows in
  the groups, out (B, G, K, N) with out[b, g] = (lhs * lhs_scale)[b, rows of g]^T @
  (rhs * rhs_scale)[b, rows of g]; an empty group's block is zeros. The contraction is
  the tokens M, so the scales are per tensor or in blocks of 128 tokens (DeepSeek-V3's
  wgrad operands, quantize(x, block=(128, 1))):

      scale_kind   lhs_scale                  rhs_scale
      "tensor"     ()                         ()
      "block"      (B, ceil(M/128), K)        (B, ceil(M/128), N)

  The blocks lie on the global 128-row grid, not on the groups: a block may hold the
  end of one group and the start of the next, and each group's sum runs over the
  128-row blocks its rows touch, promoted to fp32 with the block's scales.

  >>> import numpy as np, jax.numpy as jnp
  >>> p = ScaledRaggedDotProblem(1, 8, 4096, 1024, 512, np.dtype(jnp.float8_e4m3fn),
  ...                            np.dtype(jnp.bfloat16), scale_kind="block")
  >>> p.describe(), p.lhs_scale_shape, p.rhs_scale_shape
  ('1x(4096x1024 @ 8x1024x512) float8_e4m3fn x float8_e4m3fn->bfloat16 block scales', (1, 4096, 8), (1, 8, 8, 4))
  """

  op = "scaled_ragged_dot"

  batch: int
  groups: int
  m: int                 # rows of lhs: the ragged dimension, split into groups
  k: int
  n: int
  dtype: np.dtype        # of lhs
  out_dtype: np.dtype
  rhs_dtype: np.dtype | None = None   # None: `dtype`
  scale_kind: str = "tensor"
  scale_dtype: np.dtype = SCALE_DTYPE   # of both scales (SCALE_DTYPES)
  # One device's share of a sharded call: its first group may start past row 0
  # (as RaggedDotProblem's; XLA's ragged_dot needs its groups moved to row 0).
  rows_before_groups: bool = False
  ragged_contracting: bool = False   # the ragged-K form (the class docstring)

  def __post_init__(self):
    if self.rhs_dtype is None:
      object.__setattr__(self, "rhs_dtype", np.dtype(self.dtype))
    if self.scale_kind not in SCALE_KINDS:
      raise ValueError(f"scale_kind={self.scale_kind!r} must be one of {SCALE_KINDS}")
    if np.dtype(self.scale_dtype) not in SCALE_DTYPES:
      raise ValueError(f"scale_dtype={self.scale_dtype!r} must be one of "
                       f"{[d.name for d in SCALE_DTYPES]}")
    if self.ragged_contracting and self.scale_kind not in RAGGED_K_SCALE_KINDS:
      raise ValueError(f"scale_kind={self.scale_kind!r} of the ragged-K form must be one of "
                       f"{RAGGED_K_SCALE_KINDS} (its contraction is the tokens)")
    for name in ("dtype", "rhs_dtype", "out_dtype", "scale_dtype"):
      object.__setattr__(self, name, np.dtype(getattr(self, name)))

  @property
  def pow2_scales(self) -> bool:
    """The scales are powers of two (float8_e8m0fnu): applying them is exact."""
    return self.scale_dtype != SCALE_DTYPE

  @property
  def k_blocks(self) -> int:
    return blocks(self.k)

  @property
  def n_blocks(self) -> int:
    return blocks(self.n)

  @property
  def m_blocks(self) -> int:
    return blocks(self.m)

  @property
  def mode(self) -> str:
    return "ragged-K" if self.ragged_contracting else "ragged-M"

  @property
  def lhs_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.m, self.k)

  @property
  def rhs_shape(self) -> tuple[int, ...]:
    if self.ragged_contracting:
      return (self.batch, self.m, self.n)
    return (self.batch, self.groups, self.k, self.n)

  @property
  def group_bounds_shape(self) -> tuple[int, int, int]:
    return (self.batch, 2, self.groups)

  @property
  def lhs_scale_shape(self) -> tuple[int, ...]:
    if self.ragged_contracting:
      return {"tensor": (), "block": (self.batch, self.m_blocks, self.k)}[self.scale_kind]
    return {"tensor": (), "row_col": (self.batch, self.m, 1),
            "block": (self.batch, self.m, self.k_blocks)}[self.scale_kind]

  @property
  def rhs_scale_shape(self) -> tuple[int, ...]:
    if self.ragged_contracting:
      return {"tensor": (), "block": (self.batch, self.m_blocks, self.n)}[self.scale_kind]
    return {"tensor": (), "row_col": (self.batch, self.groups, 1, self.n),
            "block": (self.batch, self.groups, self.k_blocks, self.n_blocks)}[self.scale_kind]

  @property
  def out_shape(self) -> tuple[int, ...]:
    if self.ragged_contracting:
      return (self.batch, self.groups, self.k, self.n)
    return (self.batch, self.m, self.n)

  @property
  def dims(self) -> dict[str, int]:
    return {"b": self.batch, "g": self.groups, "m": self.m, "k": self.k, "n": self.n}

  @property
  def flops(self) -> int:
    """FLOPs when every row of lhs is in a group (the groups' sizes sum to M)."""
    return 2 * self.batch * self.m * self.k * self.n

  @property
  def min_bytes(self) -> int:
    elems_in = math.prod(self.lhs_shape) + math.prod(self.rhs_shape)
    scales = math.prod(self.lhs_scale_shape) + math.prod(self.rhs_scale_shape)
    return (elems_in + self.scale_dtype.itemsize * scales
            + math.prod(self.out_shape) * self.out_dtype.itemsize)

  @property
  def aligned(self) -> bool:
    """Every operand row and the output's 16-byte aligned (1-byte operands)."""
    return self.k % 16 == 0 and self.n % 16 == 0 and self.n * self.out_dtype.itemsize % 16 == 0

  @property
  def accuracy_class(self) -> str:
    return "fp8"

  def cache_fields(self) -> tuple[str, ...]:
    dtypes = f"{self.dtype.name}x{self.rhs_dtype.name}->{self.out_dtype.name}"
    # The ragged-M keys as they were (recorded tunings keep their keys).
    return (dtypes, self.scale_kind + (" pow2" if self.pow2_scales else ""),
            *(("ragged-K",) if self.ragged_contracting else ()))

  def describe(self) -> str:
    if self.ragged_contracting:
      return (f"{self.batch}x({self.m}x{self.k}^T @ {self.m}x{self.n}) ragged-K "
              f"{self.dtype.name} x {self.rhs_dtype.name}->{self.out_dtype.name} "
              f"{self.scale_kind} scales")
    return (f"{self.batch}x({self.m}x{self.k} @ {self.groups}x{self.k}x{self.n}) "
            f"{self.dtype.name} x {self.rhs_dtype.name}->{self.out_dtype.name} "
            f"{self.scale_kind} scales")
