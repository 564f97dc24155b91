"""The `xla` backend of scaled_ragged_dot: XLA's grouped GEMM of the scaled product, the reference.

What `backend="auto"` runs until a kernel is registered and measured faster, and
what kernels will be checked against. XLA has no FP8 grouped GEMM (nor a
block-scaled one), so the program is `lax.ragged_dot` on the fp8 values widened to
bfloat16, with the scales applied to its fp32 partial sums:

* "tensor" and "row_col": one grouped GEMM over all of K, times the scales:
  ``out[r] = (lhs8[r] @ rhs8[g(r)]) * lhs_scale[r] * rhs_scale[g(r)]`` (a scalar per
  tensor; per row of lhs and per column of each expert's rhs), g(r) the group of row r;
* "block": a sum over 128-wide K blocks (K zero-padded to whole blocks) of fp32
  partial products, each times its blocks' scales,
  ``lhs_scale[r, kb] * rhs_scale[g(r), kb, n // 128]``, in a `lax.fori_loop`: the
  partial sums are promoted to fp32 every 128 of K, as the FP8 kernels do.

Why this is the exact dequantized product up to fp32 rounding: every e4m3 and e5m2
value is a bfloat16 value (4 and 3 significant bits, exponents inside bf16's), so
the widening is exact; a product of two has at most 8 significant bits, exact in
fp32, and `lax.ragged_dot` sums them in fp32 (`preferred_element_type=float32`).
The scales are constant over each sum they multiply, so applying them to the fp32
sum is the dequantized operands' product (scaling is linear) with one fp32 rounding
per multiply, where dequantizing each operand element in fp32 first would round
every element. The one rounding to out_dtype is at the end.

Memory: the operands are widened to bf16 (2 bytes an element; XLA fuses the convert
where it can), and the block loop holds one 128-wide K slice of them at a time, the
fp32 accumulator and the rows' scales, (B, M, N) each. Nothing is dequantized to a
full fp32 copy of the weights.

The ragged-K form (the weight gradient: out[g] = lhs[rows g]^T @ rhs[rows g], the
tokens contracted) is ragged_dot's ragged-K program the same way: per tensor, one
grouped GEMM over all the rows times the two scalars; with blocks of 128 tokens, a
sum over the 128-row blocks of the global grid (M zero-padded to whole blocks), each
block's grouped GEMM on its 128 rows with the groups' bounds clipped to them (a block
may hold the end of one group and the start of the next: each gets its own rows),
times the block's scales ``lhs_scale[mb, k] * rhs_scale[mb, n]``. A group's term of
a block it has no rows in is zero whatever the scales hold, so an empty group's
result is zeros.

Rows in no group (past the sum of the sizes; on one device of a sharded call, the
other devices' rows) are zeros, whatever the scales hold. As with `ragged_dot`'s
xla backend, `lax.ragged_dot` may spread a NaN or Inf from an empty expert's
weights (an empty expert's scales are never read by this program).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import registry
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import BLOCK, FP8_DTYPES
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem
from jaxgemm.ops.ragged_dot import xla as ragged_dot_xla  # noqa: F401 (registers it)
from jaxgemm.ops.scaled_ragged_dot.problem import ScaledRaggedDotProblem

F32, BF16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)


@dataclasses.dataclass(frozen=True)
class XlaScaledRaggedDotConfig(KernelConfig):
  """XLA chooses its own program; no fields (kept for a uniform API)."""

  backend = "xla"


def _grouped_gemm(problem: ScaledRaggedDotProblem, k: int, platform: str):
  """ragged_dot's xla program for bf16 (B, M, k) x (B, G, k, N) -> fp32 (B, M, N): the
  groups moved to row 0 where a device's first group starts later, rows in no group zero."""
  plain = RaggedDotProblem(problem.batch, problem.groups, problem.m, k, problem.n, BF16, F32,
                           F32, rows_before_groups=problem.rows_before_groups)
  backend = registry.get_backend("xla", plain.op)
  return backend.impl(plain, backend.variants[-1], None, platform)


