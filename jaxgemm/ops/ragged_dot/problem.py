"""`RaggedDotProblem`: the static description of one `ragged_dot_p` call."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from jaxgemm.ops.base import Problem, fp32_precision


@dataclasses.dataclass(frozen=True)
class RaggedDotProblem(Problem):
  """One grouped GEMM. The rows of `lhs` (M of them) are split into G contiguous groups
  whose bounds are a device array (`group_bounds`, (batch, 2, G)), known only when it runs.

  Two modes (jax calls them ragged non-contracting and ragged contracting):

  * `ragged_contracting=False`, the forward of a mixture-of-experts layer:
    lhs (B, M, K), rhs (B, G, K, N) (or (B, G, N, K) with `trans_rhs`),
    out (B, M, N) with out[b, rows of g] = lhs[b, rows of g] @ rhs[b, g]; rows
    in no group are zeros.
  * `ragged_contracting=True`, the weight gradient: lhs (B, M, K), rhs (B, M, N),
    out (B, G, K, N) with out[b, g] = lhs[b, rows of g]^T @ rhs[b, rows of g];
    an empty group's block is zeros.

  >>> import numpy as np, jaxgemm
  >>> p = jaxgemm.RaggedDotProblem(1, 8, 4096, 1024, 512, np.dtype("bfloat16"),
  ...                              np.dtype("bfloat16"), np.dtype("float32"))
  >>> p.describe(), p.rhs_shape, p.out_shape
  ('1x(4096x1024 @ 8x1024x512) ragged-M bfloat16->bfloat16', (1, 8, 1024, 512), (1, 4096, 512))
  """

  op = "ragged_dot"

  batch: int
  groups: int
  m: int                 # rows of lhs: the ragged dimension, split into groups
  k: int
  n: int
  dtype: np.dtype        # of lhs and rhs
  out_dtype: np.dtype
  acc_dtype: np.dtype
  trans_rhs: bool = False
  ragged_contracting: bool = False
  precision: tuple[lax.Precision, lax.Precision] | None = None
  # One device's share of a sharded call: its first group may start past row 0
  # (the kernels handle any bounds; XLA's ragged_dot needs them moved to row 0).
  rows_before_groups: bool = False

  @property
  def lhs_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.m, self.k)

  @property
  def rhs_shape(self) -> tuple[int, ...]:
    if self.ragged_contracting:
      return (self.batch, self.m, self.n)
    if self.trans_rhs:
      return (self.batch, self.groups, self.n, self.k)
    return (self.batch, self.groups, self.k, self.n)

  @property
  def group_bounds_shape(self) -> tuple[int, int, int]:
    return (self.batch, 2, self.groups)

  @property
  def out_shape(self) -> tuple[int, ...]:
    if self.ragged_contracting:
      return (self.batch, self.groups, self.k, self.n)
    return (self.batch, self.m, self.n)

  @property
  def dims(self) -> dict[str, int]:
    return {"b": self.batch, "g": self.groups, "m": self.m, "k": self.k, "n": self.n}

  @property
  def mode(self) -> str:
    return "ragged-K" if self.ragged_contracting else "ragged-M"

  @property
  def flops(self) -> int:
    """FLOPs when every row of lhs is in a group (the groups' sizes sum to M)."""
    return 2 * self.batch * self.m * self.k * self.n

  @property
  def min_bytes(self) -> int:
    """Bytes moved when every operand is read once and the output written once (all
    groups non-empty: an empty group's weights are not read)."""
    item, out_item = np.dtype(self.dtype).itemsize, np.dtype(self.out_dtype).itemsize
    lhs = self.batch * self.m * self.k * item
    if self.ragged_contracting:
      return lhs + self.batch * self.m * self.n * item + self.batch * self.groups * (
          self.k * self.n * out_item)
    return (lhs + self.batch * self.groups * self.k * self.n * item
            + self.batch * self.m * self.n * out_item)

  @property
  def aligned(self) -> bool:
    """Whether every operand's and the output's rows are 16-byte aligned."""
    item, out_item = np.dtype(self.dtype).itemsize, np.dtype(self.out_dtype).itemsize
    rhs_row = self.n if (self.ragged_contracting or not self.trans_rhs) else self.k
    return (self.k * item % 16 == 0 and rhs_row * item % 16 == 0
            and self.n * out_item % 16 == 0)

  @property
  def fp32_precision(self) -> str | None:
    """How fp32 operands are multiplied: "tf32", "tf32x3" or "ieee" (None if not fp32)."""
    return fp32_precision(self.dtype, self.precision)

  @property
  def accuracy_class(self) -> str:
    return self.fp32_precision or np.dtype(self.dtype).name

  def cache_fields(self) -> tuple[str, ...]:
    dtypes = f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}"
    return (dtypes, self.fp32_precision or "default", self.mode,
            "T" if self.trans_rhs else "N")

  def describe(self) -> str:
    rhs = (f"{self.m}x{self.n}" if self.ragged_contracting else
           f"{self.groups}x{self.n}x{self.k}^T" if self.trans_rhs else
           f"{self.groups}x{self.k}x{self.n}")
    lhs = f"{self.m}x{self.k}^T" if self.ragged_contracting else f"{self.m}x{self.k}"
    return (f"{self.batch}x({lhs} @ {rhs}) {self.mode} "
            f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}")
