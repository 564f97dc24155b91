"""Rung 1, `basic`: one output tile per CTA, TMA -> swizzled SMEM -> wgmma, no overlap.

What it adds: the Hopper building blocks, nothing else. Grid (B, M/tm, N/tn);
each CTA (one warpgroup) loops over K: TMA-copies an A and a B tile into
swizzled shared memory, waits on the barrier, issues wgmma into an f32
accumulator and waits for it, so copies and math never overlap. The epilogue
casts the accumulator, stages it in SMEM and TMA-stores it. Ragged edges are
TMA's: out-of-bounds loads read zeros, out-of-bounds stores are dropped.

Measured (H200, jax 0.11.2, default configs, CUPTI median of 20, bf16,
`research/pallas_probe.py all` run 3, its log at
0834948; XLA's dot in
the same process): 8192^3 608.9 TFLOP/s (0.75x XLA), 4096^3 578.2 (0.72x),
4095x4097x4093 372.8 (2.36x), 8192x4096x14336 592.9 (0.73x), 8192x14336x4096
590.8 (0.72x), A^T B 4096^3 579.7 (0.73x), A B^T 4096^3 566.3 (0.71x),
128x8192x8192 191.4 (0.45x).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm.kernels.pallas import common


def basic_kernel(a_gmem, b_gmem, c_gmem, a_smem, b_smem, out_smem, barrier, *,
                 dims: common.Dims, tm: int, tn: int, tk: int, trans_a: bool,
                 trans_b: bool):
  bi, mi, ni = lax.axis_index("b"), lax.axis_index("m"), lax.axis_index("n")
  a_gmem, b_gmem = a_gmem.at[bi], b_gmem.at[bi]
  k_iters = common.cdiv(dims.k, tk)

  def acc_scope(acc_ref):
    def k_step(ki, carry):
      k_start = ki * tk
      plgpu.copy_gmem_to_smem(
          common.a_block(a_gmem, mi * tm, k_start, tm, tk, trans_a), a_smem, barrier)
      plgpu.copy_gmem_to_smem(
          common.b_block(b_gmem, k_start, ni * tn, tk, tn, trans_b), b_smem, barrier)
      plgpu.barrier_wait(barrier)
      plgpu.wgmma(acc_ref, common.a_operand(a_smem, trans_a),
                  common.b_operand(b_smem, trans_b))
      # No overlap on purpose: the next TMA overwrites the tiles wgmma reads.
      plgpu.wgmma_wait(0)
      return carry

    lax.fori_loop(0, k_iters, k_step, None)
    return acc_ref[...]

  acc = pl.run_scoped(acc_scope, plgpu.ACC((tm, tn), jnp.float32))
  common.store_tile(acc, out_smem,
                    c_gmem.at[bi, pl.ds(mi * tm, tm), pl.ds(ni * tn, tn)])
  plgpu.wait_smem_to_gmem(0)


def smem_bytes(problem, config) -> int:
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  return common.smem_bytes(((tm, tk), problem.dtype), ((tk, tn), problem.dtype),
                           ((tm, tn), problem.out_dtype))


def basic(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 1's kernel."""
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  dtype, out_dtype = a.dtype, jnp.dtype(problem.out_dtype)

  swizzle = common.operand_swizzle(tm, tn, tk, dtype, problem.trans_a, problem.trans_b)

  def call(a, b, dims):
    body = functools.partial(basic_kernel, dims=dims, tm=tm, tn=tn, tk=tk,
                             trans_a=problem.trans_a, trans_b=problem.trans_b)
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((dims.batch, dims.m, dims.n), out_dtype),
        scratch_types=(
            common.a_smem_type(tm, tk, dtype, problem.trans_a, swizzle=swizzle),
            common.b_smem_type(tk, tn, dtype, problem.trans_b, swizzle=swizzle),
            common.out_smem_type(tm, tn, out_dtype),
            plgpu.Barrier(num_arrivals=2),
        ),
        grid=(dims.batch, common.cdiv(dims.m, tm), common.cdiv(dims.n, tn)),
        grid_names=("b", "m", "n"),
        compiler_params=common.compiler_params(),
        interpret=common.interpret_params() if interpret else None,
    )(a, b)

  return common.run_padded(call, a, b, problem, out_dtype=out_dtype)
