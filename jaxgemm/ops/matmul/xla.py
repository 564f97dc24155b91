"""The `xla` backend: the reference every kernel is compared with.

`lax.dot_general` accumulating in float32 (float64 for float64 problems),
honouring the transpose flags through its dimension numbers, so XLA picks its
own kernel (cuBLAS on GPU, Eigen on CPU) for the very problem ours get.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax import lax

from jaxgemm import registry
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import GemmProblem


@dataclasses.dataclass(frozen=True)
class XlaConfig(KernelConfig):
  """XLA tunes itself; the config has no fields (kept for a uniform API)."""

  backend = "xla"


class XlaMatmul(registry.Backend):
  op = "matmul"
  name = "xla"
  # Code that decides a tuned config's speed: a change to it stales the records.
  kernel_modules = ("jaxgemm.ops.matmul.xla",)
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

    # Where the output is as wide as the operands (bf16 -> bf16), asking for it
    # directly keeps the product one cuBLAS call that accumulates in fp32
    # anyway: an fp32 result plus a convert ran at 0.92-0.95x of XLA's own
    # bf16 dot on the H200 (bench run h200-bf16-a, llm suite).
    narrow_out = np.dtype(problem.out_dtype).itemsize <= np.dtype(problem.dtype).itemsize
    preferred = problem.out_dtype if narrow_out else problem.acc_dtype

    def xla_dot(a, b):
      out = lax.dot_general(a, b, dims, precision=problem.precision,
                            preferred_element_type=preferred)
      return out.astype(problem.out_dtype)

    return xla_dot


registry.register(XlaMatmul())
