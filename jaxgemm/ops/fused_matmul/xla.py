"""The `xla` backend of fused_matmul: the jnp expression a user would write.

`activation(a @ b + bias) + residual` with the product in the result's dtype,
then the epilogue in that dtype, as `jax.nn` and jnp compute it: XLA's own
program of the expression, which is what `backend="auto"` falls back to and
what the benchmark's ratios are against. (More rounding than the kernels,
which round once from fp32; the tests compare both with float64.)
"""

from __future__ import annotations


from jaxgemm import registry
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.matmul.xla import XlaConfig, XlaMatmul


class XlaFusedMatmul(registry.Backend):
  op = "fused_matmul"
  name = "xla"
  kernel_modules = ("jaxgemm.ops.fused_matmul.xla",)
  config_cls = XlaConfig
  variants = ("dot_general",)

  def check(self, problem: FusedMatmulProblem, variant: str, config) -> None:
    registry.require_dtypes(problem, "backend='xla'", registry.FLOAT_DTYPES)

  def default_config(self, problem: FusedMatmulProblem, variant: str) -> XlaConfig:
    return XlaConfig()

  def impl(self, problem: FusedMatmulProblem, variant: str, config, platform: str):
    dot = XlaMatmul().impl(problem.as_gemm(), variant, config, platform)
    out_dtype = problem.out_dtype
    gate = lambda z: activations.derivative(problem.gate_activation, z)

    def xla_fused(a, b, *extras):
      if problem.gate == "out":
        (z,) = extras
        return (gate(z) * dot(a, b)).astype(out_dtype)
      if problem.gate == "lhs":
        return dot((a * gate(extras[0])).astype(a.dtype), b)
      if problem.gate == "rhs":
        return dot(a, (b * gate(extras[0])).astype(b.dtype))
      z = dot(a, b)
      extras = list(extras)
      if problem.bias:
        bias = extras.pop(0)
        z = z + (bias if problem.bias == "shared" else bias[:, None, :])
      y = activations.apply(problem.activation, z)
      if problem.residual:
        y = y + extras.pop(0)
      y = y.astype(out_dtype)
      return (y, z.astype(out_dtype)) if problem.save_preactivation else y

    return xla_fused


registry.register(XlaFusedMatmul())
