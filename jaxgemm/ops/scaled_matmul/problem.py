"""`ScaledMatmulProblem`: one `scaled_matmul_p` call, an FP8 GEMM with scales."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxgemm.gemm import BLOCK, SCALE_DTYPE, SCALE_DTYPES, GemmProblem

# The result dtypes. (The operand and scale dtypes and the scale BLOCK are the FP8
# formats of `jaxgemm.gemm`, which the quantizer kernel shares.)
OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(jnp.float32))
# How the scales cover the operands (shapes in `ScaledMatmulProblem`'s docstring).
SCALE_KINDS = ("tensor", "row_col", "block")


def blocks(size: int) -> int:
  """How many BLOCK-wide blocks cover `size` (the last one may be partial)."""
  return math.ceil(size / BLOCK)


@dataclasses.dataclass(frozen=True)
class ScaledMatmulProblem(GemmProblem):
  """C[b] = (op(A[b]) * a_scale) @ (op(B[b]) * b_scale), accumulated in fp32, stored in out_dtype.

  A in `dtype`, B in `b_dtype` (float8_e4m3fn or float8_e5m2, any pairing);
  scales float32, in the logical orientation of op(A) (M rows) and op(B)
  (N columns) whatever the transpose flags, canonical (3-D) shapes:

      scale_kind   a_scale                    b_scale
      "tensor"     ()                         ()
      "row_col"    (batch, M, 1)              (batch, 1, N)
      "block"      (batch, M, ceil(K/128))    (batch, ceil(K/128), ceil(N/128))

  "block" is the DeepSeek-V3 recipe: 1x128 blocks of A (per row, per 128 of K)
  and 128x128 blocks of B; the product is a sum over 128-wide K blocks of fp32
  partial products, each scaled by its blocks' scales.

  >>> import numpy as np, jax.numpy as jnp
  >>> p = ScaledMatmulProblem(1, 256, 512, 1024, np.dtype(jnp.float8_e4m3fn),
  ...                         np.dtype(jnp.bfloat16), np.dtype(np.float32),
  ...                         b_dtype=np.dtype(jnp.float8_e5m2), scale_kind="block")
  >>> p.describe(), p.a_scale_shape, p.b_scale_shape
  ('1x(256x1024 @ 1024x512) NN float8_e4m3fn x float8_e5m2->bfloat16 block scales', (1, 256, 8), (1, 8, 4))
  """

  op = "scaled_matmul"

  b_dtype: np.dtype | None = None   # None: `dtype`
  scale_kind: str = "tensor"
  scale_dtype: np.dtype = SCALE_DTYPE   # of both scales (SCALE_DTYPES)

  def __post_init__(self):
    if self.b_dtype is None:
      object.__setattr__(self, "b_dtype", np.dtype(self.dtype))
    if self.scale_kind not in SCALE_KINDS:
      raise ValueError(f"scale_kind={self.scale_kind!r} must be one of {SCALE_KINDS}")
    if np.dtype(self.scale_dtype) not in SCALE_DTYPES:
      raise ValueError(f"scale_dtype={self.scale_dtype!r} must be one of "
                       f"{[d.name for d in SCALE_DTYPES]}")
    object.__setattr__(self, "scale_dtype", np.dtype(self.scale_dtype))

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
  def a_scale_shape(self) -> tuple[int, ...]:
    return {"tensor": (), "row_col": (self.batch, self.m, 1),
            "block": (self.batch, self.m, self.k_blocks)}[self.scale_kind]

  @property
  def b_scale_shape(self) -> tuple[int, ...]:
    return {"tensor": (), "row_col": (self.batch, 1, self.n),
            "block": (self.batch, self.k_blocks, self.n_blocks)}[self.scale_kind]

  @property
  def min_bytes(self) -> int:
    elems_in = self.batch * self.m * self.k + self.batch * self.k * self.n
    scales = math.prod(self.a_scale_shape) + math.prod(self.b_scale_shape)
    return (elems_in + 4 * scales
            + self.batch * self.m * self.n * np.dtype(self.out_dtype).itemsize)

  @property
  def aligned(self) -> bool:
    """Every operand row and the output's 16-byte aligned (1-byte operands)."""
    a_row = self.m if self.trans_a else self.k
    b_row = self.k if self.trans_b else self.n
    return (a_row % 16 == 0 and b_row % 16 == 0
            and self.n * np.dtype(self.out_dtype).itemsize % 16 == 0)

  @property
  def fp32_precision(self) -> str | None:
    return None

  @property
  def accuracy_class(self) -> str:
    return "fp8"

  def cache_fields(self) -> tuple[str, ...]:
    dtypes = (f"{np.dtype(self.dtype).name}x{np.dtype(self.b_dtype).name}"
              f"->{np.dtype(self.out_dtype).name}")
    scales = self.scale_kind + (" pow2" if self.pow2_scales else "")
    return (dtypes, scales, self.layout)

  def describe(self) -> str:
    return (f"{self.batch}x({self.m}x{self.k} @ {self.k}x{self.n}) {self.layout} "
            f"{np.dtype(self.dtype).name} x {np.dtype(self.b_dtype).name}"
            f"->{np.dtype(self.out_dtype).name} {self.scale_kind} "
            f"{'power-of-two ' if self.pow2_scales else ''}scales")

  def as_gemm(self) -> GemmProblem:
    """The bare GEMM of the same shapes (what matmul heuristics size tiles for)."""
    return GemmProblem(self.batch, self.m, self.n, self.k, self.dtype, self.out_dtype,
                       self.acc_dtype, self.trans_a, self.trans_b, self.precision)


