"""Grouped GEMM (ragged-M: out[rows of g] = lhs[rows of g] @ rhs[g]) in Pallas Mosaic GPU.

Both rungs are persistent (one CTA per SM) and walk work items (batch, slot,
N tile) in `common.tile_coords`' banded order. A slot is one tile of one
group's rows, read from a small int32 table made by XLA before the launch from
the device's `group_sizes` (no host sync, no recompile when routing changes):
table[b, :, slot] = (group, row_start, row_end). group == G is the tail of
rows past sum(group_sizes), stored as zeros without reading anything;
row_start >= row_end is an empty slot, skipped. An empty group has no slot, so
its weights are never read.

A tile's rows are loaded from `row_start` rounded down to the row alignment,
all `tile_m` of them (TMA zero-fills past M; rows of a neighbouring group are
multiplied and then dropped), and only rows [row_start, row_end) are stored:
the staged tile goes out through a ladder of TMA stores of 64, 32, ..., 1 rows
(each one conditional on a bit of the row count), so the tokens are never
padded or copied and no other group's rows are touched.

* `pipelined` (rung 1): one warpgroup per CTA, a `plgpu.emit_pipeline` over K
  per tile; slots are tile_m-aligned row tiles by default, a tile that a group
  boundary cuts being run once per group (`group_aligned=False`).
* `grouped` (rung 2): a producer warpgroup issuing TMA loads into a ring of
  SMEM stages shared across all of the CTA's tiles, two consumer warpgroups
  (each half of the tile's rows) running wgmma, a piecewise epilogue through
  two staging slots per consumer. Slots start at each group's first row
  (rounded down to 8, TMA's tile of rows), so a group wastes at most one
  partial tile instead of one per boundary (`schedule.row_tiles` with align 8).

Measured (H100, jax 0.11.2, CUPTI median of 10, bf16, Dirichlet(2) group
sizes, research/ragged_dot/pallas_probe.py at a0ac978): `pipelined` 128x128x64 in 4
stages, G=8 M=16384 K=4096 N=14336: 596 TFLOP/s (lax.ragged_dot 100, jax's
ragged_dot_mgpu best of 3 configs 673); G=64 M=16384 K=2048 N=1408: 319
(lax.ragged_dot 11, ragged_dot_mgpu 347). `grouped` did not compile in that
run (its TMA row offset, fixed since: `first_row`); not yet measured.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm import ragged_schedule as schedule
from jaxgemm.kernels.pallas import common

GROUP, ROW_START, ROW_END = schedule.GROUP, schedule.ROW_START, schedule.ROW_END
# Stores committed as one group per epilogue piece (both in jax 0.10.2); without
# them each ladder store is its own group and a staging slot is reused only
# after every store has read it.
_GROUPED_COMMITS = (hasattr(plgpu, "commit_smem_to_gmem_group") and "commit_group"
                    in inspect.signature(plgpu.copy_smem_to_gmem).parameters)
ROW_ALIGN = common.ROW_MULTIPLE     # TMA loads rows in (8, swizzle) tiles
EPI_TILE_M = 64
C_COL_MULTIPLE = 64   # C's stored width: a multiple of its staged pieces' tiling
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = (512 - PRODUCER_REGISTERS) // 2 // 8 * 8


# ---------------------------------------------------------------- the slot table

def first_row(row_start):
  """The tile's first row: `row_start` rounded down to 8, written as a product so
  that Mosaic GPU can prove the TMA box starts on a row tile (a difference
  `rs - rs % 8` failed its layout inference)."""
  return lax.div(row_start, ROW_ALIGN) * ROW_ALIGN


def _slot(table_gmem, bi, si):
  """(group, row_start, row_end) of slot `si` of batch `bi`, read from GMEM."""
  return (table_gmem[bi, GROUP, si], table_gmem[bi, ROW_START, si],
          table_gmem[bi, ROW_END, si])


# ---------------------------------------------------------------- the ragged store

def store_rows(stage_smem, c_gmem, row0, col0, lo, size, max_rows: int):
  """TMA-stores rows [lo, lo + size) of the staged piece to C rows row0 + [lo, +size).

  TMA boxes have static shapes, so the rows go out as a ladder: one box of
  each power of two <= max_rows whose bit is set in `size` (5 rows: 4 then
  1; size < 2 * the largest, so its bits are enough). The stores are left uncommitted: the caller commits them as one group.
  """
  cols = stage_smem.shape[-1]
  off = lo
  r = 1 << (max_rows.bit_length() - 1)   # the largest power of two <= max_rows
  while r > c_gmem.shape[0]:   # no box taller than C (it could never be used)
    r //= 2
  while r >= 1:
    @pl.when((size & r) != 0)
    def _store(off=off, r=r):
      plgpu.copy_smem_to_gmem(stage_smem.at[pl.ds(off, r)],
                              c_gmem.at[pl.ds(row0 + off, r), pl.ds(col0, cols)],
                              **({"commit_group": False} if _GROUPED_COMMITS else {}))
    off = off + (size & r)
    r //= 2


def commit_stores():
  """Closes the group of stores of one staged piece."""
  if _GROUPED_COMMITS:
    plgpu.commit_smem_to_gmem_group()


def _work_items(batch: int, slots: int, n_tiles: int, workers: int, worker):
  total = batch * slots * n_tiles
  return lax.div(total - worker + workers - 1, workers)


# ---------------------------------------------------------------- rung 1: pipelined

def pipelined_kernel(table_gmem, a_gmem, b_gmem, c_gmem, out_smem, *, groups: int,
                     slots: int, k: int, tm: int, tn: int, tk: int, stages: int,
                     trans_b: bool, grid_group: int, workers: int, group_aligned: bool):
  batch, n = c_gmem.shape[0], c_gmem.shape[2]
  n_tiles = common.cdiv(n, tn)
  dtype = a_gmem.dtype
  swizzle = common.operand_swizzle(tm, tn, tk, dtype, False, trans_b)
  b_shape, b_index = common.b_block_spec_args(tk, tn, trans_b)
  worker = lax.axis_index("sm")

  @pl.loop(0, _work_items(batch, slots, n_tiles, workers, worker))
  def _item(j):
    bi, si, ni = common.tile_coords(worker + j * workers, slots, n_tiles, batch, False,
                                    grid_group)
    grp, rs, re = _slot(table_gmem, bi, si)
    # The tile's first row: its tile_m-aligned block (tile-aligned slots), or
    # row_start rounded down to 8 (slots at each group's first row).
    tile0 = first_row(rs) if group_aligned else lax.div(rs, tm) * tm
    a_rows, a_row_index = ((pl.Element(tm), tile0) if group_aligned
                           else (tm, lax.div(rs, tm)))

    @pl.when(rs < re)
    def _tile():
      def acc_scope(acc_ref):
        @pl.when(grp < groups)
        def _mma():
          def step(_, a_smem, b_smem):
            plgpu.wgmma(acc_ref, a_smem, common.b_operand(b_smem, trans_b))
            plgpu.wgmma_wait(1)

          plgpu.emit_pipeline(
              step,
              grid=(common.cdiv(k, tk),),
              in_specs=[
                  plgpu.BlockSpec((a_rows, tk), lambda ki: (a_row_index, ki),
                                  transforms=common.smem_transforms(tk, dtype, swizzle),
                                  delay_release=1),
                  plgpu.BlockSpec(b_shape, lambda ki: b_index(ni, ki),
                                  transforms=common.smem_transforms(b_shape[1], dtype,
                                                                    swizzle),
                                  delay_release=1),
              ],
              max_concurrent_steps=stages,
          )(a_gmem.at[bi], b_gmem.at[bi, jnp.minimum(grp, groups - 1)])
        return acc_ref[...]

      acc = pl.run_scoped(acc_scope, plgpu.ACC((tm, tn), jnp.float32))
      # The previous tile's stores must have read the staging buffer.
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      out_smem[...] = acc.astype(out_smem.dtype)
      plgpu.commit_smem()
      store_rows(out_smem, c_gmem.at[bi], tile0, ni * tn, rs - tile0, re - rs, tm)
      commit_stores()

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


# ---------------------------------------------------------------- rung 2: grouped

def grouped_kernel(table_gmem, a_gmem, b_gmem, c_gmem, *, groups: int, slots: int,
                   k: int, tm: int, tn: int, tk: int, stages: int, epi_tn: int,
                   trans_b: bool, grid_group: int, workers: int):
  batch, n = c_gmem.shape[0], c_gmem.shape[2]
  dtype, out_dtype = a_gmem.dtype, c_gmem.dtype
  n_tiles = common.cdiv(n, tn)
  k_iters = common.cdiv(k, tk)
  consumer_rows = tm // 2
  swizzle = common.operand_swizzle(tm, tn, tk, dtype, False, trans_b)
  worker = lax.axis_index("sm")
  my_items = _work_items(batch, slots, n_tiles, workers, worker)

  def coords(j):
    # Clamped: the consumers read one item ahead, past their last.
    lin = jnp.minimum(worker + j * workers, batch * slots * n_tiles - 1)
    return common.tile_coords(lin, slots, n_tiles, batch, False, grid_group)

  def item(j, slot_entry=None):
    bi, si, ni = coords(j)
    grp, rs, re = _slot(table_gmem, bi, si) if slot_entry is None else slot_entry
    return bi, ni, grp, rs, re, (rs < re) & (grp < groups)

  def slot_entry(j):
    bi, si, _ = coords(j)
    return _slot(table_gmem, bi, si)

  @functools.partial(
      pl.run_scoped,
      a_smem=common.a_smem_type(tm, tk, dtype, False, stages, swizzle=swizzle),
      b_smem=common.b_smem_type(tk, tn, dtype, trans_b, stages, swizzle=swizzle),
      loaded=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      consumed=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      # Row-major staging (a ragged store slices it at any row): 2 slots per consumer.
      out_smem=plgpu.SMEM((2, 2, EPI_TILE_M, epi_tn), out_dtype),
      collective_axes="wg",
  )
  def _scope(a_smem, b_smem, loaded, consumed, out_smem):
    wg = lax.axis_index("wg")

    @pl.when(wg == 2)
    def _producer():
      plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

      def produce(j, step):
        bi, ni, grp, rs, re, mma = item(j)
        tile0 = first_row(rs)

        @pl.when(mma)
        def _load():
          @pl.loop(0, k_iters)
          def _k_step(ki):
            s = step + ki
            slot = lax.rem(s, stages)

            @pl.when(s >= stages)
            def _wait_free():
              plgpu.barrier_wait(consumed.at[slot])

            plgpu.copy_gmem_to_smem(
                a_gmem.at[bi, pl.ds(tile0, tm), pl.ds(ki * tk, tk)], a_smem.at[slot],
                loaded.at[slot])
            plgpu.copy_gmem_to_smem(
                common.b_block(b_gmem.at[bi, grp], ki * tk, ni * tn, tk, tn, trans_b),
                b_smem.at[slot], loaded.at[slot])

        return step + jnp.where(mma, k_iters, 0)

      steps = lax.fori_loop(0, my_items, produce, jnp.int32(0))

      # Leave only once the consumers have released every slot.
      @pl.loop(jnp.maximum(steps - stages, 0), steps)
      def _drain(s):
        plgpu.barrier_wait(consumed.at[lax.rem(s, stages)])

    @pl.when(wg < 2)
    def _consumers():
      plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
      wg_rows = pl.ds(wg * consumer_rows, consumer_rows)

      def consume(j, carry):
        # This item's slot entry was read one item ahead: the GMEM loads of the
        # next one's are issued here and land while this tile runs.
        step, piece, entry = carry
        bi, ni, grp, rs, re, mma = item(j, entry)
        next_entry = slot_entry(j + 1)
        tile0 = first_row(rs)
        # Per 64-row block of this consumer's rows: (first row, stored rows [lo, hi)).
        blocks, pieces = [], 0
        for em in range(consumer_rows // EPI_TILE_M):
          p0 = tile0 + wg * consumer_rows + em * EPI_TILE_M
          lo = jnp.clip(rs - p0, 0, EPI_TILE_M)
          hi = jnp.clip(re - p0, 0, EPI_TILE_M)
          hi = jnp.where(rs < re, hi, lo)
          blocks.append((p0, lo, hi))
          pieces = pieces + jnp.where(hi > lo, tn // epi_tn, 0)

        @pl.when(rs < re)
        def _tile():
          @functools.partial(pl.run_scoped,
                             acc_ref=plgpu.ACC((consumer_rows, tn), jnp.float32))
          def _acc_scope(acc_ref):
            @pl.when(mma)
            def _mma():
              @pl.loop(0, k_iters)
              def _k_step(ki):
                slot = lax.rem(step + ki, stages)
                plgpu.barrier_wait(loaded.at[slot])
                plgpu.wgmma(acc_ref, a_smem.at[slot, wg_rows, :],
                            common.b_operand(b_smem.at[slot], trans_b))
                plgpu.wgmma_wait(1)

                @pl.when(ki > 0)
                def _release_previous():
                  plgpu.barrier_arrive(consumed.at[lax.rem(step + ki - 1, stages)])

              plgpu.wgmma_wait(0)
              plgpu.barrier_arrive(consumed.at[lax.rem(step + k_iters - 1, stages)])

            acc = acc_ref[...]
            # This consumer's rows, in (64, epi_tn) pieces through 2 staging
            # slots, used alternately over the pieces actually stored.
            stored = piece
            for em, (p0, lo, hi) in enumerate(blocks):
              @pl.when(hi > lo)
              def _rows(p0=p0, lo=lo, hi=hi, stored=stored, em=em):
                for en in range(tn // epi_tn):
                  slot = lax.rem(stored + en, 2)
                  # The slot's last store (two pieces back) must have read it.
                  plgpu.wait_smem_to_gmem(1 if _GROUPED_COMMITS else 0, wait_read_only=True)
                  out_smem[wg, slot] = acc[em * EPI_TILE_M:(em + 1) * EPI_TILE_M,
                                           en * epi_tn:(en + 1) * epi_tn].astype(out_dtype)
                  plgpu.commit_smem()
                  store_rows(out_smem.at[wg, slot], c_gmem.at[bi], p0,
                             ni * tn + en * epi_tn, lo, hi - lo, EPI_TILE_M)
                  commit_stores()
              stored = stored + jnp.where(hi > lo, tn // epi_tn, 0)

        return step + jnp.where(mma, k_iters, 0), piece + pieces, next_entry

      lax.fori_loop(0, my_items, consume, (jnp.int32(0), jnp.int32(0), slot_entry(0)))
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)


# ---------------------------------------------------------------- the wrappers

def _pad_axis(x, axis: int, multiple: int):
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def ragged_dot(lhs, rhs, group_bounds, *, m: int, n: int, trans_rhs: bool, out_dtype,
               variant: str, tile_m: int, tile_n: int, tile_k: int, stages: int,
               epi_tile_n: int, grid_group: int, group_aligned: bool,
               interpret: bool = False):
  """out (B, M, N) = ragged-M grouped GEMM of lhs (B, M, K) and rhs (B, G, K, N)
  (or (B, G, N, K) with trans_rhs). `group_bounds`: (B, 2, G), each group's
  [start, end) rows (`schedule.group_bounds`); rows in no group are zeros."""
  bounds = group_bounds
  batch, groups = bounds.shape[0], bounds.shape[2]
  out_dtype = jnp.dtype(out_dtype)
  if jnp.dtype(lhs.dtype).itemsize == 4 and not trans_rhs:
    # TF32 wgmma reads both operands K-major only ("Only f16 WGMMA supports
    # transposes"): rhs (G, K, N) becomes (G, N, K), one XLA copy of the weights.
    rhs, trans_rhs = jnp.swapaxes(rhs, 2, 3), True
  span = common.col_multiple(lhs.dtype)
  lhs = _pad_axis(_pad_axis(lhs, 1, ROW_ALIGN), 2, span)
  # rhs's rows to 8, its minor dimension (K if trans_rhs, else N) to the span.
  rhs = _pad_axis(_pad_axis(rhs, 2, ROW_ALIGN), 3, span)
  k = lhs.shape[2]
  if rhs.shape[3 if trans_rhs else 2] != k:   # K padded on one side only
    rhs = _pad_axis(rhs, 3 if trans_rhs else 2, k)
  # Mosaic GPU gives the staged C pieces a tiled SMEM layout, whose 64-wide
  # tiling must divide C's width (as for every TMA-described array; jax says
  # "dimension 2 must have size smaller or a multiple of its tiling 64"):
  # otherwise C is computed wider and sliced (N % 64 != 0 only).
  n_c = common.round_up(n, C_COL_MULTIPLE)
  workers = common.num_sms(interpret)
  tm, tn, tk = tile_m, tile_n, tile_k
  k_iters = common.cdiv(k, tk)
  stages = max(2, min(stages, k_iters))
  table = schedule.row_tiles(bounds, m, tm, ROW_ALIGN if group_aligned else tm)
  if variant == "pipelined":
    body = functools.partial(
        pipelined_kernel, groups=groups, slots=table.shape[-1], k=k, tm=tm, tn=tn, tk=tk,
        stages=stages, trans_b=trans_rhs, grid_group=grid_group, workers=workers,
        group_aligned=group_aligned)
    extra = dict(scratch_types=(plgpu.SMEM((tm, tn), out_dtype),))
  elif variant == "grouped":
    body = functools.partial(
        grouped_kernel, groups=groups, slots=table.shape[-1], k=k, tm=tm, tn=tn, tk=tk,
        stages=stages, epi_tn=min(epi_tile_n, tn), trans_b=trans_rhs,
        grid_group=grid_group, workers=workers)
    extra = dict(num_threads=3, thread_name="wg")
  else:
    raise ValueError(f"unknown variant {variant!r}")
  out = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((batch, m, n_c), out_dtype),
      grid=(workers,),
      grid_names=("sm",),
      compiler_params=common.compiler_params(),
      interpret=common.interpret_params() if interpret else None,
      **extra,
  )(table, lhs, rhs)
  return out if n_c == n else out[..., :n]
