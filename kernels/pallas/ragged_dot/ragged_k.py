"""Grouped GEMM, ragged-K form (the weight gradient): out[g] = lhs[rows of g]^T @ rhs[rows of g].

lhs (B, M, K), rhs (B, M, N), out (B, G, K, N); the contraction runs over
each group's rows, whose ranges come from `schedule.group_bounds` (a device
array: no host sync). Persistent like the `grouped` ragged-M rung: a producer
warpgroup loads row chunks of both operands into a ring of SMEM stages
across all of the CTA's tiles, two consumer warpgroups each own half of the
output tile's rows (columns of lhs: wgmma reads lhs's chunk MN-major, through
a transposed view) and accumulate over the group's chunks.

Chunks are `tile_k` rows aligned to tile_k (TMA boxes start on a row tile), so
a group's first and last chunks hold rows of its neighbours: on those two
steps each consumer zeroes the rows outside the group in its half of lhs's
chunk (SMEM -> registers -> SMEM, then a proxy fence for wgmma), and only
then multiplies. An empty group takes no step and stores a zero block
without reading anything. float32 runs as TF32, whose wgmma reads K-major
operands only: both operands are then transposed once by XLA (M becomes their
minor dimension) and the chunks are column blocks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm.kernels.pallas import common
from jaxgemm.kernels.pallas.ragged_dot import grouped

EPI_TILE_M = grouped.EPI_TILE_M


def ragged_k_kernel(bounds_gmem, a_gmem, d_gmem, c_gmem, *, tm: int, tn: int, tr: int,
                    stages: int, epi_tn: int, grid_group: int, workers: int,
                    k_major: bool, interpret: bool):
  """k_major=False (16-bit): a_gmem is lhs (B, M, K), d_gmem rhs (B, M, N), chunks
  are rows; wgmma reads lhs's chunk transposed (MN-major). k_major=True (TF32,
  which reads K-major only): a_gmem is lhs^T (B, K, M), d_gmem rhs^T (B, N, M),
  chunks are columns."""
  batch, groups, k, n = c_gmem.shape
  dtype, out_dtype = a_gmem.dtype, c_gmem.dtype
  m_tiles, n_tiles = common.cdiv(k, tm), common.cdiv(n, tn)
  half = tm // 2
  # A operand (half, tr): lhs's chunk read transposed (16-bit) or as stored (TF32);
  # B operand (tr, tn): rhs's chunk as stored (16-bit) or transposed (TF32).
  swizzle = common.operand_swizzle(half, tn, tr, dtype, not k_major, k_major)
  a_tile = (tm, tr) if k_major else (tr, tm)
  b_tile = (tn, tr) if k_major else (tr, tn)
  worker = lax.axis_index("sm")
  total = batch * groups * m_tiles * n_tiles
  my_items = lax.div(total - worker + workers - 1, workers)

  def item(j):
    bg, mi, ni = common.tile_coords(worker + j * workers, m_tiles, n_tiles,
                                    batch * groups, False, grid_group)
    b, g = lax.div(bg, groups), lax.rem(bg, groups)
    s, e = bounds_gmem[b, 0, g], bounds_gmem[b, 1, g]
    c0 = lax.div(s, tr)
    steps = jnp.where(e > s, lax.div(e + tr - 1, tr) - c0, 0)
    return b, g, mi, ni, s, e, c0, steps

  @functools.partial(
      pl.run_scoped,
      a_smem=plgpu.SMEM((stages, *a_tile), dtype,
                        transforms=common.smem_transforms(a_tile[1], dtype, swizzle)),
      b_smem=plgpu.SMEM((stages, *b_tile), dtype,
                        transforms=common.smem_transforms(b_tile[1], dtype, swizzle)),
      loaded=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      consumed=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      masked=plgpu.Barrier(num_arrivals=2),   # both consumers masked a boundary chunk
      out_smem=common.out_smem_type(EPI_TILE_M, epi_tn, out_dtype, 2, 2),
      collective_axes="wg",
  )
  def _scope(a_smem, b_smem, loaded, consumed, masked, out_smem):
    wg = lax.axis_index("wg")

    @pl.when(wg == 2)
    def _producer():
      plgpu.set_max_registers(grouped.PRODUCER_REGISTERS, action="decrease")

      def produce(j, step):
        b, g, mi, ni, s, e, c0, steps = item(j)

        @pl.loop(0, steps)
        def _chunk(ci):
          st = step + ci
          slot = lax.rem(st, stages)

          @pl.when(st >= stages)
          def _wait_free():
            plgpu.barrier_wait(consumed.at[slot])

          rows = pl.ds((c0 + ci) * tr, tr)
          a_cols, d_cols = pl.ds(mi * tm, tm), pl.ds(ni * tn, tn)
          a_block = a_gmem.at[b, a_cols, rows] if k_major else a_gmem.at[b, rows, a_cols]
          d_block = d_gmem.at[b, d_cols, rows] if k_major else d_gmem.at[b, rows, d_cols]
          plgpu.copy_gmem_to_smem(a_block, a_smem.at[slot], loaded.at[slot])
          plgpu.copy_gmem_to_smem(d_block, b_smem.at[slot], loaded.at[slot])

        return step + steps

      steps = lax.fori_loop(0, my_items, produce, jnp.int32(0))

      @pl.loop(jnp.maximum(steps - stages, 0), steps)
      def _drain(st):
        plgpu.barrier_wait(consumed.at[lax.rem(st, stages)])

    @pl.when(wg < 2)
    def _consumers():
      plgpu.set_max_registers(grouped.CONSUMER_REGISTERS, action="increase")
      mine_idx = pl.ds(wg * half, half)   # this consumer's output rows: K indices

      def consume(j, carry):
        step, piece = carry
        b, g, mi, ni, s, e, c0, steps = item(j)

        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((half, tn), jnp.float32))
        def _acc_scope(acc_ref):
          @pl.loop(0, steps)
          def _chunk(ci):
            slot = lax.rem(step + ci, stages)
            plgpu.barrier_wait(loaded.at[slot])
            mine = a_smem.at[slot, mine_idx, :] if k_major else a_smem.at[slot, :, mine_idx]
            row0 = (c0 + ci) * tr

            @pl.when((row0 < s) | (row0 + tr > e))
            def _mask():
              # Zero the rows outside the group: each consumer its own lhs
              # columns, consumer 0 all of rhs's chunk too (both read it: they
              # meet at `masked` before either multiplies). Both operands, so
              # that a non-finite value outside the group cannot reach it
              # (0 * inf). (Splitting rhs's rows between the consumers, 32
              # each, failed Mosaic GPU's layout inference.)
              def zero_outside(ref):
                v = ref[...]   # the chunk's rows of M run along dim 1 if k_major
                r = lax.broadcasted_iota(jnp.int32, v.shape, 1 if k_major else 0) + row0
                ref[...] = jnp.where((r >= s) & (r < e), v, jnp.zeros_like(v))

              zero_outside(mine)

              @pl.when(wg == 0)
              def _mask_rhs():
                zero_outside(b_smem.at[slot])

              plgpu.commit_smem()
              plgpu.barrier_arrive(masked)
              plgpu.barrier_wait(masked)

            if k_major:
              plgpu.wgmma(acc_ref, mine, common.transposed(b_smem.at[slot]))
            else:
              plgpu.wgmma(acc_ref, common.transposed(mine), b_smem.at[slot])
            plgpu.wgmma_wait(1)

            @pl.when(ci > 0)
            def _release_previous():
              plgpu.barrier_arrive(consumed.at[lax.rem(step + ci - 1, stages)])

          @pl.when(steps > 0)
          def _release_last():
            plgpu.wgmma_wait(0)
            plgpu.barrier_arrive(consumed.at[lax.rem(step + steps - 1, stages)])

          acc = acc_ref[...]
          q = piece
          for em in range(half // EPI_TILE_M):
            for en in range(tn // epi_tn):
              slot = lax.rem(q, 2)
              q = q + 1
              plgpu.wait_smem_to_gmem(1, wait_read_only=True)
              out_smem[wg, slot] = acc[em * EPI_TILE_M:(em + 1) * EPI_TILE_M,
                                       en * epi_tn:(en + 1) * epi_tn].astype(out_dtype)
              plgpu.commit_smem()
              plgpu.copy_smem_to_gmem(
                  out_smem.at[wg, slot],
                  c_gmem.at[b, g, pl.ds(mi * tm + wg * half + em * EPI_TILE_M, EPI_TILE_M),
                            pl.ds(ni * tn + en * epi_tn, epi_tn)])

        return step + steps, piece + (half // EPI_TILE_M) * (tn // epi_tn)

      lax.fori_loop(0, my_items, consume, (jnp.int32(0), jnp.int32(0)))
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def ragged_dot_k(lhs, rhs, group_bounds, *, m: int, k: int, n: int, out_dtype, tile_m: int,
                 tile_n: int, tile_k: int, stages: int, epi_tile_n: int, grid_group: int,
                 interpret: bool = False):
  """out (B, G, K, N): out[b, g] = lhs[b, rows g]^T @ rhs[b, rows g]; lhs (B, M, K),
  rhs (B, M, N); `group_bounds` (B, 2, G), each group's [start, end) rows."""
  bounds = group_bounds
  batch, groups = bounds.shape[0], bounds.shape[2]
  out_dtype = jnp.dtype(out_dtype)
  span = common.col_multiple(lhs.dtype)
  k_major = jnp.dtype(lhs.dtype).itemsize == 4
  if k_major:
    # TF32 wgmma reads both operands K-major only (K here: the rows of M), so
    # both are transposed once by XLA: lhs^T (B, K, M) and rhs^T (B, N, M), M
    # padded to the span (chunks are column offsets, multiples of tile_k).
    lhs = grouped._pad_axis(grouped._pad_axis(jnp.swapaxes(lhs, 1, 2), 1, span), 2, span)
    rhs = grouped._pad_axis(grouped._pad_axis(jnp.swapaxes(rhs, 1, 2), 1, span), 2, span)
    k_c, n_rhs = lhs.shape[1], rhs.shape[1]
  else:
    # Rows to 8 (TMA's row tile), K and N to the swizzle span.
    lhs = grouped._pad_axis(grouped._pad_axis(lhs, 1, grouped.ROW_ALIGN), 2, span)
    rhs = grouped._pad_axis(grouped._pad_axis(rhs, 1, grouped.ROW_ALIGN), 2, span)
    k_c, n_rhs = lhs.shape[2], rhs.shape[2]
  # C's staging is swizzled: its width a multiple of the out dtype's span.
  n_c = max(common.round_up(n_rhs, common.col_multiple(out_dtype)), n_rhs)
  workers = common.num_sms(interpret)
  epi_tn = min(epi_tile_n, tile_n)
  body = functools.partial(
      ragged_k_kernel, tm=tile_m, tn=tile_n, tr=tile_k, stages=stages, epi_tn=epi_tn,
      grid_group=grid_group, workers=workers, k_major=k_major, interpret=interpret)
  out = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((batch, groups, k_c, n_c), out_dtype),
      grid=(workers,),
      grid_names=("sm",),
      num_threads=3,
      thread_name="wg",
      compiler_params=common.compiler_params(),
      interpret=common.interpret_params() if interpret else None,
  )(bounds, lhs, rhs)
  if (k_c, n_c) != (k, n):
    out = out[:, :, :k, :n]
  return out
