"""Rung 2, `pipelined`: a multi-stage TMA/wgmma pipeline over K.

What it adds over `basic`: `max_concurrent_steps` SMEM stages per operand,
driven by `plgpu.emit_pipeline`: TMA fetches the next stages' tiles while
wgmma works on the current one, and one wgmma stays in flight
(`wgmma_wait(1)`) while the next is issued. `delay_release=1` keeps a stage's
buffers out of the TMA's reach until the wgmma reading them has retired. Still
one output tile per CTA (grid B x M/tm x N/tn), one warpgroup, the same
SMEM-staged TMA-store epilogue (which does not overlap the main loop yet).

Measured (H200, jax 0.11.2, default configs, CUPTI median of 20, bf16,
`research/pallas_probe.py all` run 3, its log at
0834948; XLA's dot in
the same process): 8192^3 653.0 TFLOP/s (0.81x XLA), 4096^3 686.3 (0.85x),
4095x4097x4093 416.8 (2.64x), 8192x4096x14336 542.6 (0.67x), 8192x14336x4096
686.9 (0.84x), A^T B 4096^3 686.5 (0.87x), A B^T 4096^3 654.3 (0.82x),
128x8192x8192 467.0 (1.09x, 128x64x128 tiles).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm.kernels.pallas import common


def k_pipeline(acc_ref, a_gmem, b_gmem, mi, ni, *, dims: common.Dims, tm: int, tn: int,
               tk: int, stages: int, trans_a: bool, trans_b: bool, dtype):
  """Accumulates the (mi, ni) tile's A @ B over all of K into `acc_ref`."""
  a_shape, a_index = common.a_block_spec_args(tm, tk, trans_a)
  b_shape, b_index = common.b_block_spec_args(tk, tn, trans_b)
  swizzle = common.operand_swizzle(tm, tn, tk, dtype, trans_a, trans_b)

  def step(_, a_smem, b_smem):
    plgpu.wgmma(acc_ref, common.a_operand(a_smem, trans_a),
                common.b_operand(b_smem, trans_b))
    # Keep this wgmma in flight while the next step's TMA lands; the one
    # before it is done, so its stage can be released (delay_release=1).
    plgpu.wgmma_wait(1)

  plgpu.emit_pipeline(
      step,
      grid=(common.cdiv(dims.k, tk),),
      in_specs=[
          plgpu.BlockSpec(a_shape, lambda ki: a_index(mi, ki),
                          transforms=common.smem_transforms(a_shape[1], dtype, swizzle),
                          delay_release=1),
          plgpu.BlockSpec(b_shape, lambda ki: b_index(ni, ki),
                          transforms=common.smem_transforms(b_shape[1], dtype, swizzle),
                          delay_release=1),
      ],
      max_concurrent_steps=stages,
  )(a_gmem, b_gmem)


def pipelined_kernel(a_gmem, b_gmem, c_gmem, out_smem, *, dims: common.Dims, tm: int,
                     tn: int, tk: int, stages: int, trans_a: bool, trans_b: bool):
  bi, mi, ni = lax.axis_index("b"), lax.axis_index("m"), lax.axis_index("n")

  def acc_scope(acc_ref):
    k_pipeline(acc_ref, a_gmem.at[bi], b_gmem.at[bi], mi, ni, dims=dims, tm=tm, tn=tn,
               tk=tk, stages=stages, trans_a=trans_a, trans_b=trans_b,
               dtype=a_gmem.dtype)
    return acc_ref[...]   # reading the accumulator waits for every wgmma

  acc = pl.run_scoped(acc_scope, plgpu.ACC((tm, tn), jnp.float32))
  common.store_tile(acc, out_smem,
                    c_gmem.at[bi, pl.ds(mi * tm, tm), pl.ds(ni * tn, tn)])
  plgpu.wait_smem_to_gmem(0)


def pipelined(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 2's kernel."""
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  out_dtype = jnp.dtype(problem.out_dtype)

  def call(a, b, dims):
    # More stages than K steps only waste shared memory.
    # delay_release=1 needs a second stage even when K has one step.
    stages = max(2, min(config.max_concurrent_steps, common.cdiv(dims.k, tk)))
    body = functools.partial(pipelined_kernel, dims=dims, tm=tm, tn=tn, tk=tk,
                             stages=stages, trans_a=problem.trans_a,
                             trans_b=problem.trans_b)
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((dims.batch, dims.m, dims.n), out_dtype),
        scratch_types=(common.out_smem_type(tm, tn, out_dtype),),
        grid=(dims.batch, common.cdiv(dims.m, tm), common.cdiv(dims.n, tn)),
        grid_names=("b", "m", "n"),
        compiler_params=common.compiler_params(),
        interpret=common.interpret_params() if interpret else None,
    )(a, b)

  return common.run_padded(call, a, b, problem, out_dtype=out_dtype)
