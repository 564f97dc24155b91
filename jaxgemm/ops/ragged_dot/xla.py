"""The `xla` backend of ragged_dot: `lax.ragged_dot_general`, the reference.

What `backend="auto"` runs where no kernel is known to win, and what the
kernels are checked and timed against. On the H200 XLA lowers it to cuBLAS
calls plus three fusions, 7-100x slower than a grouped kernel (issue 26's
measurements; the `moe` benchmark suite has ours).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import registry
from jaxgemm.config import KernelConfig
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem


@dataclasses.dataclass(frozen=True)
class XlaRaggedDotConfig(KernelConfig):
  """XLA chooses its own program; no fields (kept for a uniform API)."""

  backend = "xla"


def dimension_numbers(problem: RaggedDotProblem) -> lax.RaggedDotDimensionNumbers:
  """lax's numbers for the canonical operands (batch dimension 0 on all three)."""
  if problem.ragged_contracting:   # lhs (B, M, K), rhs (B, M, N): M contracted, ragged
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [1]), ([0], [0])),
        lhs_ragged_dimensions=[1], rhs_group_dimensions=[])
  rhs_contracting = 3 if problem.trans_rhs else 2
  return lax.RaggedDotDimensionNumbers(
      dot_dimension_numbers=(([2], [rhs_contracting]), ([0], [0])),
      lhs_ragged_dimensions=[1], rhs_group_dimensions=[1])


class XlaRaggedDot(registry.Backend):
  op = "ragged_dot"
  name = "xla"
  kernel_modules = ("jaxgemm.ops.ragged_dot.xla",)
  config_cls = XlaRaggedDotConfig
  variants = ("ragged_dot_general",)

  def check(self, problem: RaggedDotProblem, variant: str, config: KernelConfig) -> None:
    registry.require_dtypes(problem, "backend='xla'", registry.FLOAT_DTYPES)

  def default_config(self, problem: RaggedDotProblem, variant: str) -> XlaRaggedDotConfig:
    return XlaRaggedDotConfig()

  def impl(self, problem: RaggedDotProblem, variant: str, config: KernelConfig,
           platform: str):
    numbers = dimension_numbers(problem)
    # As for matmul: a 16-bit result asked for directly keeps XLA's own program.
    narrow_out = np.dtype(problem.out_dtype).itemsize <= np.dtype(problem.dtype).itemsize
    preferred = problem.out_dtype if narrow_out else problem.acc_dtype

    def xla_ragged_dot(lhs, rhs, group_bounds):
      sizes = group_bounds[:, 1] - group_bounds[:, 0]
      if problem.rows_before_groups:
        # lax's groups start at row 0: move this device's first group there.
        shift = jax.vmap(lambda x, s: jnp.roll(x, -s, axis=0))
        first = group_bounds[:, 0, 0]
        lhs = shift(lhs, first)
        if problem.ragged_contracting:
          rhs = shift(rhs, first)
      out = lax.ragged_dot_general(lhs, rhs, sizes, numbers, precision=problem.precision,
                                   preferred_element_type=preferred)
      if problem.ragged_contracting:   # lax puts the group dimension first: (G, B, K, N)
        out = jnp.moveaxis(out, 0, 1)
      elif problem.rows_before_groups:   # back in place; the rows rolled in are zeros
        out = jax.vmap(lambda x, s: jnp.roll(x, s, axis=0))(out, first)
      return out.astype(problem.out_dtype)

    return xla_ragged_dot


registry.register(XlaRaggedDot())