def _grouped_gemm_k(problem: ScaledRaggedDotProblem, m: int, platform: str):
  """ragged_dot's xla ragged-K program for bf16 (B, m, K) x (B, m, N) -> fp32 (B, G, K, N)."""
  plain = RaggedDotProblem(problem.batch, problem.groups, m, problem.k, problem.n, BF16, F32,
                           F32, ragged_contracting=True, rows_before_groups=True)
  backend = registry.get_backend("xla", plain.op)
  return backend.impl(plain, backend.variants[-1], None, platform)


def ragged_k_product(problem: ScaledRaggedDotProblem, lhs, rhs, group_bounds, lhs_scale,
                     rhs_scale, platform: str = "cpu"):
  """The ragged-K problem's (B, G, K, N) result from canonical operands (module docstring)."""
  lhs_scale, rhs_scale = lhs_scale.astype(F32), rhs_scale.astype(F32)
  starts, ends = group_bounds[:, 0], group_bounds[:, 1]                 # (B, G) each
  live = lambda first, last: ((starts < last) & (ends > first) & (ends > starts)
                              )[:, :, None, None]
  if problem.scale_kind == "tensor":
    acc = _grouped_gemm_k(problem, problem.m, platform)(
        lhs.astype(BF16), rhs.astype(BF16), group_bounds) * (lhs_scale * rhs_scale)
    acc = jnp.where(live(0, problem.m), acc, 0)
  else:
    mb, pad = problem.m_blocks, problem.m_blocks * BLOCK - problem.m
    if pad:   # zero rows add nothing, and are in no group
      lhs = jnp.pad(lhs, [(0, 0), (0, pad), (0, 0)])
      rhs = jnp.pad(rhs, [(0, 0), (0, pad), (0, 0)])
    gemm = _grouped_gemm_k(problem, BLOCK, platform)

    def step(i, acc):
      first = i * BLOCK
      lhs_i = lax.dynamic_slice_in_dim(lhs, first, BLOCK, axis=1).astype(BF16)
      rhs_i = lax.dynamic_slice_in_dim(rhs, first, BLOCK, axis=1).astype(BF16)
      bounds_i = jnp.clip(group_bounds - first, 0, BLOCK).astype(jnp.int32)
      lhs_s = lax.dynamic_index_in_dim(lhs_scale, i, axis=1, keepdims=False)   # (B, K)
      rhs_s = lax.dynamic_index_in_dim(rhs_scale, i, axis=1, keepdims=False)   # (B, N)
      term = gemm(lhs_i, rhs_i, bounds_i) * (lhs_s[:, None, :, None] * rhs_s[:, None, None, :])
      return acc + jnp.where(live(first, first + BLOCK), term, 0)

    acc = lax.fori_loop(0, mb, step, jnp.zeros(problem.out_shape, F32))
  return acc.astype(problem.out_dtype)


def group_of_rows(group_bounds, m: int):
  """(the group of each row, whether the row is in a group), each (B, M), from the
  bounds (B, 2, G): row r is in group g where bounds[:, 0, g] <= r < bounds[:, 1, g].
  Read from each group's own range, so the padded bounds of an unevenly sharded G,
  (0, 0), match no row. (B, M, G) booleans: a few bytes per row and expert."""
  rows = jnp.arange(m, dtype=jnp.int32)[None, :, None]
  mine = (group_bounds[:, None, 0, :] <= rows) & (rows < group_bounds[:, None, 1, :])
  group = jnp.sum(jnp.where(mine, jnp.arange(group_bounds.shape[-1], dtype=jnp.int32), 0),
                  axis=-1)
  return group, jnp.any(mine, axis=-1)


def _per_row(rhs_scale_rows, group):
  """rhs_scale's row of each lhs row's group: (B, G, X) -> (B, M, X)."""
  return jnp.take_along_axis(rhs_scale_rows, group[:, :, None], axis=1)


def _columns(block_scales, n: int):
  """(..., ceil(N/128)) block scales repeated over their columns: (..., N)."""
  return jnp.repeat(block_scales, BLOCK, axis=-1,
                    total_repeat_length=block_scales.shape[-1] * BLOCK)[..., :n]


