"""The FP8 grouped GEMM with scales (`scaled_ragged_dot`) on Triton, ragged-M.

Two kernels' halves in one: the tiles and their groups are `ragged_dot`'s
(`kernels.triton.ragged_dot.grouped`: the (B, 3, S) slot table of
`jaxgemm.ragged_schedule.row_tiles`, each group's tiles starting at its first
row, the rows in no group stored as zeros with nothing read, an empty expert
never read), and the K loop is `scaled_matmul`'s (`kernels.triton.scaled_matmul
.scaled`): per 128-wide K block the fp8 products are summed on the tensor cores
into a fresh fp32 `partial`, then promoted into the fp32 accumulator,

    acc += partial * lhs_scale[rows, kb][:, None] * rhs_scale[g, kb, cols // 128][None, :]  "block"
    acc += partial                                                                        otherwise

and the epilogue applies the other kinds' scales once (a scalar each; a row of
lhs and a column of the group's expert), before the one rounding to out_dtype.
Why promote every 128 of K: scaled.py's docstring (Hopper's FP8 wgmma keeps
about 14 bits while it accumulates).

`scaled_ragged_m_persistent_kernel` walks the same items on one program per SM, as
ragged_dot's `ragged_m_persistent_kernel` does.

`scaled_ragged_k_kernel` is the ragged-K form (the weight gradient, out[b, g] =
lhs[b, rows g]^T @ rhs[b, rows g], (K, N) per group), ragged_dot's `ragged_k_kernel`
with the promotion: each program reads its group's [start, end) from the (B, 2, G)
bounds and walks its rows on the global 128-row grid of the scale blocks, from
floor(start / 128) * 128 to end, rows outside [start, end) masked to zeros (a block
may hold the end of one group and the start of the next), so every 128-row step has
one scale block per column:

    acc += partial * lhs_scale[mb, k][:, None] * rhs_scale[mb, n][None, :]    "block"

Both of its operand tiles are read MN-major (lhs (M, K) transposed through its
strides, rhs (M, N) as stored: the contraction is their rows), which FP8 wgmma does not
take, so its tiles are multiplied in float16 (exact). Taking the operands K-major
(quantize_pair's transposed outputs, X^T (K, M) and dY^T (N, M)) for fp8 math is the
faster form still to come.

rhs is read through strides: (K, N) as stored (the canonical (B, G, K, N)), or
(N, K) after a transpose (`rhs_k_major`). FP8 wgmma reads its shared-memory
operands K-major only, so an rhs read (K, N) is multiplied in float16 (exact for
both fp8 types: `scaled.dot_f16` says why and what it costs), and a K-major rhs
in fp8.
"""

import types

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from jaxgemm import ragged_schedule as schedule
from jaxgemm import triton_call
from jaxgemm.kernels.triton.common import grouped_tile, tile_ptrs
from jaxgemm.kernels.triton.ragged_dot.grouped import (ROW_ALIGN, _ptrs, _ragged_m_store,
                                                       needs_index_64, num_sms)
from jaxgemm.kernels.triton.scaled_matmul import scaled, transpose


@triton.jit
def _typed(ptr, BYTES_AS: tl.constexpr):
  """An fp8 operand's pointer, typed back from its uint8 bytes where BYTES_AS names
  the format (Triton's interpreter: `scaled.kernel_operands`)."""
  if BYTES_AS == "e4m3":
    ptr = ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
  if BYTES_AS == "e5m2":
    ptr = ptr.to(tl.pointer_type(tl.float8e5), bitcast=True)
  return ptr


