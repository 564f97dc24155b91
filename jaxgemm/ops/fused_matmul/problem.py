"""`FusedMatmulProblem`: one `fused_matmul_p` call, a GEMM with an epilogue or a gate."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgemm.gemm import GemmProblem

# Where a bias comes from: one row for every batch ("shared", shape (N,)) or
# one per batch ("batched", shape (batch, N), after vmap over the bias).
BIAS_KINDS = (None, "shared", "batched")
# Which tensor a gate multiplies by activation'(Z): the product ("out", Z shaped
# like C), or an operand as it is loaded ("lhs": Z shaped like A as stored,
# "rhs": like B). These are the linear forms the backward GEMMs take.
GATES = (None, "out", "lhs", "rhs")


@dataclasses.dataclass(frozen=True)
class FusedMatmulProblem(GemmProblem):
  """A GEMM with an epilogue applied to the fp32 accumulator before its one store:

      Z = op(A) @ op(B) + bias;   Y = activation(Z) + residual

  (`save_preactivation`: the kernel also stores Z, in out_dtype, for the
  backward), or, in its gated forms (the backward GEMMs; no epilogue), with
  G = derivative of `gate_activation` at a tensor Z:

      gate "out": C = G * (op(A) @ op(B))      gate "lhs": C = op(A * G) @ op(B)
      gate "rhs": C = op(A) @ op(B * G)

  Operands, in order: A, B, then bias (shape (N,) or (batch, N), out_dtype),
  residual ((batch, M, N), out_dtype), or Z (the gated tensor's stored shape,
  any floating dtype: the kernels read it into fp32).

  >>> import numpy as np
  >>> p = FusedMatmulProblem(1, 128, 256, 64, np.dtype("float32"), np.dtype("float32"),
  ...                        np.dtype("float32"), activation="gelu", bias="shared")
  >>> p.describe()
  '1x(128x64 @ 64x256) NN float32->float32 +bias gelu'
  """

  op = "fused_matmul"

  activation: str | None = None
  bias: str | None = None
  residual: bool = False
  save_preactivation: bool = False
  gate: str | None = None
  gate_activation: str | None = None

  def __post_init__(self):
    if self.bias not in BIAS_KINDS or self.gate not in GATES:
      raise ValueError(f"bias={self.bias!r} must be one of {BIAS_KINDS} and gate={self.gate!r} "
                       f"one of {GATES}")
    if self.gate is not None and (self.activation or self.bias or self.residual
                                  or self.save_preactivation):
      raise ValueError("a gated problem has no epilogue (activation, bias, residual, "
                       "save_preactivation)")

  @property
  def epilogue(self) -> str:
    """The epilogue in words: "+bias gelu +residual", "gate out silu'", or "" for none."""
    if self.gate:
      return f"gate {self.gate} {self.gate_activation}'"
    parts = (["+bias" if self.bias == "shared" else "+bias[b]"] if self.bias else [])
    parts += [self.activation] if self.activation else []
    parts += ["+residual"] if self.residual else []
    parts += ["(saves Z)"] if self.save_preactivation else []
    return " ".join(parts)

  @property
  def bias_shape(self) -> tuple[int, ...]:
    return (self.n,) if self.bias == "shared" else (self.batch, self.n)

  @property
  def gate_shape(self) -> tuple[int, int, int]:
    """The stored shape of Z (that of the tensor it gates)."""
    return {"out": self.out_shape, "lhs": self.a_shape, "rhs": self.b_shape}[self.gate]

  @property
  def extra_shapes(self) -> tuple[tuple[int, ...], ...]:
    """Shapes of the operands after A and B, in order."""
    if self.gate:
      return (self.gate_shape,)
    return (((self.bias_shape,) if self.bias else ())
            + ((self.out_shape,) if self.residual else ()))

  @property
  def num_outputs(self) -> int:
    return 2 if self.save_preactivation else 1

  @property
  def min_bytes(self) -> int:
    out_item = np.dtype(self.out_dtype).itemsize
    extra = sum(int(np.prod(s)) for s in self.extra_shapes) * out_item
    saved = self.batch * self.m * self.n * out_item if self.save_preactivation else 0
    return super().min_bytes + extra + saved

  def cache_fields(self) -> tuple[str, ...]:
    return (*super().cache_fields(), self.epilogue or "none")

  def describe(self) -> str:
    return f"{super().describe()} {self.epilogue}".rstrip()

  def as_gemm(self) -> GemmProblem:
    """The bare GEMM of the same shapes (what the matmul heuristics size tiles for)."""
    return GemmProblem(self.batch, self.m, self.n, self.k, self.dtype, self.out_dtype,
                       self.acc_dtype, self.trans_a, self.trans_b, self.precision)


# Where the fused kernels beat XLA's program of the same expression with no tuning
# record (`Backend.structural_win`), from the epilogue suite at 5e779e5 (H100,
# bf16, CUPTI, XLA in the same run): an activation epilogue (gelu, silu) ran 1.03-1.05x
# on Pallas at M = 4096 and 8192 and 0.95-0.96x at M = 128, 1.01-1.05x on Triton at
# M = 128; SwiGLU (glu) 1.05x on Pallas at M = 8192. A bias or residual alone lost on both
# (0.94-0.99x: XLA folds a bias into cuBLAS's epilogue), and the forward that saves Z
# (fwd+bwd) ran 1.03x on Pallas against 1.04x for the same program on XLA's dot. The H200
# is the same architecture with more bandwidth, where a fused epilogue saves more; it is
# not measured yet.
EPILOGUE_WIN_DEVICE_KINDS = ("H100", "H200")
EPILOGUE_WIN_MIN_FLOPS = 2**33
# Rows from which Pallas's fused kernels led, and below which Triton's did.
EPILOGUE_WIN_PALLAS_MIN_M = 1024


def activation_epilogue_wins(problem, device_kind: str) -> bool:
  """Whether `problem` (a fused_matmul or glu problem) is of the class measured above:
  a 16-bit forward with an activation, no gate, not saving Z, on Hopper."""
  if not any(kind in device_kind for kind in EPILOGUE_WIN_DEVICE_KINDS):
    return False
  if getattr(problem, "gate", None) or problem.save_preactivation or not problem.activation:
    return False
  return (np.dtype(problem.dtype).itemsize == 2 and problem.dtype == problem.out_dtype
          and problem.flops >= EPILOGUE_WIN_MIN_FLOPS)