def scaled_grouped_product(problem: ScaledRaggedDotProblem, lhs, rhs, group_bounds, lhs_scale,
                           rhs_scale, platform: str = "cpu"):
  """The problem's result from canonical operands, in XLA ops (the module docstring)."""
  lhs_scale, rhs_scale = lhs_scale.astype(F32), rhs_scale.astype(F32)
  group, in_group = group_of_rows(group_bounds, problem.m)
  if problem.scale_kind != "block":
    acc = _grouped_gemm(problem, problem.k, platform)(
        lhs.astype(BF16), rhs.astype(BF16), group_bounds)
    if problem.scale_kind == "tensor":
      acc = acc * (lhs_scale * rhs_scale)
    else:   # (B, M, 1) per row, (B, G, 1, N) per column of each expert
      acc = acc * lhs_scale * _per_row(rhs_scale[:, :, 0, :], group)
  else:
    kb, pad = problem.k_blocks, problem.k_blocks * BLOCK - problem.k
    if pad:   # zeros add nothing to a sum; the last block's scale covers them
      lhs = jnp.pad(lhs, [(0, 0), (0, 0), (0, pad)])
      rhs = jnp.pad(rhs, [(0, 0), (0, 0), (0, pad), (0, 0)])
    gemm = _grouped_gemm(problem, BLOCK, platform)

    def step(i, acc):
      lhs_i = lax.dynamic_slice_in_dim(lhs, i * BLOCK, BLOCK, axis=2).astype(BF16)
      rhs_i = lax.dynamic_slice_in_dim(rhs, i * BLOCK, BLOCK, axis=2).astype(BF16)
      lhs_s = lax.dynamic_slice_in_dim(lhs_scale, i, 1, axis=2)              # (B, M, 1)
      rhs_s = lax.dynamic_index_in_dim(rhs_scale, i, axis=2, keepdims=False)  # (B, G, Nb)
      rhs_s = _columns(_per_row(rhs_s, group), problem.n)                     # (B, M, N)
      return acc + gemm(lhs_i, rhs_i, group_bounds) * lhs_s * rhs_s

    acc = lax.fori_loop(0, kb, step, jnp.zeros(problem.out_shape, F32))
  return jnp.where(in_group[:, :, None], acc, 0).astype(problem.out_dtype)


class XlaScaledRaggedDot(registry.Backend):
  op = "scaled_ragged_dot"
  name = "xla"
  # The program runs ragged_dot's xla program too: an edit of either stales its records.
  kernel_modules = ("jaxgemm.ops.scaled_ragged_dot.xla", "jaxgemm.ops.ragged_dot.xla")
  config_cls = XlaScaledRaggedDotConfig
  variants = ("ragged_dot",)

  def check(self, problem: ScaledRaggedDotProblem, variant: str, config) -> None:
    for what, dtype in (("lhs", problem.dtype), ("rhs", problem.rhs_dtype)):
      if np.dtype(dtype) not in FP8_DTYPES:
        raise NotImplementedError(f"backend='xla' scaled_ragged_dot takes fp8 operands "
                                  f"{[d.name for d in FP8_DTYPES]}; got "
                                  f"{what}.dtype={np.dtype(dtype).name}")

  def default_config(self, problem: ScaledRaggedDotProblem,
                     variant: str) -> XlaScaledRaggedDotConfig:
    return XlaScaledRaggedDotConfig()

  def impl(self, problem: ScaledRaggedDotProblem, variant: str, config, platform: str):
    if problem.ragged_contracting:
      return lambda lhs, rhs, group_bounds, lhs_scale, rhs_scale: ragged_k_product(
          problem, lhs, rhs, group_bounds, lhs_scale, rhs_scale, platform)
    return lambda lhs, rhs, group_bounds, lhs_scale, rhs_scale: scaled_grouped_product(
        problem, lhs, rhs, group_bounds, lhs_scale, rhs_scale, platform)


registry.register(XlaScaledRaggedDot())