@triton.jit
def _scaled_tile(
    lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, batch, group, row_start, pid_n, k_blocks,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    RHS_STRIDE_K: tl.constexpr, RHS_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    K_BLOCKS: tl.constexpr, N_BLOCKS: tl.constexpr, SCALE_BLOCK_SIZE: tl.constexpr,
    SCALE_KIND: tl.constexpr, INDEX_64: tl.constexpr, DOT_F16: tl.constexpr,
):
  """The scaled fp32 tile lhs[batch, row_start + BLOCK_M rows] @ rhs[batch, group][:, N
  tile] over the first k_blocks 128-wide K blocks (K_BLOCKS: all of K; 0: a zero tile,
  though "tensor" and "row_col" scales still multiply it: the caller masks it)."""
  # Rows past M and columns past N wrap around: loads (and the scales' loads) stay in
  # bounds, their results never stored; rows of the tile outside the slot's rows are
  # other groups': computed with this group's weights and scales, discarded at the store.
  offs_m = (row_start + tl.arange(0, BLOCK_M)) % M
  offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  offs_k = tl.arange(0, BLOCK_K)
  expert = tl.cast(batch, tl.int64) * G + group   # whole-block offsets in int64
  a_ptrs = tile_ptrs(lhs_ptr, tl.cast(batch, tl.int64), offs_m, offs_k, M * K, K, 1, INDEX_64)
  b_ptrs = tile_ptrs(rhs_ptr, expert, offs_k, offs_n, K * N, RHS_STRIDE_K, RHS_STRIDE_N,
                     INDEX_64)
  STEPS: tl.constexpr = SCALE_BLOCK_SIZE // BLOCK_K
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for kb in range(0, k_blocks):
    # The block's sum on the tensor cores, from zero: at most 128 products deep.
    partial = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.static_range(STEPS):
      if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
      else:
        k_left = K - (kb * STEPS + step) * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
      if DOT_F16:
        a = a.to(tl.float16)
        b = b.to(tl.float16)
      partial = tl.dot(a, b, partial)
      a_ptrs += BLOCK_K
      b_ptrs += BLOCK_K * RHS_STRIDE_K
    # The promotion: an fp32 add (times the block's scales) per 128 of K.
    if SCALE_KIND == "block":
      sa = tl.load(lhs_scale_ptr + (tl.cast(batch, tl.int64) * M + offs_m) * K_BLOCKS + kb)
      sb = tl.load(rhs_scale_ptr + (expert * K_BLOCKS + kb) * N_BLOCKS
                   + offs_n // SCALE_BLOCK_SIZE)
      acc += partial * (sa[:, None] * sb[None, :])
    else:
      acc += partial
  if SCALE_KIND == "tensor":
    acc = acc * (tl.load(lhs_scale_ptr) * tl.load(rhs_scale_ptr))
  if SCALE_KIND == "row_col":
    sa = tl.load(lhs_scale_ptr + tl.cast(batch, tl.int64) * M + offs_m)
    sb = tl.load(rhs_scale_ptr + expert * N + offs_n)
    acc = acc * (sa[:, None] * sb[None, :])
  return acc


@triton.jit
def scaled_ragged_m_kernel(
    lhs_ptr, rhs_ptr, tiles_ptr, lhs_scale_ptr, rhs_scale_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr, S: tl.constexpr,
    RHS_STRIDE_K: tl.constexpr, RHS_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
    K_BLOCKS: tl.constexpr, N_BLOCKS: tl.constexpr, SCALE_BLOCK_SIZE: tl.constexpr,
    SCALE_KIND: tl.constexpr, INDEX_64: tl.constexpr,
    A_BYTES_AS: tl.constexpr, B_BYTES_AS: tl.constexpr, DOT_F16: tl.constexpr,
):
  """out[b, rows of g] = scaled (lhs[b, rows of g] @ rhs[b, g]): one (slot, N tile, batch)
  per program; grid (S * tiles_n, B).

  lhs (B, M, K) row-major fp8; rhs (B, G, K, N) fp8 with strides (RHS_STRIDE_K,
  RHS_STRIDE_N) per (k, n) (swapped for (B, G, N, K)); tiles (B, 3, S) int32; scales
  float32: SCALE_KIND "tensor" () and (); "row_col" (B, M, 1) and (B, G, 1, N);
  "block" (B, M, K_BLOCKS) and (B, G, K_BLOCKS, N_BLOCKS). BLOCK_K divides
  SCALE_BLOCK_SIZE (128); EVEN_K: K is a multiple of 128. A_BYTES_AS, B_BYTES_AS,
  DOT_F16: as `scaled.scaled_matmul_kernel`'s. out (B, M, N).
  """
  lhs_ptr = _typed(lhs_ptr, A_BYTES_AS)
  rhs_ptr = _typed(rhs_ptr, B_BYTES_AS)
  batch = tl.program_id(1)
  slot, pid_n = grouped_tile(tl.program_id(0), S * BLOCK_M, N, BLOCK_M, BLOCK_N, GROUP_M)
  table = tiles_ptr + batch * (3 * S) + slot
  group = tl.load(table)
  row_start = tl.load(table + S)
  row_end = tl.load(table + 2 * S)
  if row_start >= row_end:
    return
  if group == G:   # rows in no group: zeros, nothing read
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  else:
    acc = _scaled_tile(lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, batch, group,
                       row_start, pid_n, K_BLOCKS, M, N, K, G, RHS_STRIDE_K, RHS_STRIDE_N,
                       BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, K_BLOCKS, N_BLOCKS,
                       SCALE_BLOCK_SIZE, SCALE_KIND, INDEX_64, DOT_F16)
  _ragged_m_store(out_ptr, batch, row_start, row_end, pid_n, acc, M, N,
                  BLOCK_M, BLOCK_N, INDEX_64)


@triton.jit
def scaled_ragged_m_persistent_kernel(
    lhs_ptr, rhs_ptr, tiles_ptr, lhs_scale_ptr, rhs_scale_ptr, out_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    G: tl.constexpr, S: tl.constexpr,
    RHS_STRIDE_K: tl.constexpr, RHS_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    K_BLOCKS: tl.constexpr, N_BLOCKS: tl.constexpr, SCALE_BLOCK_SIZE: tl.constexpr,
    SCALE_KIND: tl.constexpr, INDEX_64: tl.constexpr,
    A_BYTES_AS: tl.constexpr, B_BYTES_AS: tl.constexpr, DOT_F16: tl.constexpr,
):
  """`scaled_ragged_m_kernel` on a persistent grid of NUM_PROGRAMS programs walking the
  (batch, slot, N tile) items branch-free, as ragged_dot's
  `ragged_m_persistent_kernel`: an unused slot or the rows in no group run zero K
  blocks (a zero tile, stored as zeros; an unused slot then stores nothing)."""
  lhs_ptr = _typed(lhs_ptr, A_BYTES_AS)
  rhs_ptr = _typed(rhs_ptr, B_BYTES_AS)
  # Plain constexpr arithmetic: triton 3.6 refused tl.cdiv's result in tl.range's bounds.
  TILES: tl.constexpr = S * ((N + BLOCK_N - 1) // BLOCK_N)
  for item in tl.range(tl.program_id(0), BATCH * TILES, NUM_PROGRAMS, flatten=True):
    batch = item // TILES
    slot, pid_n = grouped_tile(item % TILES, S * BLOCK_M, N, BLOCK_M, BLOCK_N, GROUP_M)
    table = tiles_ptr + batch * (3 * S) + slot
    group = tl.load(table)
    row_start = tl.load(table + S)
    row_end = tl.load(table + 2 * S)
    k_blocks = tl.where((group < G) & (row_start < row_end), K_BLOCKS, 0)
    acc = _scaled_tile(lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, batch,
                       tl.minimum(group, G - 1), row_start, pid_n, k_blocks, M, N, K, G,
                       RHS_STRIDE_K, RHS_STRIDE_N, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                       K_BLOCKS, N_BLOCKS, SCALE_BLOCK_SIZE, SCALE_KIND, INDEX_64, DOT_F16)
    # The rows in no group are zeros whatever the clamped group's scales hold (NaN, Inf).
    acc = tl.where(k_blocks > 0, acc, 0.0)
    _ragged_m_store(out_ptr, batch, row_start, row_end, pid_n, acc, M, N,
                    BLOCK_M, BLOCK_N, INDEX_64)


@triton.jit
def scaled_ragged_k_kernel(
    lhs_ptr, rhs_ptr, bounds_ptr, lhs_scale_ptr, rhs_scale_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, M_BLOCKS: tl.constexpr, SCALE_BLOCK_SIZE: tl.constexpr,
    SCALE_KIND: tl.constexpr, INDEX_64: tl.constexpr,
    A_BYTES_AS: tl.constexpr, B_BYTES_AS: tl.constexpr,
):
  """out[b, g] = scaled (lhs[b, rows of g]^T @ rhs[b, rows of g]): one (group, K x N
  tile, batch) per program; grid (G * tiles_k * tiles_n, B).

  lhs (B, M, K), rhs (B, M, N) row-major fp8; bounds (B, 2, G) int32; scales float32:
  SCALE_KIND "tensor" () and (), "block" (B, M_BLOCKS, K) and (B, M_BLOCKS, N), one per
  128 rows (SCALE_BLOCK_SIZE) of each column. The output tile is BLOCK_M (along K) x
  BLOCK_N; the group's rows run in 128-row blocks of the global grid, BLOCK_K rows a
  step (BLOCK_K divides 128). out (B, G, K, N); an empty group's tile is zeros, nothing
  read.
  """
  lhs_ptr = _typed(lhs_ptr, A_BYTES_AS)
  rhs_ptr = _typed(rhs_ptr, B_BYTES_AS)
  TILES: tl.constexpr = ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  pid = tl.program_id(0)
  batch = tl.program_id(1)
  group = pid // TILES
  pid_k, pid_n = grouped_tile(pid % TILES, K, N, BLOCK_M, BLOCK_N, GROUP_M)
  row_start = tl.load(bounds_ptr + batch * (2 * G) + group)
  row_end = tl.load(bounds_ptr + batch * (2 * G) + G + group)
  offs_k = pid_k * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  # Columns past K (N) wrap around: in bounds, never stored.
  offs_ak = offs_k % K
  offs_bn = offs_n % N
  offs_r = tl.arange(0, BLOCK_K)
  batch64 = tl.cast(batch, tl.int64)
  lhs_base = lhs_ptr + batch64 * (M * K)
  rhs_base = rhs_ptr + batch64 * (M * N)
  first_block = row_start // SCALE_BLOCK_SIZE
  m_blocks = tl.where(row_end > row_start,
                      (row_end + SCALE_BLOCK_SIZE - 1) // SCALE_BLOCK_SIZE - first_block, 0)
  STEPS: tl.constexpr = SCALE_BLOCK_SIZE // BLOCK_K
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for i in range(0, m_blocks):
    mb = first_block + i
    # The block's sum, from zero: at most 128 products deep.
    partial = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.static_range(STEPS):
      rows = mb * SCALE_BLOCK_SIZE + step * BLOCK_K + offs_r
      mine = (rows >= row_start) & (rows < row_end)   # other groups' rows: zeros
      # lhs^T tile (BLOCK_M of K, BLOCK_K rows): lhs read through swapped strides.
      a = tl.load(_ptrs(lhs_base, offs_ak, rows, 1, K, INDEX_64), mask=mine[None, :],
                  other=0.0)
      b = tl.load(_ptrs(rhs_base, rows, offs_bn, N, 1, INDEX_64), mask=mine[:, None],
                  other=0.0)
      partial = tl.dot(a.to(tl.float16), b.to(tl.float16), partial)
    # The promotion: an fp32 add (times the block's scales) per 128 rows.
    if SCALE_KIND == "block":
      sa = tl.load(lhs_scale_ptr + (batch64 * M_BLOCKS + mb) * K + offs_ak)
      sb = tl.load(rhs_scale_ptr + (batch64 * M_BLOCKS + mb) * N + offs_bn)
      acc += partial * (sa[:, None] * sb[None, :])
    else:
      acc += partial
  if SCALE_KIND == "tensor":
    acc = acc * (tl.load(lhs_scale_ptr) * tl.load(rhs_scale_ptr))
  acc = tl.where(m_blocks > 0, acc, 0.0)   # an empty group: zeros whatever the scales
  out_base = out_ptr + (batch64 * G + group) * (K * N)
  mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
  tl.store(_ptrs(out_base, offs_k, offs_n, N, 1, INDEX_64), acc.to(out_ptr.dtype.element_ty),
           mask=mask)


# ------------------------------------------------------------------ launches


def launch(problem, config, platform) -> triton_call.Launch:
  """The launch of `scaled_ragged_m_kernel` (config.persistent: `..._persistent_kernel`) for
  a `ScaledRaggedDotProblem`; its operands are (lhs, rhs, `schedule.row_tiles`,
  lhs_scale, rhs_scale), rhs (B, G, N, K) where config.rhs_k_major, else (B, G, K, N)."""
  slots = schedule.num_slots(problem.m, problem.groups, config.block_m, ROW_ALIGN)
  tiles_n = triton.cdiv(problem.n, config.block_n)
  rhs_stride_k, rhs_stride_n = (1, problem.k) if config.rhs_k_major else (problem.n, 1)
  # scaled.bytes_as reads an operand pair's dtypes as scaled_matmul's problem names them.
  pair = types.SimpleNamespace(dtype=problem.dtype, b_dtype=problem.rhs_dtype)
  out_shape = jax.ShapeDtypeStruct(problem.out_shape,
                                   scaled.stored_dtype(problem.out_dtype, platform))
  common = dict(
      M=problem.m, N=problem.n, K=problem.k, G=problem.groups, S=slots,
      RHS_STRIDE_K=rhs_stride_k, RHS_STRIDE_N=rhs_stride_n,
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, EVEN_K=problem.k % scaled.SCALE_BLOCK == 0,
      K_BLOCKS=triton.cdiv(problem.k, scaled.SCALE_BLOCK),
      N_BLOCKS=triton.cdiv(problem.n, scaled.SCALE_BLOCK),
      SCALE_BLOCK_SIZE=scaled.SCALE_BLOCK, SCALE_KIND=problem.scale_kind,
      INDEX_64=needs_index_64(problem), **scaled.bytes_as(pair, platform),
      DOT_F16=not config.rhs_k_major)
  if config.persistent:
    programs = min(num_sms(platform), problem.batch * slots * tiles_n)
    return triton_call.Launch.make(
        scaled_ragged_m_persistent_kernel, (programs,), out_shape,
        num_warps=config.num_warps, num_stages=config.num_stages, BATCH=problem.batch,
        NUM_PROGRAMS=programs, **common)
  return triton_call.Launch.make(
      scaled_ragged_m_kernel, (slots * tiles_n, problem.batch), out_shape,
      num_warps=config.num_warps, num_stages=config.num_stages, **common)


def ragged_k_launch(problem, config, platform) -> triton_call.Launch:
  """The launch of `scaled_ragged_k_kernel` for a ragged-K `ScaledRaggedDotProblem`; its
  operands are (lhs, rhs, group_bounds, lhs_scale, rhs_scale)."""
  tiles = triton.cdiv(problem.k, config.block_m) * triton.cdiv(problem.n, config.block_n)
  pair = types.SimpleNamespace(dtype=problem.dtype, b_dtype=problem.rhs_dtype)
  out_shape = jax.ShapeDtypeStruct(problem.out_shape,
                                   scaled.stored_dtype(problem.out_dtype, platform))
  return triton_call.Launch.make(
      scaled_ragged_k_kernel, (problem.groups * tiles, problem.batch), out_shape,
      num_warps=config.num_warps, num_stages=config.num_stages,
      M=problem.m, N=problem.n, K=problem.k, G=problem.groups,
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, M_BLOCKS=triton.cdiv(problem.m, scaled.SCALE_BLOCK),
      SCALE_BLOCK_SIZE=scaled.SCALE_BLOCK, SCALE_KIND=problem.scale_kind,
      INDEX_64=needs_index_64(problem), **scaled.bytes_as(pair, platform))


def scaled_ragged_dot(lhs, rhs, group_bounds, lhs_scale, rhs_scale, problem, config, platform):
  """The FP8 grouped GEMM of `problem` (a ScaledRaggedDotProblem) on its canonical operands.

  `group_bounds`: (B, 2, G), each group's [start, end) rows (`schedule.group_bounds`).
  The slot table is computed on the device from them (no host sync); with
  config.rhs_k_major the experts are transposed to (N, K) first (one pass over the
  weights, `transpose.transpose`), then one kernel runs.
  """
  if problem.is_empty:
    return jnp.zeros(problem.out_shape, problem.out_dtype)
  if problem.ragged_contracting:   # the bounds are the table
    lhs, rhs = scaled.kernel_operands(platform, lhs, rhs)
    out = triton_call.call(ragged_k_launch(problem, config, platform), lhs, rhs,
                           group_bounds, lhs_scale.astype(jnp.float32),
                           rhs_scale.astype(jnp.float32), platform=platform)
    return out.astype(problem.out_dtype)
  table = schedule.row_tiles(group_bounds, problem.m, config.block_m, ROW_ALIGN)
  if config.rhs_k_major:
    b, g, k, n = rhs.shape
    rhs = transpose.transpose(rhs.reshape(b * g, k, n), platform).reshape(b, g, n, k)
  lhs, rhs = scaled.kernel_operands(platform, lhs, rhs)
  lhs_scale, rhs_scale = lhs_scale.astype(jnp.float32), rhs_scale.astype(jnp.float32)  # e8m0
  out = triton_call.call(launch(problem, config, platform), lhs, rhs, table, lhs_scale,
                         rhs_scale, platform=platform)
  return out.astype(problem.out_dtype)   # a no-op but in the interpreter (`stored_dtype`)
