"""Rung 3, `warp_specialized`: persistent, a producer and two consumer warpgroups.

What it adds over `pipelined`:
* Warp specialization: a producer warpgroup with its registers cut to 40
  does nothing but issue TMA loads into a `max_concurrent_steps`-deep ring of
  SMEM slots; two consumer warpgroups (232 registers each) each own half of
  the CTA tile's rows (tile_m / 2 x tile_n, an f32 accumulator of 128
  registers per thread at 256x128) and run wgmma on the shared B tile, one
  wgmma in flight (`wgmma_wait(1)`: a slot goes back to the producer one K
  step after its wgmma was issued).
* One ring across all of a CTA's tiles, on hand-written mbarriers (`loaded`:
  both copies landed; `consumed`: both consumers are done with the slot): the
  producer fetches the next tile's first blocks while this tile's last
  wgmmas and its epilogue run. Per-tile `emit_pipeline_warp_specialized`
  pipelines, which this replaced, drain the producer at every tile: the ring
  took 4095x4097x4093 from 248.6 to 235.3 us (3.50x to 3.69x XLA) and the
  aligned shapes 0-0.5% further (H200, jax 0.11.2, CUPTI median of 20, XLA's
  dot in the same process: the cuBLAS-kernels and TMA-ring probe at 0834948).
* Persistence: a grid of one CTA per SM, each looping over its share of the
  tiles of every batch, so launch cost and the SMEM setup are paid once and the next tile's
  loads start while the last one's epilogue runs.
* An L2-friendly tile order (`common.tile_coords`: bands of `grid_group`
  tiles walked in a snake), so CTAs in flight share A rows and B columns.
* A tiled epilogue: each consumer writes its rows as (64, epi_tile_n) pieces
  through two SMEM slots, waiting only for the store two pieces back; the
  last stores of a tile drain while the next tile's main loop runs.
* C at its true shape when TMA cannot address C's rows (an odd N, say): the
  pieces go out by plain stores instead (`store_exact`), the edge tiles' in
  windows that end at C's edge, so XLA never slices a padded C. On
  4095x4097x4093 that took the problem from 301.1 us (2.88x XLA: the kernel
  plus an 80 us unvectorized slice) to 245.6 us (3.54x), and 8191x8193x8191
  from 3.65x to 4.15x (H200, jax 0.11.2, CUPTI median of 20, XLA's dot in the
  same process: the Pallas exact-store and stream-K probe at 0834948).

The kernel body also takes a cluster shape, which rung 4 (`clusters`) uses,
a `StreamK` split of the last tiles, which rung 5 (`stream_k`) uses, and the
ping-pong schedule (consumers on alternate whole tiles), which rung 6
(`pingpong`) uses; here they are 1x1, none and off.

Measured before the exact stores (H200, jax 0.11.2, default configs, CUPTI
median of 20, bf16, `research/pallas_probe.py all` run 3, its log at
0834948; XLA's dot in
the same process): 8192^3 797.0 TFLOP/s (0.98x XLA), 4096^3 786.0 (0.98x),
4095x4097x4093 456.8 (2.89x), 8192x4096x14336 777.3 (0.95x), 8192x14336x4096
807.5 (0.99x), A^T B 4096^3 789.5 (1.00x), A B^T 4096^3 774.7 (0.97x),
128x8192x8192 420.3 (0.98x with 128x128x64 in 6 stages; 464.8, 1.08x, with the
128x64x128 tiles now the default for M <= 128, measured in the sweep).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm.kernels.pallas import common
from jaxgemm.kernels.pallas.epilogue import Epilogue

# How an epilogue reads its bias: "row", the (epi_tn,) slice of the bias vector
# from GMEM in the accumulator's column layout, broadcast over the piece's rows;
# "tile", a (64, epi_tn) slice of the bias broadcast to 64 rows by the wrapper.
BIAS_LOAD = "row"
EPI_TILE_M = 64          # epilogue piece rows: the wgmma accumulator's row block
PRODUCER_REGISTERS = 40  # the TMA-issuing warpgroup needs almost none
# What is left of the 64K registers, shared by the consumers (a multiple of 8).
CONSUMER_REGISTERS = (512 - PRODUCER_REGISTERS) // 2 // 8 * 8


@dataclasses.dataclass(frozen=True)
class StreamK:
  """Rung 5's work split: the last tiles cut along K and shared by every worker.

  A worker is a cluster (one CTA per SM, so `workers` = SMs / cluster size).
  The first `dp_tiles` tiles (whole rounds of `workers`) are data-parallel:
  one worker computes a whole tile. The remaining `sk_tiles` (the last one or
  two rounds' worth, the last one partial) are cut into units of two K steps, and worker w computes units [w * units_per_worker,
  (w + 1) * units_per_worker) in tile order. A tile split between workers is
  finished by its "owner", the one holding its first K steps; the following
  workers, its "contributors", write their partial f32 sums to a workspace
  and signal; the owner waits, adds them in worker order and stores the tile,
  so the result is deterministic.
  """

  workers: int
  dp_tiles: int
  sk_tiles: int
  units_per_tile: int       # K steps / 2
  units_per_worker: int

  @property
  def sk_units(self) -> int:
    return self.sk_tiles * self.units_per_tile


# Stream-K pays one extra tile epilogue and a partial's round trip through L2
# per worker; below this share of a round saved it is not worth it.
MIN_STREAM_K_SAVING = 0.1
# ...nor on short tiles: with 16 K steps (8192x1024x8192) both splits ran 2-3%
# slower than `clusters` (the stream-K tail probe at 0834948, H200).
MIN_STREAM_K_STEPS = 64
# The split tiles run slower than whole ones: workers at different K offsets
# stop sharing operand tiles in L2. On the H200 the split paid only where its
# tiles were a small share of the run and lost where they were not. Over two
# rounds (the Pallas exact-store and stream-K probe at 0834948,
# H200): 8192x4096x14336, 76 of 1792 tiles, 1.5% faster than
# `clusters`; 8192^3, 100 of 1024, even; 8192x14336x4096, 116 of 512, 8% slower;
# 4096^3, 124 of 256, 6% slower. The last round only (the stream-K tail probe, two reps
# each, in kernel time against `clusters`'): 8192^3, 34 of 1024, 1.9% and 4.0%
# faster; 8192x14336x4096, 50 of 512, 2.3% faster and 0.9% slower; 6144^3, 48 of
# 576, 0.4% slower.
MAX_STREAM_K_SHARE = 0.05


def plan_stream_k(tiles: int, workers: int, k_iters: int,
                  split_rounds: int = 1) -> StreamK | None:
  """The stream-K split of `tiles` on `workers`, or None to keep whole tiles.

  A data-parallel grid of `tiles` runs ceil(tiles / workers) rounds; stream-K
  runs tiles / workers (plus its overheads). 8192x4096x14336 in 256x256
  cluster tiles on 66 clusters: 1792 tiles, 28 rounds where 27.2 would do.
  The split covers the last `split_rounds` rounds (the last one partial).
  """
  rounds, left = divmod(tiles, workers)
  if rounds < split_rounds - 1 or left == 0 or k_iters % 2 or k_iters < MIN_STREAM_K_STEPS:
    return None  # too few rounds, no partial round, K steps not in pairs or too few
  dp_tiles = (rounds + 1 - split_rounds) * workers
  sk_tiles = tiles - dp_tiles
  if 1 - left / workers < MIN_STREAM_K_SAVING or sk_tiles > MAX_STREAM_K_SHARE * tiles:
    return None
  units_per_tile = k_iters // 2
  return StreamK(workers, dp_tiles, sk_tiles, units_per_tile,
                 common.cdiv(sk_tiles * units_per_tile, workers))


def persistent_kernel(a_gmem, b_gmem, *refs, dims: common.Dims, tm: int,
                      tn: int, tk: int, stages: int, epi_tn: int, trans_a: bool,
                      trans_b: bool, grid_minor_m: bool, grid_group: int, workers: int,
                      cluster_m: int = 1, cluster_n: int = 1, multicast: bool = True,
                      exact_out: bool = False, stream_k: StreamK | None = None,
                      pingpong: bool = False, interpret: bool = False,
                      epilogue: Epilogue | None = None):
  """The persistent body of rungs 3-6.

  pingpong=False (cooperative): both consumers work on every tile, on its
  top and bottom halves. pingpong=True (rung 6): each consumer takes whole
  tiles, the CTA's even ones and its odd ones; every tile has its own ring
  steps, so whole tiles only (no stream-K split).

  epilogue (`jaxgemm.kernels.pallas.epilogue.Epilogue`, None: store the
  accumulator): after A and B come, in order, B2 (a GLU's second weight,
  multiplied by the same A tile into a second accumulator), the bias
  vectors ((batch or 1, N rounded up to tn), read per piece from GMEM), the
  tile tensor (a residual or a gate's Z, (batch, M, N): TMA-loaded per
  (64, epi_tn) piece into two SMEM slots per consumer, one piece ahead, the
  first during the tile's main loop); then the outputs, C first.
  """
  if pingpong and stream_k:
    raise ValueError("the ping-pong schedule gives every tile to one consumer: no stream-K split")
  ep = epilogue
  if ep is not None and stream_k:
    raise ValueError("stream-K's partial tiles take no fused epilogue")
  refs = list(refs)
  b2_gmem = refs.pop(0) if ep is not None and ep.glu else None
  bias_gmems = [refs.pop(0) for _ in range(ep.num_biases if ep is not None else 0)]
  tile_gmem = refs.pop(0) if ep is not None and ep.loads_tile else None
  num_out = ep.num_outputs if ep is not None else 1
  out_gmems, partials = refs[:num_out], refs[num_out:]
  c_gmem = out_gmems[0]
  dual = b2_gmem is not None
  dtype, out_dtype = a_gmem.dtype, c_gmem.dtype
  # Rows of the tile per consumer warpgroup, and how many consumers split a tile.
  row_parts = 1 if pingpong else 2
  consumer_rows = tm // row_parts
  k_iters = common.cdiv(dims.k, tk)
  # A cluster computes (cluster_m x cluster_n) adjacent CTA tiles.
  m_tiles, n_tiles = common.cdiv(dims.m, tm), common.cdiv(dims.n, tn)
  m_cl_tiles = common.cdiv(m_tiles, cluster_m)
  n_cl_tiles = common.cdiv(n_tiles, cluster_n)
  cluster = cluster_m * cluster_n
  # CTAs of a cluster along N share A's tile, along M B's: TMA multicasts it.
  a_collective = ("cluster",) if multicast and cluster_n > 1 else ()
  b_collective = ("cluster",) if multicast and cluster_m > 1 else ()
  worker = lax.axis_index("cluster_grid" if cluster > 1 else "sm")
  cta = lax.axis_index("cluster") if cluster > 1 else 0

  def tile_origin(lin):
    """(batch, M tile, N tile, whether this CTA stores it) of cluster tile `lin`."""
    bi, mc, nc = common.tile_coords(lin, m_cl_tiles, n_cl_tiles, dims.batch,
                                    grid_minor_m, grid_group)
    mi = mc * cluster_m + (cta if cluster_m > 1 else 0)
    ni = nc * cluster_n + (cta if cluster_n > 1 else 0)
    # With an odd tile count along the cluster axis, the last cluster's
    # second CTA has no tile. It recomputes its partner's tile and stores
    # nothing: on the H200, a CTA whose B box lay wholly past the array
    # (trans_b, N <= tile_n) corrupted its partner's result (relative error
    # ~1 on 33x40x24; the Pallas padding and slice probe at 0834948, H200).
    owns_tile = (mi < m_tiles) & (ni < n_tiles)
    return bi, jnp.minimum(mi, m_tiles - 1), jnp.minimum(ni, n_tiles - 1), owns_tile

  def k_blocks(bi, mi, ni, ki):
    """A's (tm, tk) and B's (tk, tn) blocks of K step `ki`, as stored (and B2's)."""
    return (common.a_block(a_gmem.at[bi], mi * tm, ki * tk, tm, tk, trans_a),
            *(common.b_block(w.at[bi], ki * tk, ni * tn, tk, tn, trans_b)
              for w in ((b_gmem, b2_gmem) if dual else (b_gmem,))))

  if exact_out:
    # Plain stores from a row-major staging slot per consumer warpgroup
    # (no TMA, so no swizzle and no second slot in flight).
    out_smem_type = plgpu.SMEM((2, EPI_TILE_M, epi_tn), out_dtype)
  else:
    # Two swizzled TMA-store slots per consumer warpgroup.
    out_smem_type = common.out_smem_type(EPI_TILE_M, epi_tn, out_dtype, 2, 2)
  # A slot is free again once its consumers (both, or the tile's one in
  # ping-pong) in every CTA it was multicast into have read it.
  consumed_type = (functools.partial(plgpu.ClusterBarrier, collective_axes=("cluster",))
                   if a_collective or b_collective else plgpu.Barrier)
  # Ping-pong gives each consumer its own `loaded` and `consumed` barrier per
  # slot: a warpgroup tracks a barrier's phase by counting its own waits, so
  # a consumer must wait on every phase of the barriers it waits on, and each
  # consumer sees only its own tiles' steps.
  owners = 2 if pingpong else 1
  swizzle = common.operand_swizzle(tm, tn, tk, dtype, trans_a, trans_b)

  def owner(step):
    """The consumer (0 or 1) whose tile ring step `step` belongs to, in ping-pong."""
    return lax.rem(lax.div(step, k_iters), 2) if pingpong else 0

  def barrier(barriers, step, who=None):
    """The barrier of ring step `step`'s slot (in ping-pong: its owner's, or consumer `who`'s)."""
    slot = lax.rem(step, stages)
    if not pingpong:
      return barriers.at[slot]
    return barriers.at[(owner(step) if who is None else who) * stages + slot]

  @functools.partial(
      pl.run_scoped,
      # Allocated once for all tiles: the `stages`-deep ring of A and B
      # blocks with its two barrier arrays...
      a_smem=common.a_smem_type(tm, tk, dtype, trans_a, stages, swizzle=swizzle),
      b_smem=common.b_smem_type(tk, tn, dtype, trans_b, stages, swizzle=swizzle),
      b2_smem=(common.b_smem_type(tk, tn, dtype, trans_b, stages, swizzle=swizzle)
               if dual else None),
      # A's and B's copies (and B2's)
      loaded=plgpu.Barrier(num_arrivals=3 if dual else 2, num_barriers=owners * stages),
      consumed=consumed_type(num_arrivals=2 // owners, num_barriers=owners * stages),
      # ...and the epilogue's staging slots (and its loaded tiles: two slots per consumer).
      out_smem=out_smem_type,
      tile_smem=(common.out_smem_type(EPI_TILE_M, epi_tn, tile_gmem.dtype, 2, 2)
                 if tile_gmem is not None else None),
      tile_bar=(plgpu.Barrier(num_arrivals=1, num_barriers=4)
                if tile_gmem is not None else None),
      collective_axes="wg",
  )
  def _scope(a_smem, b_smem, b2_smem, loaded, consumed, out_smem, tile_smem, tile_bar):
    wg = lax.axis_index("wg")
    sems = None
    if stream_k and not interpret:
      # One GMEM semaphore per (CTA, consumer): "my partial is written".
      sems = pl.get_global(plgpu.SemaphoreType.REGULAR((stream_k.workers * cluster * 2,)))

    # The ring runs across tiles: the producer fetches K step `step` (counted
    # over all of this CTA's tiles) into slot step % stages as soon as the
    # consumers have released that slot, so the next tile's first blocks load
    # while this tile's last wgmmas and its epilogue run.
    def load_blocks(lin, k_start, k_steps, step, finish):
      del finish
      bi, mi, ni, _ = tile_origin(lin)

      @pl.loop(0, k_steps)
      def _k_step(ki):
        slot = lax.rem(step + ki, stages)

        @pl.when(step + ki >= stages)
        def _wait_free():
          plgpu.barrier_wait(barrier(consumed, step + ki - stages))

        a_block, b_block, *b2_block = k_blocks(bi, mi, ni, k_start + ki)
        plgpu.copy_gmem_to_smem(a_block, a_smem.at[slot], barrier(loaded, step + ki),
                                collective_axes=a_collective)
        plgpu.copy_gmem_to_smem(b_block, b_smem.at[slot], barrier(loaded, step + ki),
                                collective_axes=b_collective)
        if dual:
          plgpu.copy_gmem_to_smem(b2_block[0], b2_smem.at[slot], barrier(loaded, step + ki),
                                  collective_axes=b_collective)

    def wait_released(first, end):
      """Waits until the consumers have released ring steps [first, end)."""
      @pl.loop(first, end)
      def _wait(s):
        plgpu.barrier_wait(barrier(consumed, s))

    def compute_tile(lin, k_start, k_steps, step, finish):
      """Accumulates K steps [k_start, +k_steps) of cluster tile `lin` from
      ring position `step` on, then hands this consumer's f32 rows to
      `finish(acc, store, owns_tile)`, `store(acc)` being the tile's epilogue."""
      del k_start   # the producer chose the blocks
      bi, mi, ni, owns_tile = tile_origin(lin)
      m_start, n_start = mi * tm, ni * tn
      row_part = 0 if pingpong else wg     # which rows of the tile this consumer holds
      wg_rows = pl.ds(row_part * consumer_rows, consumer_rows)

      def a_rows(a_slot):
        # This consumer's rows of A's tile, as wgmma's (consumer_rows, tk) operand.
        if pingpong:
          return common.a_operand(a_slot, trans_a)
        if trans_a:
          return common.transposed(a_slot.at[:, wg_rows])
        return a_slot.at[wg_rows, :]

      pieces = [(em, en) for em in range(consumer_rows // EPI_TILE_M)
                for en in range(tn // epi_tn)]

      def fetch_tile(p):
        """Starts the TMA load of piece `p`'s tile (residual or Z) into slot p % 2."""
        em, en = pieces[p]
        row0 = m_start + row_part * consumer_rows
        plgpu.copy_gmem_to_smem(
            tile_gmem.at[bi, pl.ds(row0 + em * EPI_TILE_M, EPI_TILE_M),
                         pl.ds(n_start + en * epi_tn, epi_tn)],
            tile_smem.at[wg, p % 2], tile_bar.at[wg * 2 + p % 2])

      def bias_piece(bias_gmem, col0):
        """Bias columns [col0, +epi_tn) in fp32, broadcast over the piece's 64 rows."""
        # (The interpreter reads GMEM by indexing; plgpu.load is not interpreted.)
        read = (lambda ref: ref[...]) if interpret else common.load_gmem
        bb = bi if ep.bias == "batched" else 0
        if BIAS_LOAD == "tile":   # the wrapper broadcast the bias to 64 rows
          return read(bias_gmem.at[bb, :, pl.ds(col0, epi_tn)]).astype(jnp.float32)
        row = read(bias_gmem.at[bb, pl.ds(col0, epi_tn)])
        if not interpret:   # the accumulator's column layout; the interpreter has none
          row = plgpu.layout_cast(row, plgpu.Layout.WGMMA.reduce(0))
        return lax.broadcast_in_dim(row.astype(jnp.float32), (EPI_TILE_M, epi_tn), (1,))

      if tile_gmem is not None:
        fetch_tile(0)   # under the main loop

      def store(acc, partial=None):
        """The epilogue: this consumer's rows of the tile, in (64, epi_tn)
        pieces, into C (and the epilogue's other outputs); `partial(rows,
        cols)` adds another worker's sums."""
        # Computed here, where the plain kernel always had it: the shipped table's
        # records were restamped on the plain kernels' IR being unchanged by the
        # epilogue (the restamp probe at cf035a7).
        row0 = m_start + row_part * consumer_rows
        accs = acc if isinstance(acc, tuple) else (acc,)
        piece = 0
        for p, (em, en) in enumerate(pieces):
          rows = pl.ds(row0 + em * EPI_TILE_M, EPI_TILE_M)
          cols = pl.ds(n_start + en * epi_tn, epi_tn)
          local = (slice(em * EPI_TILE_M, (em + 1) * EPI_TILE_M),
                   slice(en * epi_tn, (en + 1) * epi_tn))
          if tile_gmem is not None and p + 1 < len(pieces):
            fetch_tile(p + 1)
          vals = [x[local] for x in accs]
          if partial is not None:   # piece by piece: a whole partial would spill
            vals[0] = partial(vals[0], *local)
          if ep is not None:
            biases = [bias_piece(g, n_start + en * epi_tn) for g in bias_gmems]
            loaded = None
            if tile_gmem is not None:
              plgpu.barrier_wait(tile_bar.at[wg * 2 + p % 2])
              loaded = tile_smem[wg, p % 2].astype(jnp.float32)
            vals = ep.combine(vals, biases, loaded)
          for o_gmem, acc_piece in zip(out_gmems, vals):
            acc_piece = acc_piece.astype(out_dtype)
            if exact_out:
              out_smem[wg] = acc_piece
              row_cases = [(mi < m_tiles - 1, EPI_TILE_M)] + [
                  ((mi == m_tiles - 1) & (row_part == part), rows_left)
                  for part, rows_left in enumerate(last_tile_rows(dims.m, tm, em, row_parts))]
              col_cases = [(ni < n_tiles - 1, epi_tn),
                           (ni == n_tiles - 1, last_tile_cols(dims.n, tn, epi_tn, en))]
              store_exact(out_smem.at[wg], o_gmem.at[bi], row0 + em * EPI_TILE_M,
                          n_start + en * epi_tn, row_cases, col_cases, owns_tile,
                          store_vector_size(dims.n, epi_tn, out_dtype), interpret)
              continue
            slot = piece % 2
            piece += 1
            # The slot's previous store (two pieces back, maybe from the
            # previous tile) must have read SMEM before we overwrite it.
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            out_smem[wg, slot] = acc_piece
            plgpu.commit_smem()

            @pl.when(owns_tile)
            def _store():
              plgpu.copy_smem_to_gmem(out_smem.at[wg, slot], o_gmem.at[bi, rows, cols])

      @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((consumer_rows, tn), jnp.float32),
                         acc2_ref=plgpu.ACC((consumer_rows, tn), jnp.float32) if dual else None)
      def _acc_scope(acc_ref, acc2_ref):
        @pl.loop(0, k_steps)
        def _k_step(ki):
          slot = lax.rem(step + ki, stages)
          plgpu.barrier_wait(barrier(loaded, step + ki, who=wg))
          plgpu.wgmma(acc_ref, a_rows(a_smem.at[slot]),
                      common.b_operand(b_smem.at[slot], trans_b))
          if dual:   # the same A tile into the second accumulator
            plgpu.wgmma(acc2_ref, a_rows(a_smem.at[slot]),
                        common.b_operand(b2_smem.at[slot], trans_b))
          # One step's wgmmas stay in flight: the previous step's have finished
          # reading its slot, which goes back to the producer.
          plgpu.wgmma_wait(2 if dual else 1)

          @pl.when(ki > 0)
          def _release_previous():
            plgpu.barrier_arrive(barrier(consumed, step + ki - 1, who=wg))

        plgpu.wgmma_wait(0)
        plgpu.barrier_arrive(barrier(consumed, step + k_steps - 1, who=wg))
        finish((acc_ref[...], acc2_ref[...]) if dual else acc_ref[...], store, owns_tile)

    def for_each_work_item(work, consumer=None):
      """Calls work(lin, k_start, k_steps, step, finish) for this worker's
      tiles and stream-K segments, in the same order in every warpgroup;
      returns the ring steps they take. In ping-pong, `consumer` takes only
      its own tiles (the producer, consumer=None, loads them all)."""
      total_tiles = dims.batch * m_cl_tiles * n_cl_tiles
      dp_tiles = stream_k.dp_tiles if stream_k else total_tiles
      whole_tile = lambda acc, store, owns_tile: store(acc)
      my_tiles = lax.div(dp_tiles - worker + workers - 1, workers)
      first, stride = (consumer, 2) if pingpong and consumer is not None else (0, 1)

      @pl.loop(0, lax.div(my_tiles - first + stride - 1, stride))
      def _tile(j):
        i = first + j * stride
        work(worker + i * workers, 0, k_iters, i * k_iters, whole_tile)

      if not stream_k:
        return my_tiles * k_iters
      return stream_k_tail(work, stream_k, partials[0], sems, worker, my_tiles * k_iters,
                           cta, wg, cluster, interpret)

    @pl.when(wg == 2)
    def _producer():
      plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
      steps = for_each_work_item(load_blocks)
      # Leave only once every consumer (the partner CTA's included) has
      # released every slot: nothing may arrive on an exited CTA's barriers.
      wait_released(jnp.maximum(steps - stages, 0), steps)

    @pl.when(wg < 2)
    def _consumers():
      plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
      for_each_work_item(compute_tile, consumer=wg)
      # Every store must land before the kernel exits.
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def stream_k_tail(work, sk: StreamK, partials_gmem, sems, worker, step, cta, wg,
                  cluster: int, interpret: bool):
  """This worker's share of the stream-K tiles: at most three segments
  (the end of one tile, whole tiles, the start of another), handed to
  `work(lin, k_start, k_steps, step, finish)` from ring position `step` on;
  returns the ring position after them.

  A split tile's owner (the worker holding its first K steps) is followed by
  its contributors, the next workers up to the one holding its last unit.
  Each worker contributes at most once (its first segment), so the workspace
  holds one partial per (CTA, consumer) and one GMEM semaphore each (`sems`),
  signalled once and reset by the owner's decrementing wait; the owner adds
  the partials in worker order, so the sum's order is fixed. The Mosaic GPU
  interpreter (jax 0.10.2) allocates no semaphores and runs the grid's
  clusters one after another: there workers are numbered backwards, so every
  contributor has finished before its owner starts.
  """
  i32 = jnp.int32
  if interpret:
    worker = sk.workers - 1 - worker
  me = worker * cluster + cta                             # this CTA's workspace slot
  start = worker * sk.units_per_worker
  end = jnp.minimum(start + sk.units_per_worker, sk.sk_units)
  seg_start = start
  for _ in range(3):
    tile, unit = seg_start // sk.units_per_tile, seg_start % sk.units_per_tile
    units = jnp.minimum(sk.units_per_tile - unit, end - seg_start)
    is_contributor = unit > 0                             # holds later K steps
    is_owner = (unit == 0) & (units < sk.units_per_tile)  # holds its first K steps only
    # The owner's contributors: workers worker + 1 .. the one with the tile's last unit.
    last = ((tile + 1) * sk.units_per_tile - 1) // sk.units_per_worker
    contributors = jnp.where(is_owner, last - worker, 0)

    def finish(acc, store, owns_tile, is_contributor=is_contributor,
               contributors=contributors):
      @pl.when(is_contributor & owns_tile)
      def _contribute():
        for r in range(0, acc.shape[0], EPI_TILE_M):   # in row blocks, as the epilogue
          partials_gmem[me, wg, r:r + EPI_TILE_M] = acc[r:r + EPI_TILE_M]
        if not interpret:
          pl.semaphore_signal(sems.at[me * 2 + wg])

      adds = jnp.where(owns_tile, contributors, 0)
      if not interpret:
        @pl.loop(1, adds + 1)
        def _wait(i):
          pl.semaphore_wait(sems.at[((worker + i) * cluster + cta) * 2 + wg], 1)

      def add_partials(piece, rows, cols):
        def add_one(i, piece):
          ref = partials_gmem.at[(worker + i) * cluster + cta, wg, rows, cols]
          return piece + (ref[...] if interpret else common.load_gmem(ref))
        return lax.fori_loop(1, adds + 1, add_one, piece)

      @pl.when(~is_contributor)
      def _store():
        store(acc, add_partials)

    @pl.when(units > 0)
    def _segment(tile=tile, unit=unit, units=units, finish=finish, step=step):
      work(sk.dp_tiles + tile, 2 * unit, 2 * units, step, finish)

    units = jnp.maximum(units, i32(0))
    seg_start = seg_start + units
    step = step + 2 * units
  return step


def store_vector_size(n: int, epi_tn: int, dtype) -> int:
  """Elements per plain store into C with rows of `n`: up to 16 bytes, and 1
  for an odd N of 16-bit elements (whose rows start at every 2-byte offset)."""
  widest = 16 // jnp.dtype(dtype).itemsize
  return next(v for v in (8, 4, 2, 1) if v <= widest and n % v == 0 and epi_tn % v == 0)


def windows(valid: int, extent: int) -> tuple[int, tuple[int, ...]]:
  """(size, offsets) of at most two windows that exactly cover [0, valid).

  A piece `extent` long with only `valid` elements inside C (0 < valid <
  extent) is stored as two overlapping windows of the largest power of two
  <= valid, at 0 and at valid - size: static shapes, no mask, and nothing
  written past C's edge (the overlap is written twice with the same values).
  """
  if valid >= extent:
    return extent, (0,)
  size = 1 << (valid.bit_length() - 1)
  return size, tuple(sorted({0, valid - size}))


def last_tile_rows(m: int, tm: int, em: int, row_parts: int = 2) -> tuple[int, ...]:
  """Rows inside C of epilogue piece `em` of each of the `row_parts` parts of
  the last M tile (two consumers' halves, or ping-pong's one whole tile)."""
  first = (common.cdiv(m, tm) - 1) * tm
  return tuple(min(max(m - (first + part * (tm // row_parts) + em * EPI_TILE_M), 0), EPI_TILE_M)
               for part in range(row_parts))


def last_tile_cols(n: int, tn: int, epi_tn: int, en: int) -> int:
  """Columns inside C of epilogue piece `en` in the last N tile."""
  return min(max(n - ((common.cdiv(n, tn) - 1) * tn + en * epi_tn), 0), epi_tn)


def exact_store_fits(m: int, n: int, tm: int, tn: int, epi_tn: int, dtype,
                     row_parts: int = 2) -> bool:
  """Whether every store window holds a whole number of vectors per thread.

  A warpgroup stores a window in a row-contiguous layout of 128 threads x
  `vec` elements, so a window needs at least 128 * vec elements; a last tile
  with, say, one row inside C has none that large and keeps the padded path.
  """
  vec = store_vector_size(n, epi_tn, dtype)
  row_extents = {EPI_TILE_M} | {r for em in range(tm // row_parts // EPI_TILE_M)
                                for r in last_tile_rows(m, tm, em, row_parts) if r}
  col_extents = {epi_tn} | {c for en in range(tn // epi_tn)
                            if (c := last_tile_cols(n, tn, epi_tn, en))}
  return all(windows(r, EPI_TILE_M)[0] * windows(c, epi_tn)[0] % (128 * vec) == 0
             for r in row_extents for c in col_extents)


def store_exact(stage_smem, c_gmem, row0, col0, row_cases, col_cases, owns_tile,
                vec: int, interpret: bool):
  """Stores the epilogue piece staged in `stage_smem` to C at (row0, col0), exactly.

  C's rows are not TMA-addressable here (`common.stores_exact`), so the
  piece goes from the row-major SMEM slot to registers in a row-contiguous
  layout and out by plain global stores of `vec` elements. `row_cases` and
  `col_cases` list (condition, elements inside C) for the piece's rows and
  columns: full pieces inside C take one store, pieces at C's edge the
  `windows` that cover their part inside C. The warpgroup barriers around
  SMEM accesses come with Mosaic GPU's warpgroup lowering.
  """
  for row_cond, rows in row_cases:
    for col_cond, cols in col_cases:
      if not rows or not cols:
        continue
      (h, row_offsets), (w, col_offsets) = windows(rows, stage_smem.shape[0]), \
          windows(cols, stage_smem.shape[1])

      @pl.when(row_cond & col_cond & owns_tile)
      def _store():
        for r in row_offsets:
          for c in col_offsets:
            window = stage_smem[pl.ds(r, h), pl.ds(c, w)]
            if not interpret:  # a layout hint for Mosaic GPU; the interpreter has none
              window = plgpu.layout_cast(window, plgpu.Layout.WG_STRIDED((h, w), vec_size=vec))
            c_gmem[pl.ds(row0 + r, h), pl.ds(col0 + c, w)] = window


def persistent_call(a, b, problem, config, interpret: bool, cluster_m: int = 1,
                    cluster_n: int = 1, stream_k: bool = False, pingpong: bool = False,
                    epilogue: Epilogue | None = None, extras=()):
  """Launches `persistent_kernel` on min(SMs, tiles) CTAs (in clusters).

  stream_k: split the last tiles along K between all workers (rung 5) when
  `plan_stream_k` finds it worth it; otherwise every tile is whole.
  pingpong: the consumers take alternate whole tiles (rung 6).
  epilogue: the fused epilogue; `extras` its operands in the kernel's order
  (B2 as stored like B, biases (N,) or (batch, N), the tile tensor (batch, M, N)).
  Returns C, or the tuple of the epilogue's outputs.
  """
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  out_dtype = jnp.dtype(problem.out_dtype)
  epi_tn = min(config.epi_tile_n, tn)
  cluster = cluster_m * cluster_n
  if epilogue is not None:
    extras = _epilogue_operands(epilogue, extras, problem, tn)

  def call(a, b, dims):
    k_iters = common.cdiv(dims.k, tk)
    stages = max(2, min(config.max_concurrent_steps, k_iters))
    cluster_tiles = (dims.batch * common.cdiv(dims.m, tm * cluster_m)
                     * common.cdiv(dims.n, tn * cluster_n))
    grid = max(1, min(common.num_sms(interpret) // cluster, cluster_tiles))
    schedule = (plan_stream_k(cluster_tiles, grid, k_iters, config.split_rounds)
                if stream_k else None)
    body = functools.partial(
        persistent_kernel, dims=dims, tm=tm, tn=tn, tk=tk, stages=stages, epi_tn=epi_tn,
        trans_a=problem.trans_a, trans_b=problem.trans_b,
        grid_minor_m=config.grid_minor_m, grid_group=config.grid_group,
        cluster_m=cluster_m, cluster_n=cluster_n, exact_out=exact_out,
        stream_k=schedule, pingpong=pingpong, workers=grid, interpret=interpret,
        # The 0.10.2 interpreter cannot allocate the cluster barriers that
        # multicast needs; there each CTA of the cluster loads its own copy
        # of the shared tile (the cluster's tile walk is the same).
        multicast=not interpret)
    mesh = (dict(grid=(grid,), grid_names=("cluster_grid",), cluster=(cluster,),
                 cluster_names=("cluster",))
            if cluster > 1 else dict(grid=(grid,), grid_names=("sm",)))
    out_type = jax.ShapeDtypeStruct((dims.batch, dims.m, dims.n), out_dtype)
    if epilogue is not None:
      out_type = (out_type,) * epilogue.num_outputs
    if schedule:
      # One f32 partial tile per (CTA, consumer warpgroup): the stream-K workspace.
      out_type = (out_type, jax.ShapeDtypeStruct((grid * cluster, 2, tm // 2, tn), jnp.float32))
    out = plgpu.kernel(
        functools.partial(body, epilogue=epilogue) if epilogue is not None else body,
        out_type=out_type,
        num_threads=3,          # two consumer warpgroups + the producer
        thread_name="wg",
        compiler_params=common.compiler_params(),
        interpret=common.interpret_params() if interpret else None,
        **mesh,
    )(a, b, *extras)
    return out[0] if schedule else out

  exact_out = (common.stores_exact(problem, out_dtype)
               and exact_store_fits(problem.m, problem.n, tm, tn, epi_tn, out_dtype,
                                    row_parts=1 if pingpong else 2))
  return common.run_padded(call, a, b, problem, out_dtype=out_dtype, exact_out=exact_out)


def _epilogue_operands(ep: Epilogue, extras, problem, tn: int):
  """The epilogue's operands as the kernel reads them.

  B2 padded as `run_padded` pads B; each bias as (batch or 1, N rounded up to
  the tile) (BIAS_LOAD "tile": broadcast to (batch or 1, 64, N)), so no bias
  read leaves the array; the tile tensor padded to TMA's (8, 128-byte) tiling
  (aligned problems: untouched), its ragged edges zero-filled by TMA.
  """
  extras = list(extras)
  out = []
  if ep.glu:
    out.append(common._pad_to(extras.pop(0), common.ROW_MULTIPLE,
                              common.col_multiple(problem.dtype)))
  for _ in range(ep.num_biases):
    bias = extras.pop(0)
    bias = bias.reshape((-1, bias.shape[-1]))
    bias = jnp.pad(bias, ((0, 0), (0, common.round_up(problem.n, tn) - problem.n)))
    if BIAS_LOAD == "tile":
      bias = jnp.broadcast_to(bias[:, None, :], (bias.shape[0], EPI_TILE_M, bias.shape[1]))
    out.append(bias)
  if ep.loads_tile:
    t = extras.pop(0)
    out.append(common._pad_to(t, common.ROW_MULTIPLE, common.col_multiple(t.dtype)))
  assert not extras, "more epilogue operands than the epilogue reads"
  return out


def warp_specialized(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 3's kernel."""
  return persistent_call(a, b, problem, config, interpret)
