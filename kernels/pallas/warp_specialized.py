"""Rung 3, `warp_specialized`: persistent, a producer and two consumer warpgroups.

What it adds over `pipelined`:
* Warp specialization (`plgpu.emit_pipeline_warp_specialized`): a producer
  warpgroup with its registers cut to 40 does nothing but issue TMA loads
  into a `max_concurrent_steps`-deep ring; two consumer warpgroups each own
  half of the CTA tile's rows (tile_m / 2 x tile_n, an f32 accumulator of
  128 registers per thread at 256x128) and run wgmma on the shared B tile.
  Each keeps one wgmma in flight (`delay_release=1` + `wgmma_wait(1)`).
* Persistence: a grid of one CTA per SM (`nd_loop` over the tiles of every
  batch), so launch cost and the SMEM setup are paid once and the next tile's
  loads start while the last one's epilogue runs.
* An L2-friendly tile order (`common.tile_coords`: bands of `grid_group`
  tiles walked in a snake), so CTAs in flight share A rows and B columns.
* A tiled epilogue: each consumer writes its rows as (64, epi_tile_n) pieces
  through two SMEM slots, waiting only for the store two pieces back; the
  last stores of a tile drain while the next tile's main loop runs.

The kernel body also takes a cluster shape, which rung 4 (`clusters`) uses;
here it is 1x1.

Measured (H200, jax 0.11.2, default configs, CUPTI median of 20, bf16,
`scratch/pallas_probe.py all` run 3; XLA's dot in the same process): 8192^3
797.0 TFLOP/s (0.98x XLA), 4096^3 786.0 (0.98x), 4095x4097x4093 456.8
(2.89x), 8192x4096x14336 777.3 (0.95x), 8192x14336x4096 807.5 (0.99x),
A^T B 4096^3 789.5 (1.00x), A B^T 4096^3 774.7 (0.97x), 128x8192x8192 420.3
(0.98x with 128x128x64 in 6 stages; 464.8, 1.08x, with the 128x64x128 tiles
now the default for M <= 128, measured in the sweep).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm.kernels.pallas import common

EPI_TILE_M = 64          # epilogue piece rows: the wgmma accumulator's row block
PRODUCER_REGISTERS = 40  # the TMA-issuing warpgroup needs almost none


def persistent_kernel(a_gmem, b_gmem, c_gmem, *, dims: common.Dims, tm: int, tn: int,
                      tk: int, stages: int, epi_tn: int, trans_a: bool, trans_b: bool,
                      grid_minor_m: bool, grid_group: int, cluster_m: int = 1,
                      cluster_n: int = 1, multicast: bool = True):
  dtype, out_dtype = a_gmem.dtype, c_gmem.dtype
  half = tm // 2                     # rows per consumer warpgroup
  k_iters = common.cdiv(dims.k, tk)
  # A cluster computes (cluster_m x cluster_n) adjacent CTA tiles.
  m_tiles, n_tiles = common.cdiv(dims.m, tm), common.cdiv(dims.n, tn)
  m_cl_tiles = common.cdiv(m_tiles, cluster_m)
  n_cl_tiles = common.cdiv(n_tiles, cluster_n)
  clustered = cluster_m * cluster_n > 1
  a_shape, a_index = common.a_block_spec_args(tm, tk, trans_a)
  b_shape, b_index = common.b_block_spec_args(tk, tn, trans_b)
  # One wgmma in flight across K steps needs a stage released one step late;
  # with a single K step there is nothing to overlap, and a late release
  # across back-to-back tiles completed a barrier phase twice (seen in the
  # interpreter: "Barrier arrival was completed again", then a hang).
  delay = 1 if k_iters > 1 else 0

  def make_pipeline(body, compute_context, mi, ni):
    return plgpu.emit_pipeline_warp_specialized(
        body,
        grid=(k_iters,),
        memory_registers=PRODUCER_REGISTERS,
        in_specs=[
            # CTAs of a cluster along N share A's tile: TMA multicasts it.
            plgpu.BlockSpec(a_shape, lambda ki: a_index(mi, ki),
                            transforms=common.smem_transforms(a_shape[1], dtype),
                            memory_space=plgpu.SMEM, delay_release=delay,
                            collective_axes=("cluster",) if multicast and cluster_n > 1 else ()),
            plgpu.BlockSpec(b_shape, lambda ki: b_index(ni, ki),
                            transforms=common.smem_transforms(b_shape[1], dtype),
                            memory_space=plgpu.SMEM, delay_release=delay,
                            collective_axes=("cluster",) if multicast and cluster_m > 1 else ()),
        ],
        wg_axis="wg",
        num_compute_wgs=2,
        max_concurrent_steps=stages,
        compute_context=compute_context,
    )

  ignore = lambda *_, **__: None
  a_any, b_any = a_gmem.at[0], b_gmem.at[0]

  @functools.partial(
      pl.run_scoped,
      # Allocated once for all tiles: the ring of A/B stages and barriers...
      pipeline_allocs=make_pipeline(ignore, ignore, 0, 0).get_allocations(a_any, b_any),
      # ...and two epilogue slots per consumer warpgroup.
      out_smem=common.out_smem_type(EPI_TILE_M, epi_tn, out_dtype, 2, 2),
      collective_axes="wg",
  )
  def _scope(pipeline_allocs, out_smem):
    wg = lax.axis_index("wg")
    cta = lax.axis_index("cluster") if clustered else 0
    grid_axis = "cluster_grid" if clustered else "sm"

    @plgpu.nd_loop((dims.batch * m_cl_tiles * n_cl_tiles,), collective_axes=grid_axis)
    def _tile_loop(loop_info):
      (lin,) = loop_info.index
      bi, mc, nc = common.tile_coords(lin, m_cl_tiles, n_cl_tiles, dims.batch,
                                      grid_minor_m, grid_group)
      mi = mc * cluster_m + (cta if cluster_m > 1 else 0)
      ni = nc * cluster_n + (cta if cluster_n > 1 else 0)
      # With an odd tile count along the cluster axis, the last cluster's
      # second CTA has no tile. It recomputes its partner's tile and stores
      # nothing: on the H200, a CTA whose B box lay wholly past the array
      # (trans_b, N <= tile_n) corrupted its partner's result (relative error
      # ~1 on 33x40x24; bench/results/probes/pallas-2026-11-22-s3/probe_b.log).
      owns_tile = (mi < m_tiles) & (ni < n_tiles)
      mi, ni = jnp.minimum(mi, m_tiles - 1), jnp.minimum(ni, n_tiles - 1)
      wg_rows = pl.ds(wg * half, half)

      def a_rows(a_smem):
        # This consumer's half of A's tile, as wgmma's (half, tk) operand.
        if trans_a:
          return common.transposed(a_smem.at[:, wg_rows])
        return a_smem.at[wg_rows, :]

      def mma(_, a_smem, b_smem, acc_ref):
        plgpu.wgmma(acc_ref, a_rows(a_smem), common.b_operand(b_smem, trans_b))
        plgpu.wgmma_wait(delay)
        return acc_ref

      def compute_context(eval_pipeline):
        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((half, tn), jnp.float32))
        def _acc_scope(acc_ref):
          eval_pipeline(acc_ref)
          acc = acc_ref[...].astype(out_dtype)
          row0 = mi * tm + wg * half
          piece = 0
          for em in range(half // EPI_TILE_M):
            for en in range(tn // epi_tn):
              slot = piece % 2
              piece += 1
              # The slot's previous store (two pieces back, maybe from the
              # previous tile) must have read SMEM before we overwrite it.
              plgpu.wait_smem_to_gmem(1, wait_read_only=True)
              out_smem[wg, slot] = acc[em * EPI_TILE_M:(em + 1) * EPI_TILE_M,
                                       en * epi_tn:(en + 1) * epi_tn]
              plgpu.commit_smem()

              @pl.when(owns_tile)
              def _store():
                plgpu.copy_smem_to_gmem(
                    out_smem.at[wg, slot],
                    c_gmem.at[bi, pl.ds(row0 + em * EPI_TILE_M, EPI_TILE_M),
                              pl.ds(ni * tn + en * epi_tn, epi_tn)])

      make_pipeline(mma, compute_context, mi, ni)(
          a_gmem.at[bi], b_gmem.at[bi], allocations=pipeline_allocs)

  # Every store must land before the kernel exits.
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def persistent_call(a, b, problem, config, interpret: bool, cluster_m: int = 1,
                    cluster_n: int = 1):
  """Launches `persistent_kernel` on min(SMs, tiles) CTAs (in clusters)."""
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  out_dtype = jnp.dtype(problem.out_dtype)
  epi_tn = min(config.epi_tile_n, tn)
  cluster = cluster_m * cluster_n

  def call(a, b, dims):
    stages = max(2, min(config.max_concurrent_steps, common.cdiv(dims.k, tk)))
    body = functools.partial(
        persistent_kernel, dims=dims, tm=tm, tn=tn, tk=tk, stages=stages, epi_tn=epi_tn,
        trans_a=problem.trans_a, trans_b=problem.trans_b,
        grid_minor_m=config.grid_minor_m, grid_group=config.grid_group,
        cluster_m=cluster_m, cluster_n=cluster_n,
        # The 0.10.2 interpreter cannot allocate the cluster barriers that
        # multicast needs; there each CTA of the cluster loads its own copy
        # of the shared tile (the cluster's tile walk is the same).
        multicast=not interpret)
    cluster_tiles = (dims.batch * common.cdiv(dims.m, tm * cluster_m)
                     * common.cdiv(dims.n, tn * cluster_n))
    grid = max(1, min(common.num_sms(interpret) // cluster, cluster_tiles))
    mesh = (dict(grid=(grid,), grid_names=("cluster_grid",), cluster=(cluster,),
                 cluster_names=("cluster",))
            if cluster > 1 else dict(grid=(grid,), grid_names=("sm",)))
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((dims.batch, dims.m, dims.n), out_dtype),
        num_threads=3,          # two consumer warpgroups + the producer
        thread_name="wg",
        compiler_params=common.compiler_params(),
        interpret=common.interpret_params() if interpret else None,
        **mesh,
    )(a, b)

  return common.run_padded(call, a, b, problem, out_dtype=out_dtype)


def warp_specialized(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 3's kernel."""
  return persistent_call(a, b, problem, config, interpret)