# Where a kernel beats XLA's program with no tuning record (`kernel_win`).
WIN_DEVICE_KINDS = ("H100", "H200")
WIN_MIN_MN = 4096


def kernel_win(problem: ScaledMatmulProblem, device_kind: str) -> tuple[str, str] | None:
  """(backend, why) of the kernel `backend="auto"` runs for `problem` untuned, or None.

  Measured on the H100, e4m3 -> bf16, heuristic configs, CUPTI with XLA's scaled
  form in the same run (the fp8 suite at 285493c, H100: `make gpu-bench
  BENCH_ARGS="--suite fp8 --default-only"`; the FP8 kernel probe at eeb0d94):

  * from 4096 rows and 4096 columns, Pallas: per-tensor scales 1.45x, 1.59x and
    2.01x XLA at 8192^3, 8192x4096x14336 and 4096^3 (Triton 1.16-1.58x); block
    scales 14.3x at 8192^3 (XLA has no block-scaled GEMM: `xla.scaled_product`
    runs one GEMM per 128 of K; Triton 13.8x). On the H200 (2026-11-26,
    the fp8 suite at 234bc9c) Pallas per tensor 1.35-1.81x, block
    scales through its TMA-scales variant 15.9-17.6x (Triton 10.2-12.2x), the
    block-scaled dgrad and wgrad 17.4x and 15.5x;
  * below, Triton: 1.02x at 128x4096x14336 per tensor then (Pallas 0.95x), 2.18-2.21x
    since it swaps the operands there (the fp8 suite at 665c6f9 to 9f5a332, H100s;
    `TritonScaledMatmul._swaps`); and, for
    the fp32 accumulation the op promises, the `xla` backend runs HIGHEST, which at
    128 rows is 0.15x of XLA's default-precision form, so the kernel keeps both
    speed and accuracy there;
  * a mixed e4m3 x e5m2 pair with per-tensor scales (the per-tensor recipe's dgrad
    and wgrad), none: on the H200 XLA's scaled form ran the layer's dgrad
    (8192x14336x4096, NT) at 1425 TFLOP/s and wgrad (4096x8192x14336, TN) at 1172,
    where Triton ran 0.70x and 0.78x of it, Pallas (which casts to float16) 0.46x and
    0.50x, and the `xla` backend (HIGHEST) 0.95x and 0.93x (the fp8 suite at 6b50250, on one GPU of
    an nvidia-h200-x2);
  * a mixed pair with block scales, Triton (its PTX has the mixed fp8 wgmma; XLA's
    block-scaled form is one GEMM per 128 of K, 10-16x slower in the same-dtype
    timings). Inferred, not timed.
  """
  if not any(kind in device_kind for kind in WIN_DEVICE_KINDS):
    return None
  if problem.dtype != problem.b_dtype:
    if problem.scale_kind == "tensor":
      return None
    return "triton", "mixed fp8 pair, block scales: fp8 wgmma of both types"
  if problem.m >= WIN_MIN_MN and problem.n >= WIN_MIN_MN:
    return "pallas", (f"{problem.scale_kind} scales from {WIN_MIN_MN} rows and columns: "
                      f"persistent warp-specialized FP8 wgmma, promoted every 128 of K")
  return "triton", f"{problem.scale_kind} scales below {WIN_MIN_MN} rows or columns: FP8 wgmma"
