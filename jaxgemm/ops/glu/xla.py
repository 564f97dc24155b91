"""The `xla` backend of glu: the jnp expression a user would write,
`activation(x @ w_gate + b_gate) * (x @ w_up + b_up)`, XLA's own program of it."""

from __future__ import annotations

from jaxgemm import registry
from jaxgemm.ops import activations
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul.xla import XlaConfig, XlaMatmul


class XlaGlu(registry.Backend):
  op = "glu"
  name = "xla"
  kernel_modules = ("jaxgemm.ops.glu.xla",)
  config_cls = XlaConfig
  variants = ("dot_general",)

  def check(self, problem: GluProblem, variant: str, config) -> None:
    registry.require_dtypes(problem, "backend='xla'", registry.FLOAT_DTYPES)

  def default_config(self, problem: GluProblem, variant: str) -> XlaConfig:
    return XlaConfig()

  def impl(self, problem: GluProblem, variant: str, config, platform: str):
    dot = XlaMatmul().impl(problem.as_gemm(), variant, config, platform)

    def xla_glu(x, w_gate, w_up, *biases):
      zg, zu = dot(x, w_gate), dot(x, w_up)
      if problem.bias:
        expand = (lambda b: b) if problem.bias == "shared" else (lambda b: b[:, None, :])
        zg, zu = zg + expand(biases[0]), zu + expand(biases[1])
      h = (activations.apply(problem.activation, zg) * zu).astype(problem.out_dtype)
      return (h, zg, zu) if problem.save_preactivation else h

    return xla_glu


registry.register(XlaGlu())
