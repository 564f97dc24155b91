"""`GluProblem`: one `glu_p` call, a dual GEMM with a gated epilogue."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgemm.gemm import GemmProblem


@dataclasses.dataclass(frozen=True)
class GluProblem(GemmProblem):
  """Two GEMMs that share their left operand, combined before the one store:

      Zg = op(X) @ op(Wg) + bias_gate;  Zu = op(X) @ op(Wu) + bias_up
      H = activation(Zg) * Zu

  (`save_preactivation`: the kernel also stores Zg and Zu, in out_dtype).
  Operands, in order: X, Wg, Wu (both shaped `b_shape`), then, with `bias`,
  bias_gate and bias_up (shape (N,) or (batch, N), out_dtype).

  >>> import numpy as np
  >>> p = GluProblem(1, 128, 256, 64, np.dtype("float16"), np.dtype("float16"),
  ...                np.dtype("float32"), activation="silu")
  >>> p.describe(), p.flops
  ('1x(128x64 @ 64x256) NN float16->float16 glu silu', 8388608)
  """

  op = "glu"

  activation: str = "silu"
  bias: str | None = None
  save_preactivation: bool = False

  @property
  def bias_shape(self) -> tuple[int, ...]:
    return (self.n,) if self.bias == "shared" else (self.batch, self.n)

  @property
  def extra_shapes(self) -> tuple[tuple[int, ...], ...]:
    """Shapes of the operands after X, Wg and Wu, in order."""
    return (self.bias_shape, self.bias_shape) if self.bias else ()

  @property
  def num_outputs(self) -> int:
    return 3 if self.save_preactivation else 1

  @property
  def epilogue(self) -> str:
    parts = ["glu", self.activation] + (["+bias" if self.bias == "shared" else "+bias[b]"]
                                        if self.bias else [])
    return " ".join(parts + (["(saves Z)"] if self.save_preactivation else []))

  @property
  def flops(self) -> int:
    return 2 * super().flops

  @property
  def min_bytes(self) -> int:
    item, out_item = np.dtype(self.dtype).itemsize, np.dtype(self.out_dtype).itemsize
    a = self.batch * self.m * self.k * item
    w = 2 * self.batch * self.k * self.n * item
    out = self.num_outputs * self.batch * self.m * self.n * out_item
    bias = sum(int(np.prod(s)) for s in self.extra_shapes) * out_item
    return a + w + out + bias

  def cache_fields(self) -> tuple[str, ...]:
    return (*super().cache_fields(), self.epilogue)

  def describe(self) -> str:
    return f"{super().describe()} {self.epilogue}"

  def as_gemm(self) -> GemmProblem:
    """One of the two GEMMs (what the matmul heuristics size tiles for)."""
    return GemmProblem(self.batch, self.m, self.n, self.k, self.dtype, self.out_dtype,
                       self.acc_dtype, self.trans_a, self.trans_b, self.precision)
