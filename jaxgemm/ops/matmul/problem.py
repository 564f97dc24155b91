"""`GemmProblem`: the static description of one `matmul_p` call."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from jaxgemm.ops.base import Problem, fp32_precision


@dataclasses.dataclass(frozen=True)
class GemmProblem(Problem):
  """One canonical GEMM: C[b] = op(A[b]) @ op(B[b]), op = transpose if flagged.

  >>> import numpy as np, jaxgemm
  >>> p = jaxgemm.GemmProblem(1, 128, 256, 64, np.dtype("float32"), np.dtype("float32"),
  ...                         np.dtype("float32"), trans_b=True)
  >>> p.describe(), p.b_shape
  ('1x(128x64 @ 64x256) NT float32->float32', (1, 256, 64))
  """

  op = "matmul"

  batch: int
  m: int
  n: int
  k: int
  dtype: np.dtype        # of both operands
  out_dtype: np.dtype
  acc_dtype: np.dtype
  trans_a: bool = False
  trans_b: bool = False
  precision: tuple[lax.Precision, lax.Precision] | None = None

  @property
  def a_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.k, self.m) if self.trans_a else (self.batch, self.m, self.k)

  @property
  def b_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.n, self.k) if self.trans_b else (self.batch, self.k, self.n)

  @property
  def out_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.m, self.n)

  @property
  def dims(self) -> dict[str, int]:
    return {"b": self.batch, "m": self.m, "n": self.n, "k": self.k}

  @property
  def layout(self) -> str:
    """"NN", "NT", "TN" or "TT": which operands are stored transposed."""
    return ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k

  @property
  def min_bytes(self) -> int:
    """Bytes moved when each operand is read once and the output written once."""
    elems_in = self.batch * (self.m * self.k + self.k * self.n)
    return (elems_in * np.dtype(self.dtype).itemsize
            + self.batch * self.m * self.n * np.dtype(self.out_dtype).itemsize)

  @property
  def aligned(self) -> bool:
    """Whether every operand's and the output's rows are 16-byte aligned."""
    item, out_item = np.dtype(self.dtype).itemsize, np.dtype(self.out_dtype).itemsize
    a_row = self.m if self.trans_a else self.k
    b_row = self.k if self.trans_b else self.n
    return a_row * item % 16 == 0 and b_row * item % 16 == 0 and self.n * out_item % 16 == 0

  @property
  def fp32_precision(self) -> str | None:
    """How fp32 operands are multiplied: "tf32", "tf32x3" or "ieee" (None if not fp32)."""
    return fp32_precision(self.dtype, self.precision)

  @property
  def accuracy_class(self) -> str:
    return self.fp32_precision or np.dtype(self.dtype).name

  def cache_fields(self) -> tuple[str, ...]:
    dtypes = f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}"
    return (dtypes, self.fp32_precision or "default", self.layout)

  def describe(self) -> str:
    return (f"{self.batch}x({self.m}x{self.k} @ {self.k}x{self.n}) {self.layout} "
            f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}")
