"""FP8 GEMMs with scales: a persistent warp-specialized kernel that promotes every 128 of K.

C[b] = (A[b] * a_scale) @ (B[b] * b_scale) for A stored (M, K) and B stored
(N, K): both operands K-major, the only layout Hopper's FP8 wgmma reads
(Mosaic GPU raises "Only f16 WGMMA supports transposes" otherwise). The
backend (`jaxgemm.ops.scaled_matmul.pallas`) brings other layouts here.

Structure: the matmul ladder's rung 3 (`matmul.warp_specialized`): one CTA
per SM walking its share of the tiles in `common.tile_coords`' order, a
producer warpgroup TMA-loading A's (tile_m, 128) and B's (tile_n, 128) blocks
into a `stages`-deep ring of 128-byte-swizzled SMEM slots that runs across
tiles (`loaded` / `consumed` barriers), two consumer warpgroups each owning
tile_m / 2 rows, and a tiled epilogue through two SMEM slots per consumer
(or exact plain stores when C's rows are not TMA-addressable,
`warp_specialized.store_exact`). Ragged M, N, K are TMA's zero fill and
dropped stores, as in the matmul; K is zero-padded to whole 128-byte rows.
With `cluster_m` or `cluster_n` = 2 (the config's), CTAs run in 2-CTA clusters
that multicast the operand tile they share, as rung 4 (`matmul.clusters`).

What differs, and why this is its own kernel rather than a switch on
`warp_specialized.persistent_kernel`:
* Promotion. Hopper's FP8 wgmma accumulates with about 14 bits of mantissa
  (DeepSeek-V3 report), so the error of one long accumulation grows with K.
  Each K step here is one 128-wide scale block: its wgmma goes into a fresh
  accumulator (`plgpu.ACC` scoped to the step, zero at allocation), which is
  read back once the wgmma is done and added, times the block's scales, into
  an fp32 register accumulator carried by the K loop (DeepGEMM's scheme). The
  wgmma is waited for every step (none stays in flight across steps as in the
  matmul): the two consumers interleave, so one's promotion runs under the
  other's wgmma. The step's ring slot goes back to the producer as soon as its
  wgmma has finished.
* Registers. A consumer holds two fp32 arrays of (tile_m / 2) x tile_n (the
  step's wgmma accumulator and the promoted sum): tile_m * tile_n <= 24576
  (128x192, 128x128, 256x64, 128x64): 192 of the 232 registers a consumer
  gets at 128x192, which loads 17% fewer bytes a flop than 128x128 and ran
  1.12x its rate per tensor (the fp8-clusters probe's run1 at ac46a30, H100).
* Scales. The kernel takes a_scale as (batch, Ks, M) and b_scale as (batch,
  Ks, N) in fp32 (the wrapper lays them out): with block scales Ks = ceil(K /
  128), a_scale transposed so a K block's column of row scales is contiguous
  and b_scale's 128x128 blocks repeated over their columns, and each K step
  multiplies its block product by a_scale[kb, rows] (outer) b_scale[kb, cols],
  read from GMEM (L2) by the consumer, its loads issued while the wgmma runs.
  Per-tensor and per-row/column scales (Ks = 1) multiply the promoted sum once,
  before the epilogue; the promotion every 128 of K applies all the same.
* A switch on the matmul's body would change `warp_specialized.py`, whose code
  versions every shipped Pallas tuning record of matmul, glu and fused_matmul
  (`tuning_cache.kernel_version`): they would read stale until re-tuned or
  restamped on the GPU. The loop this kernel changes is the heart of that
  body; stream-K, ping-pong, fused epilogues and the second weight do not
  apply. So the producer, tile order and epilogue follow rung 3 here, reusing
  its helpers (`common`, `warp_specialized.store_exact`).

Measured on the H200 (docs/performance-notes.md, "FP8 GEMMs";
the FP8 step probe's run2 at b5b0db4): 1251 TFLOP/s per tensor at 8192^3
(63% of the FP8 peak; 1322 with B stored (N, K)); with block scales read from
GMEM in the K loop 667, and with `tma_scales` 1047 (1105 with B stored (N, K)),
the pallas backend's default for block scales. Tried and slower per tensor
(same run): two K steps per promotion (1222, and 1155 at four, whose error
grew), and pairs of K steps in two accumulators with the second's wgmma issued
before the first's promotion (1197). On an H100 (the fp8-clusters probe's run1 at ac46a30,
B stored (N, K)): 128x192 tiles 1431 / 1398 TFLOP/s at 8192^3 / 8192x4096x14336
against 1278 / 1244 at 128x128 (4096^3: 1227 against 1238, the last round of
tiles part idle); 2-CTA clusters per tensor 0.97-1.01x, with block scales
1.04-1.06x at those two shapes and 0.98x at 4096^3. Block scales on 128x192
tiles with clusters along M (the fp8-block-wide probe's run1 at d1fefc7): 1275 / 1265 /
1087 TFLOP/s at 8192^3 / 8192x4096x14336 / 4096^3, against 1035 / 1041 / 1028
at 128x128 without clusters.

`tma_scales` (variant `warp_specialized_tma_scales`, block scales only): the
answer DeepGEMM gives to the scale loads' cost, in the same body behind a
compile-time switch.
* The producer copies each K step's scales by TMA into the ring slot of its A
  and B blocks, on the same `loaded` barrier (4 arrivals): a_scale's (tm,)
  column of the K block (contiguous in the (batch, Ks, M) layout) and the
  first B_SCALE_BOX (32) floats of b_scale's column vector, whose first value is
  the whole tile's where tile_n divides 128 (the tile lies in one column
  block). 640 bytes a slot at tm = 128: the default ring at 128x128 with a
  bf16 epilogue has 5 stages instead of 6.
* A consumer reads its rows' a_scale (the accumulator's row layout, 2
  registers a thread) and the b value (one scalar) from the slot while the
  step's wgmma runs, before releasing the slot: no GMEM load in the K loop, and
  one multiply per element (part * (a_s * b_s) broadcast along N) instead of
  the outer product's two. (Read after the wgmma instead, 128x192 ran 1.026-1.032x
  slower: the fp8-block-wide probe's run6 at 2aaf16b.)
* A 128x192 tile spans two column blocks, at a boundary 64 or 128 columns in
  (tiles start at multiples of 64). Its slot holds the tile's whole b_scale
  vector (192 floats) and the promoted sum is three (64, 64) arrays, each
  multiplied by one b value (`scale_chunk`): the same one FMA an element, no
  per-column select. Its pairs (`overlap`) would need a third (64, 192) array,
  past the registers, so its K steps run one at a time.
* `overlap` (OVERLAP_PROMOTION): K steps go in pairs, each in its own
  zero-initialized accumulator; the second's wgmma is issued before the
  first's product is read (`wgmma_accumulator_load(wait_n=1)`), so the
  first's promotion runs under it; an odd last step runs alone. Not across
  pairs: restarting an accumulator carried by the loop needs a store into
  it, which jax 0.10.2's Mosaic GPU interpreter does not run. Registers at
  128x128 (a consumer's (64, 128) fp32 array is 64 a thread): the two step
  accumulators and the promoted sum are 192 of the 232 a consumer gets
  (`ws.CONSUMER_REGISTERS`), leaving ~40 for the scales (3), indices,
  addresses and barrier phases. Measured with and without the pairs: 1105
  and 1089 TFLOP/s at 8192^3, 1094 both at 8192x4096x14336 (B stored (N, K)).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxgemm.kernels.pallas import common
from jaxgemm.kernels.pallas.matmul import warp_specialized as ws

# One K step: one scale block along K, one promotion interval, and for fp8 one
# 128-byte swizzle row of each operand's SMEM tile.
BLOCK = 128
EPI_TILE_M = ws.EPI_TILE_M
# Both fp32 arrays of a consumer warpgroup: at most 192 of its 232 registers a thread
# (128x192 tiles, 1.12x the 128x128 tiles' rate per tensor with B stored (N, K): the fp8-clusters
# probe's run1 at ac46a30, H100).
MAX_ACC_ELEMENTS = 2 * 64 * 192
# With `tma_scales`, the floats of b_scale's column vector the producer copies
# per K step for a tile inside one 128-column scale block (128 % tile_n == 0),
# whose first value is the tile's: 128 bytes, because a TMA copy's SMEM
# destination must be 128-byte aligned and the slots of a (stages, box) buffer
# lie box * 4 bytes apart (a 16-byte box, TMA's smallest, faulted with
# CUDA_ERROR_MISALIGNED_ADDRESS on the H200: the FP8 step probe's run1 at b5b0db4).
# A tile across blocks (128x192) copies its whole vector (`b_scale_box`).
B_SCALE_BOX = 32
# With `tma_scales`, whether K steps go in pairs with the second's wgmma issued
# before the first's promotion (the `overlap` argument's default): 1.5% faster at
# 8192^3, equal at 8192x4096x14336 (the module docstring).
OVERLAP_PROMOTION = True


def b_scale_box(tn: int) -> int:
  """The b_scale floats a ring slot holds with `tma_scales` (B_SCALE_BOX's comment)."""
  return B_SCALE_BOX if BLOCK % tn == 0 else -(-tn // B_SCALE_BOX) * B_SCALE_BOX


def scale_chunk(tn: int, per_block: bool) -> int:
  """The column width over which a tile's scales are one value per row: a tile
  inside one 128-column scale block is one chunk; a 192-wide one is three of
  64, each in one block (tiles start at multiples of 64)."""
  return math.gcd(tn, BLOCK) if per_block else tn


def scaled_kernel(a_gmem, b_gmem, a_scale_gmem, b_scale_gmem, c_gmem, *, dims: common.Dims,
                  tm: int, tn: int, stages: int, epi_tn: int, per_block: bool,
                  grid_minor_m: bool, grid_group: int, workers: int, exact_out: bool,
                  interpret: bool, tma_scales: bool = False, overlap: bool = False,
                  cluster_m: int = 1, cluster_n: int = 1, multicast: bool = True):
  """The persistent body: A (batch, M, K), B (batch, N, K), scales (batch, Ks, M | N).

  `cluster_m` / `cluster_n` (one of them 2): CTAs in 2-CTA clusters, as the
  matmul's rung 4 (`matmul.clusters`): the operand tile both need (B's along M,
  A's along N) is multicast by TMA (`multicast`), each CTA loading its own
  scales.

  `tma_scales` (block scales only; variant `warp_specialized_tma_scales`): the
  producer copies each K step's scales into the ring beside A's and B's blocks,
  and the consumers read them from SMEM; `overlap` also pairs the K steps, the
  second's wgmma issued before the first's promotion.
  """
  assert not tma_scales or per_block, "tma_scales takes block scales"
  assert not overlap or tma_scales, "overlap comes with tma_scales"
  tk = BLOCK
  f32 = jnp.float32
  dtype, out_dtype = a_gmem.dtype, c_gmem.dtype
  rows = tm // 2                       # per consumer warpgroup
  k_iters = common.cdiv(dims.k, tk)
  m_tiles, n_tiles = common.cdiv(dims.m, tm), common.cdiv(dims.n, tn)
  m_cl_tiles, n_cl_tiles = common.cdiv(m_tiles, cluster_m), common.cdiv(n_tiles, cluster_n)
  cluster = cluster_m * cluster_n
  a_collective = ("cluster",) if multicast and cluster_n > 1 else ()
  b_collective = ("cluster",) if multicast and cluster_m > 1 else ()
  worker = lax.axis_index("cluster_grid" if cluster > 1 else "sm")
  cta = lax.axis_index("cluster") if cluster > 1 else 0
  total_tiles = dims.batch * m_cl_tiles * n_cl_tiles
  swizzle = common.operand_swizzle(tm, tn, tk, dtype, False, True)
  pieces = [(em, en) for em in range(rows // EPI_TILE_M) for en in range(tn // epi_tn)]
  # The promoted sum is carried as `chunks` (rows, chunk) arrays, one per run of
  # columns with one scale (`scale_chunk`): Mosaic GPU slices register arrays
  # for free but has no concatenate.
  chunk = scale_chunk(tn, per_block)
  chunks = tn // chunk
  assert chunk % epi_tn == 0, (chunk, epi_tn)
  b_box = b_scale_box(tn)

  def tile_origin(lin):
    """(batch, M tile, N tile, whether this CTA stores it) of cluster tile `lin`: as
    the matmul's, a CTA past an odd tile count recomputes its partner's tile."""
    bi, mc, nc = common.tile_coords(lin, m_cl_tiles, n_cl_tiles, dims.batch, grid_minor_m,
                                    grid_group)
    mi = mc * cluster_m + (cta if cluster_m > 1 else 0)
    ni = nc * cluster_n + (cta if cluster_n > 1 else 0)
    owns_tile = (mi < m_tiles) & (ni < n_tiles)
    return bi, jnp.minimum(mi, m_tiles - 1), jnp.minimum(ni, n_tiles - 1), owns_tile

  def read_vector(ref, layout):
    """A GMEM vector in fp32 registers, in the accumulator's row or column layout."""
    if interpret:   # the interpreter reads GMEM by indexing and has no layouts
      return ref[...]
    return plgpu.layout_cast(common.load_gmem(ref), layout)

  def scale_of(bi, ks, row0, n0):
    """a_scale[ks, rows] (outer) b_scale[ks, cols] over this consumer's (rows, tn)."""
    a_s = read_vector(a_scale_gmem.at[bi, ks, pl.ds(row0, rows)], plgpu.Layout.WGMMA.reduce(1))
    b_s = read_vector(b_scale_gmem.at[bi, ks, pl.ds(n0, tn)], plgpu.Layout.WGMMA.reduce(0))
    return (lax.broadcast_in_dim(a_s, (rows, tn), (0,))
            * lax.broadcast_in_dim(b_s, (rows, tn), (1,)))

  def smem_scales(a_scale_smem, b_scale_smem, slot):
    """The K step's a_scale[rows] * b_scale over each of this consumer's (rows,
    chunk) column runs (one b_scale value each), from the step's ring slot."""
    a_ref = a_scale_smem.at[slot, pl.ds(lax.axis_index("wg") * rows, rows)]
    if interpret:
      a_s = a_ref[...]
    else:   # the accumulator's row layout: 2 registers a thread at 64 rows
      a_s = plgpu.layout_cast(common.load_gmem(a_ref), plgpu.Layout.WGMMA.reduce(1))
    return [lax.broadcast_in_dim(a_s * b_scale_smem[slot, c * chunk], (rows, chunk), (0,))
            for c in range(chunks)]

  def promote(total, part, scales):
    """total + part (times its scales, per column run): the step's one pass over
    the accumulator."""
    runs = [part[:, c * chunk:(c + 1) * chunk] for c in range(chunks)]   # register views
    return tuple(t + (p if s is None else p * s)
                 for t, p, s in zip(total, runs, scales or [None] * chunks))

  if exact_out:   # plain stores from one row-major staging slot per consumer
    out_smem_type = plgpu.SMEM((2, EPI_TILE_M, epi_tn), out_dtype)
  else:           # two swizzled TMA-store slots per consumer
    out_smem_type = common.out_smem_type(EPI_TILE_M, epi_tn, out_dtype, 2, 2)

  # With tma_scales the ring's slots hold the step's scales too: a_scale's
  # (tm,) column of the K block and b_scale's first `b_box` values.
  scale_smem = dict(a_scale_smem=plgpu.SMEM((stages, tm), f32),
                    b_scale_smem=plgpu.SMEM((stages, b_box), f32)) if tma_scales else {}

  consumed_type = (functools.partial(plgpu.ClusterBarrier, collective_axes=("cluster",))
                   if a_collective or b_collective else plgpu.Barrier)

  @functools.partial(
      pl.run_scoped,
      a_smem=common.a_smem_type(tm, tk, dtype, False, stages, swizzle=swizzle),
      b_smem=common.b_smem_type(tk, tn, dtype, True, stages, swizzle=swizzle),
      # A's and B's copies (and the two scale copies)
      loaded=plgpu.Barrier(num_arrivals=4 if tma_scales else 2, num_barriers=stages),
      # both consumers (of both CTAs where a multicast wrote the slot into both)
      consumed=consumed_type(num_arrivals=2, num_barriers=stages),
      out_smem=out_smem_type,
      collective_axes="wg",
      **scale_smem,
  )
  def _scope(a_smem, b_smem, loaded, consumed, out_smem, a_scale_smem=None,
             b_scale_smem=None):
    wg = lax.axis_index("wg")
    my_tiles = lax.div(total_tiles - worker + workers - 1, workers)

    def store(total, bi, mi, ni, owns_tile, row0, n0, i):
      """This consumer's rows of the tile (`chunks` arrays) into C, in (64, epi_tn)
      pieces: C's one rounding."""
      for p, (em, en) in enumerate(pieces):
        local = (slice(em * EPI_TILE_M, (em + 1) * EPI_TILE_M),
                 slice(en * epi_tn, (en + 1) * epi_tn))
        c, c_off = divmod(en * epi_tn, chunk)
        piece = total[c][local[0], c_off:c_off + epi_tn].astype(out_dtype)
        r0, c0 = row0 + em * EPI_TILE_M, n0 + en * epi_tn
        if exact_out:
          out_smem[wg] = piece
          row_cases = [(mi < m_tiles - 1, EPI_TILE_M)] + [
              ((mi == m_tiles - 1) & (wg == part), rows_left)
              for part, rows_left in enumerate(ws.last_tile_rows(dims.m, tm, em, 2))]
          col_cases = [(ni < n_tiles - 1, epi_tn),
                       (ni == n_tiles - 1, ws.last_tile_cols(dims.n, tn, epi_tn, en))]
          ws.store_exact(out_smem.at[wg], c_gmem.at[bi], r0, c0, row_cases, col_cases, owns_tile,
                         ws.store_vector_size(dims.n, epi_tn, out_dtype), interpret)
          continue
        # Slots alternate over every piece of every tile: with an odd piece count
        # per tile, a per-tile count would reuse the slot of the store just issued.
        slot = lax.rem(i * len(pieces) + p, 2)
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)   # the slot's store, two back
        out_smem[wg, slot] = piece
        plgpu.commit_smem()

        @pl.when(owns_tile)
        def _store():
          plgpu.copy_smem_to_gmem(out_smem.at[wg, slot],
                                  c_gmem.at[bi, pl.ds(r0, EPI_TILE_M), pl.ds(c0, epi_tn)])

    @pl.when(wg == 2)
    def _producer():
      plgpu.set_max_registers(ws.PRODUCER_REGISTERS, action="decrease")

      @pl.loop(0, my_tiles)
      def _tile(i):
        bi, mi, ni, _ = tile_origin(worker + i * workers)

        @pl.loop(0, k_iters)
        def _k_step(ki):
          step = i * k_iters + ki          # ring position, counted over all tiles
          slot = lax.rem(step, stages)

          @pl.when(step >= stages)
          def _wait_free():
            plgpu.barrier_wait(consumed.at[slot])

          plgpu.copy_gmem_to_smem(common.a_block(a_gmem.at[bi], mi * tm, ki * tk, tm, tk, False),
                                  a_smem.at[slot], loaded.at[slot], collective_axes=a_collective)
          plgpu.copy_gmem_to_smem(common.b_block(b_gmem.at[bi], ki * tk, ni * tn, tk, tn, True),
                                  b_smem.at[slot], loaded.at[slot], collective_axes=b_collective)
          if tma_scales:   # the wrapper padded both to the tiles' cover: in bounds
            plgpu.copy_gmem_to_smem(a_scale_gmem.at[bi, ki, pl.ds(mi * tm, tm)],
                                    a_scale_smem.at[slot], loaded.at[slot])
            plgpu.copy_gmem_to_smem(b_scale_gmem.at[bi, ki, pl.ds(ni * tn, b_box)],
                                    b_scale_smem.at[slot], loaded.at[slot])

      # Every slot's last release is waited for too, so each barrier's phases
      # are all consumed before the CTA exits.
      steps = my_tiles * k_iters

      @pl.loop(jnp.maximum(steps - stages, 0), steps)
      def _drain(step):
        plgpu.barrier_wait(consumed.at[lax.rem(step, stages)])

    @pl.when(wg < 2)
    def _consumers():
      plgpu.set_max_registers(ws.CONSUMER_REGISTERS, action="increase")
      wg_rows = pl.ds(wg * rows, rows)

      @pl.loop(0, my_tiles)
      def _tile(i):
        bi, mi, ni, owns_tile = tile_origin(worker + i * workers)
        row0, n0 = mi * tm + wg * rows, ni * tn

        def k_step(ki, total):
          step = i * k_iters + ki
          slot = lax.rem(step, stages)
          plgpu.barrier_wait(loaded.at[slot])

          def block_product(acc_ref):
            plgpu.wgmma(acc_ref, a_smem.at[slot, wg_rows, :], common.transposed(b_smem.at[slot]))
            # Issued under the wgmma; reading acc_ref waits for it.
            # (TMA scales: 1.026-1.032x over reading them after it at 128x192, the fp8-block-wide
            # probe's run6 at 2aaf16b.)
            scales = None
            if tma_scales:
              scales = smem_scales(a_scale_smem, b_scale_smem, slot)
            elif per_block:
              scale = scale_of(bi, ki, row0, n0)
              scales = [scale[:, c * chunk:(c + 1) * chunk] for c in range(chunks)]
            return acc_ref[...], scales

          part, scales = pl.run_scoped(block_product, plgpu.ACC((rows, tn), f32))
          plgpu.barrier_arrive(consumed.at[slot])   # the wgmma has read the slot
          return promote(total, part, scales)

        def k_pair(j, total):
          """Steps 2j and 2j + 1: the second's wgmma is issued before the first is
          promoted (wait for all but one wgmma), so that promotion runs under it."""
          steps = [i * k_iters + 2 * j + d for d in (0, 1)]
          slots = [lax.rem(step, stages) for step in steps]

          def first(acc0):
            plgpu.barrier_wait(loaded.at[slots[0]])
            plgpu.wgmma(acc0, a_smem.at[slots[0], wg_rows, :],
                        common.transposed(b_smem.at[slots[0]]))

            def second(acc1):
              plgpu.barrier_wait(loaded.at[slots[1]])
              plgpu.wgmma(acc1, a_smem.at[slots[1], wg_rows, :],
                          common.transposed(b_smem.at[slots[1]]))
              part0 = plgpu.wgmma_accumulator_load(acc0, wait_n=1)   # step 2j done
              scales0 = smem_scales(a_scale_smem, b_scale_smem, slots[0])
              plgpu.barrier_arrive(consumed.at[slots[0]])
              promoted = promote(total, part0, scales0)
              return promoted, acc1[...]                             # step 2j + 1 done

            return pl.run_scoped(second, plgpu.ACC((rows, tn), f32))

          promoted, part1 = pl.run_scoped(first, plgpu.ACC((rows, tn), f32))
          scales1 = smem_scales(a_scale_smem, b_scale_smem, slots[1])
          plgpu.barrier_arrive(consumed.at[slots[1]])
          return promote(promoted, part1, scales1)

        zeros = jnp.zeros((rows, chunk), f32)
        if not interpret:
          zeros = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        zeros = (zeros,) * chunks
        if overlap:   # k_iters is static: the pairs, then an odd last step alone
          total = lax.fori_loop(0, k_iters // 2, k_pair, zeros)
          if k_iters % 2:
            total = k_step(k_iters - 1, total)
        else:
          total = lax.fori_loop(0, k_iters, k_step, zeros)
        if not per_block:   # one chunk
          total = (total[0] * scale_of(bi, 0, row0, n0),)
        store(total, bi, mi, ni, owns_tile, row0, n0, i)

      plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # every store lands before exit


def kernel_scales(a_scale, b_scale, scale_kind: str, batch: int, m: int, n: int,
                  m_rows: int, n_cols: int):
  """The scales as the kernel reads them: (batch, Ks, m_rows), (batch, Ks, n_cols) fp32.

  From the op's canonical scales (`ScaledMatmulProblem`'s shapes): "block"
  a_scale (batch, M, Kb) transposed, b_scale (batch, Kb, Nb) repeated over
  each block's 128 columns; "row_col" (batch, M, 1), (batch, 1, N) transposed
  or as is; "tensor" scalars broadcast to a row and a column. M and N are
  padded (with ones) to the tiles' cover, `m_rows` and `n_cols`, so no scale
  read leaves the arrays. Their size is K/128 floats per row of A and per
  column of B: about 3% of the fp8 operands' bytes.
  """
  f32 = jnp.float32
  if scale_kind == "tensor":
    a_s = jnp.broadcast_to(jnp.asarray(a_scale, f32), (batch, 1, m))
    b_s = jnp.broadcast_to(jnp.asarray(b_scale, f32), (batch, 1, n))
  elif scale_kind == "row_col":
    a_s, b_s = jnp.swapaxes(a_scale, 1, 2), b_scale
  else:
    a_s = jnp.swapaxes(a_scale, 1, 2)
    b_s = jnp.repeat(b_scale, BLOCK, axis=2, total_repeat_length=b_scale.shape[2] * BLOCK)
    b_s = b_s[:, :, :n]
  a_s = jnp.pad(a_s.astype(f32), ((0, 0), (0, 0), (0, m_rows - m)), constant_values=1)
  b_s = jnp.pad(b_s.astype(f32), ((0, 0), (0, 0), (0, n_cols - n)), constant_values=1)
  return a_s, b_s


def scaled(a, b, a_scale, b_scale, problem, config, *, scale_kind: str,
           interpret: bool = False, tma_scales: bool = False, overlap: bool | None = None):
  """C = (A * a_scale) @ (B * b_scale) for a K-major `problem` (trans_a False,
  trans_b True: A (batch, M, K), B (batch, N, K), one dtype), the scales in
  the op's canonical shapes for `scale_kind`.

  `tma_scales` (block scales): the scales go through the ring by TMA
  (`scaled_kernel`); `overlap` (default OVERLAP_PROMOTION where its three fp32
  arrays fit, tile_m * tile_n <= 16384) pairs the K steps
  (docs/performance-notes.md, "FP8 GEMMs")."""
  if problem.trans_a or not problem.trans_b:
    raise ValueError(f"the scaled kernel reads both operands K-major (trans_a=False, "
                     f"trans_b=True); got trans_a={problem.trans_a}, trans_b={problem.trans_b}")
  if jnp.dtype(a.dtype) != jnp.dtype(b.dtype):
    raise ValueError(f"the scaled kernel takes one operand dtype; got {a.dtype} and {b.dtype}")
  tm, tn = config.tile_m, config.tile_n
  if config.tile_k != BLOCK:
    raise ValueError(f"the scaled kernel's K step is one scale block: tile_k={config.tile_k} "
                     f"must be {BLOCK}")
  if tm // 2 * tn * 2 > MAX_ACC_ELEMENTS:
    raise ValueError(f"two fp32 arrays of (tile_m / 2) x tile_n per consumer: tile_m={tm}, "
                     f"tile_n={tn} need more than 192 registers per thread")
  out_dtype = jnp.dtype(problem.out_dtype)
  epi_tn = min(config.epi_tile_n, tn)
  per_block = scale_kind == "block"
  if tma_scales and not per_block:
    raise ValueError(f"tma_scales takes block scales; got scale_kind={scale_kind!r}")
  chunk = scale_chunk(tn, per_block)
  if chunk % epi_tn:
    raise ValueError(f"with block scales a {tn}-wide tile is stored by {chunk}-column runs "
                     f"of one scale: epi_tile_n={epi_tn} must divide {chunk}")
  # The pairs hold a third fp32 array: three fit 192 registers at 128x128 only.
  pairs_fit = tm // 2 * tn * 3 <= MAX_ACC_ELEMENTS
  if overlap and not pairs_fit:
    raise ValueError(f"overlap holds three fp32 arrays of (tile_m / 2) x tile_n per "
                     f"consumer: tile_m={tm}, tile_n={tn} take more than 192 registers")
  overlap = tma_scales and pairs_fit and (OVERLAP_PROMOTION if overlap is None else overlap)
  cluster = config.cluster_m * config.cluster_n
  if cluster not in (1, 2) or min(config.cluster_m, config.cluster_n) != 1:
    raise ValueError(f"the scaled kernel runs 1- or 2-CTA clusters: cluster_m="
                     f"{config.cluster_m}, cluster_n={config.cluster_n}")

  def call(a, b, dims):
    k_iters = common.cdiv(dims.k, BLOCK)
    stages = max(2, min(config.max_concurrent_steps, k_iters))
    m_tiles, n_tiles = common.cdiv(dims.m, tm), common.cdiv(dims.n, tn)
    cluster_tiles = (dims.batch * common.cdiv(m_tiles, config.cluster_m)
                     * common.cdiv(n_tiles, config.cluster_n))
    grid = max(1, min(common.num_sms(interpret) // cluster, cluster_tiles))
    a_s, b_s = kernel_scales(a_scale, b_scale, scale_kind, dims.batch, problem.m, problem.n,
                             m_tiles * tm, n_tiles * tn)
    body = functools.partial(
        scaled_kernel, dims=dims, tm=tm, tn=tn, stages=stages, epi_tn=epi_tn,
        per_block=per_block, grid_minor_m=config.grid_minor_m, grid_group=config.grid_group,
        workers=grid, exact_out=exact_out, interpret=interpret, tma_scales=tma_scales,
        overlap=overlap, cluster_m=config.cluster_m, cluster_n=config.cluster_n,
        # As the matmul's: the 0.10.2 interpreter cannot allocate the cluster
        # barriers multicast needs, so there each CTA loads its own copy.
        multicast=not interpret)
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
    )(a, b, a_s, b_s)

  exact_out = (common.stores_exact(problem, out_dtype)
               and ws.exact_store_fits(problem.m, problem.n, tm, tn, epi_tn, out_dtype))
  return common.run_padded(call, a, b, problem, out_dtype=out_dtype, exact_out=exact_out)
