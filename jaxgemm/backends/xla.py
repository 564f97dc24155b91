"""The `xla` backend: the reference every kernel is compared with.

`lax.dot_general` with a float32 (float64 for float64 problems) accumulator,
honouring the transpose flags through its dimension numbers, so XLA picks its
own kernel (cuBLAS on GPU, Eigen on CPU) for the very problem ours get.
"""

from __future__ import annotations

import dataclasses

from jax import lax

from jaxgemm import registry
from jaxgemm.config import KernelConfig
from jaxgemm.registry import GemmProblem


@dataclasses.dataclass(frozen=True)
class XlaConfig(KernelConfig):
  """XLA tunes itself; the config has no fields (kept for a uniform API)."""

  backend = "xla"


class XlaBackend(registry.Backend):
  name = "xla"
  config_cls = XlaConfig
  variants = ("dot_general",)

  def check(self, problem: GemmProblem, variant: str, config: KernelConfig) -> None:
    registry.require_dtypes(problem, "backend='xla'", registry.FLOAT_DTYPES)

  def default_config(self, problem: GemmProblem, variant: str) -> XlaConfig:
    return XlaConfig()

  def impl(self, problem: GemmProblem, variant: str, config: KernelConfig, platform: str):
    contract_a = 1 if problem.trans_a else 2
    contract_b = 2 if problem.trans_b else 1
    dims = (((contract_a,), (contract_b,)), ((0,), (0,)))

    def xla_dot(a, b):
      acc = lax.dot_general(a, b, dims, precision=problem.precision,
                            preferred_element_type=problem.acc_dtype)
      return acc.astype(problem.out_dtype)

    return xla_dot


registry.register(XlaBackend())
