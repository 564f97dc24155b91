"""Grouped GEMM (`ragged_dot`) on Triton: one kernel per mode, tiles mapped to groups on the GPU.

`group_sizes` is a device array, so which rows belong to which group is known
only when the kernel runs. The kernels take small int32 tables made by a few
XLA ops just before the launch from the groups' row ranges
(`jaxgemm.ragged_schedule.group_bounds`, (B, 2, G)):

* `ragged_m_kernel` (forward; the lhs gradient is the same kernel with the
  weights transposed): grid (num_group_slots * tiles_n, B). A slot is one
  tile of up to block_m rows of one group, [row_start, row_end), read from
  the (B, 3, S) `schedule.row_tiles` table: each group's tiles start at its own
  first row, so a group of r rows runs ceil(r / block_m) tiles (rows past
  row_end in a tile are the next group's: computed, not stored). The rows in
  no group (pseudo-group G) are stored as zeros, nothing read; unused slots
  return at once. An empty group has no slot, so its weights are never read.
  Programs walk `group_m` slots down each N column (the matmul's
  `grouped_tile` order), so adjacent programs share an expert's weight tile
  and a slot's rows while they are in L2. `ragged_m_persistent_kernel` walks
  the same items on one program per SM.
* `ragged_k_kernel` (weight gradient): out[b, g] = lhs[b, rows of g]^T @
  rhs[b, rows of g], (K, N) per group. Grid (G * tiles_k * tiles_n, B) (or
  persistent: `ragged_k_persistent_kernel`); each
  program reads its group's [start, end) from the (B, 2, G) `group_bounds`
  table and walks those rows in steps, masked at both ends (rows of the
  neighbouring groups load as zeros). The lhs tile is loaded transposed
  through its strides (no copy). An empty group stores zeros, reading nothing.
  Its tile names follow the GEMM it is: output tile BLOCK_M (along K) x
  BLOCK_N, reduction step BLOCK_K (along the ragged rows).

Every integer is a `tl.constexpr` (jaxgemm/triton_call.py says why). Offsets
of a whole operand block (batch, group) are int64 scalars; tile offsets are
int64 only when one matrix of an operand has 2^31 elements or more (INDEX_64).
"""

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from jaxgemm import ragged_schedule as schedule
from jaxgemm import triton_call
from jaxgemm.gemm import DEFAULT_NUM_SMS
from jaxgemm.kernels.triton.common import grouped_tile


@triton.jit
def _ptrs(base, offs_rows, offs_cols, ROW_STRIDE: tl.constexpr, COL_STRIDE: tl.constexpr,
          INDEX_64: tl.constexpr):
  """Pointers to a (rows, cols) tile of one matrix at `base` (int64 offsets if INDEX_64)."""
  if INDEX_64:
    offs_rows = offs_rows.to(tl.int64)
    offs_cols = offs_cols.to(tl.int64)
  return base + offs_rows[:, None] * ROW_STRIDE + offs_cols[None, :] * COL_STRIDE


@triton.jit
def _ragged_m_acc(
    lhs_ptr, rhs_ptr, batch, group, row_start, pid_n, k_iters,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    RHS_STRIDE_K: tl.constexpr, RHS_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """The fp32 tile lhs[batch, row_start + BLOCK_M rows] @ rhs[batch, group][:, N tile],
  over the first k_iters steps of K (0: a zero tile, nothing read)."""
  # Rows past M and columns past N wrap around instead of being masked: the
  # loads stay in bounds and unmasked, and those results are never stored.
  # Rows of the tile outside the slot's rows belong to other groups: computed
  # with this group's weights and discarded at the store.
  offs_am = (row_start + tl.arange(0, BLOCK_M)) % M
  offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  offs_k = tl.arange(0, BLOCK_K)
  lhs_base = lhs_ptr + tl.cast(batch, tl.int64) * (M * K)
  rhs_base = rhs_ptr + (tl.cast(batch, tl.int64) * G + group) * (K * N)
  a_ptrs = _ptrs(lhs_base, offs_am, offs_k, K, 1, INDEX_64)
  b_ptrs = _ptrs(rhs_base, offs_k, offs_bn, RHS_STRIDE_K, RHS_STRIDE_N, INDEX_64)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, k_iters):
    if EVEN_K:
      a = tl.load(a_ptrs)
      b = tl.load(b_ptrs)
    else:
      k_left = K - k * BLOCK_K
      a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
      b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    if UPCAST_OPERANDS:
      a = a.to(tl.float32)
      b = b.to(tl.float32)
    acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    a_ptrs += BLOCK_K
    b_ptrs += BLOCK_K * RHS_STRIDE_K
  return acc


@triton.jit
def _ragged_m_store(out_ptr, batch, row_start, row_end, pid_n, acc,
                    M: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr):
  """Stores acc's rows [row_start, row_end) (at most BLOCK_M, columns < N) to out[batch]."""
  offs_m = row_start + tl.arange(0, BLOCK_M)
  offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  out_base = out_ptr + tl.cast(batch, tl.int64) * (M * N)
  c_ptrs = _ptrs(out_base, offs_m, offs_n, N, 1, INDEX_64)
  mask = (offs_m[:, None] < row_end) & (offs_n[None, :] < N)
  tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def ragged_m_kernel(
    lhs_ptr, rhs_ptr, tiles_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr, S: tl.constexpr,
    RHS_STRIDE_K: tl.constexpr, RHS_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """out[b, rows of g] = lhs[b, rows of g] @ rhs[b, g]: one (slot, N tile, batch) per program.

  lhs (B, M, K) row-major; rhs (B, G, K, N) with strides (RHS_STRIDE_K,
  RHS_STRIDE_N) per (k, n) (swapped for (B, G, N, K)); tiles (B, 3, S) int32;
  out (B, M, N).
  """
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
    acc = _ragged_m_acc(lhs_ptr, rhs_ptr, batch, group, row_start, pid_n,
                        tl.cdiv(K, BLOCK_K), M, N, K, G, RHS_STRIDE_K, RHS_STRIDE_N,
                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST_OPERANDS, DOT_PRECISION,
                        INDEX_64)
  _ragged_m_store(out_ptr, batch, row_start, row_end, pid_n, acc, M, N,
                  BLOCK_M, BLOCK_N, INDEX_64)


@triton.jit
def ragged_m_persistent_kernel(
    lhs_ptr, rhs_ptr, tiles_ptr, out_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    G: tl.constexpr, S: tl.constexpr,
    RHS_STRIDE_K: tl.constexpr, RHS_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """`ragged_m_kernel` on a persistent grid of NUM_PROGRAMS programs walking the
  (batch, slot, N tile) work items, branch-free so that Triton can pipeline the
  next item's loads under this one's epilogue: an unused slot or the rows in no
  group run zero K steps (an unused slot then stores nothing)."""
  # Plain constexpr arithmetic: triton 3.6 refused tl.cdiv's result in tl.range's bounds.
  TILES: tl.constexpr = S * ((N + BLOCK_N - 1) // BLOCK_N)
  K_ITERS: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  for item in tl.range(tl.program_id(0), BATCH * TILES, NUM_PROGRAMS, flatten=True):
    batch = item // TILES
    slot, pid_n = grouped_tile(item % TILES, S * BLOCK_M, N, BLOCK_M, BLOCK_N, GROUP_M)
    table = tiles_ptr + batch * (3 * S) + slot
    group = tl.load(table)
    row_start = tl.load(table + S)
    row_end = tl.load(table + 2 * S)
    k_iters = tl.where((group < G) & (row_start < row_end), K_ITERS, 0)
    acc = _ragged_m_acc(lhs_ptr, rhs_ptr, batch, tl.minimum(group, G - 1), row_start,
                        pid_n, k_iters, M, N, K, G, RHS_STRIDE_K, RHS_STRIDE_N,
                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST_OPERANDS, DOT_PRECISION,
                        INDEX_64)
    _ragged_m_store(out_ptr, batch, row_start, row_end, pid_n, acc, M, N,
                    BLOCK_M, BLOCK_N, INDEX_64)


@triton.jit
def _ragged_k_tile(
    lhs_ptr, rhs_ptr, bounds_ptr, out_ptr, batch, group, pid_k, pid_n,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """out[batch, group][K tile pid_k, N tile pid_n] = lhs[rows]^T @ rhs[rows]."""
  row_start = tl.load(bounds_ptr + batch * (2 * G) + group)
  row_end = tl.load(bounds_ptr + batch * (2 * G) + G + group)
  offs_k = pid_k * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  # Columns past K (N) wrap around: in bounds, never stored.
  offs_ak = offs_k % K
  offs_bn = offs_n % N
  offs_r = tl.arange(0, BLOCK_K)
  lhs_base = lhs_ptr + tl.cast(batch, tl.int64) * (M * K)
  rhs_base = rhs_ptr + tl.cast(batch, tl.int64) * (M * N)
  # lhs^T tile (BLOCK_M of K, BLOCK_K rows): lhs read through swapped strides.
  a_ptrs = _ptrs(lhs_base, offs_ak, row_start + offs_r, 1, K, INDEX_64)
  b_ptrs = _ptrs(rhs_base, row_start + offs_r, offs_bn, N, 1, INDEX_64)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  rows = row_end - row_start
  for r in range(0, tl.cdiv(rows, BLOCK_K)):
    # Rows past the group's end are the next group's (or past M): zeros.
    rows_left = rows - r * BLOCK_K
    a = tl.load(a_ptrs, mask=offs_r[None, :] < rows_left, other=0.0)
    b = tl.load(b_ptrs, mask=offs_r[:, None] < rows_left, other=0.0)
    if UPCAST_OPERANDS:
      a = a.to(tl.float32)
      b = b.to(tl.float32)
    acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    a_ptrs += BLOCK_K * K
    b_ptrs += BLOCK_K * N
  out_base = out_ptr + (tl.cast(batch, tl.int64) * G + group) * (K * N)
  c_ptrs = _ptrs(out_base, offs_k, offs_n, N, 1, INDEX_64)
  mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
  tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def ragged_k_kernel(
    lhs_ptr, rhs_ptr, bounds_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """out[b, g] = lhs[b, rows of g]^T @ rhs[b, rows of g]: one (group, K x N tile, batch) each.

  lhs (B, M, K), rhs (B, M, N) row-major; bounds (B, 2, G) int32; out (B, G,
  K, N). The output tile is BLOCK_M (along K) x BLOCK_N, the reduction over
  the group's rows runs in BLOCK_K steps; an empty group runs none.
  """
  TILES: tl.constexpr = tl.cdiv(K, BLOCK_M) * tl.cdiv(N, BLOCK_N)
  pid = tl.program_id(0)
  pid_k, pid_n = grouped_tile(pid % TILES, K, N, BLOCK_M, BLOCK_N, GROUP_M)
  _ragged_k_tile(lhs_ptr, rhs_ptr, bounds_ptr, out_ptr, tl.program_id(1), pid // TILES,
                 pid_k, pid_n, M, N, K, G, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST_OPERANDS,
                 DOT_PRECISION, INDEX_64)


@triton.jit
def ragged_k_persistent_kernel(
    lhs_ptr, rhs_ptr, bounds_ptr, out_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """`ragged_k_kernel` on a persistent grid walking (batch, group, tile) items."""
  TILES: tl.constexpr = ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  for item in tl.range(tl.program_id(0), BATCH * G * TILES, NUM_PROGRAMS, flatten=True):
    pid_k, pid_n = grouped_tile(item % TILES, K, N, BLOCK_M, BLOCK_N, GROUP_M)
    _ragged_k_tile(lhs_ptr, rhs_ptr, bounds_ptr, out_ptr, item // (G * TILES),
                   (item // TILES) % G, pid_k, pid_n, M, N, K, G, BLOCK_M, BLOCK_N, BLOCK_K,
                   UPCAST_OPERANDS, DOT_PRECISION, INDEX_64)


# ------------------------------------------------------------------ launches


def needs_index_64(problem) -> bool:
  """Whether one matrix of an operand or of the output has 2^31 elements or more.

  Whole-block offsets (batch, group) are int64 in the kernels anyway.
  """
  m, k, n = problem.m, problem.k, problem.n
  return max(m * k, k * n, m * n) >= 2**31


def _dot_precision(problem) -> str:
  return problem.fp32_precision or "tf32"   # 16-bit operands ignore it


# Each group's row tiles start at its first row: masked loads take any row, so
# a group of r rows runs ceil(r / block_m) tiles (a G=64 layer with 256 rows per
# group on average: about 160 tiles of 128 rows where block_m-aligned tiles run 192).
ROW_ALIGN = 1


def num_sms(platform: str) -> int:
  """Streaming multiprocessors of the device (JAX's `core_count`; see the matmul's
  `persistent.num_sms` for why not Triton's driver)."""
  gpus = [d for d in jax.devices() if d.platform == "gpu"] if platform == "cuda" else []
  return (getattr(gpus[0], "core_count", None) if gpus else None) or DEFAULT_NUM_SMS


def ragged_m_launch(problem, config, platform) -> triton_call.Launch:
  """The launch of the ragged-M kernel; its operands are (lhs, rhs, `schedule.row_tiles`)."""
  slots = schedule.num_slots(problem.m, problem.groups, config.block_m, ROW_ALIGN)
  tiles_n = triton.cdiv(problem.n, config.block_n)
  rhs_stride_k, rhs_stride_n = (1, problem.k) if problem.trans_rhs else (problem.n, 1)
  common = dict(
      M=problem.m, N=problem.n, K=problem.k, G=problem.groups, S=slots,
      RHS_STRIDE_K=rhs_stride_k, RHS_STRIDE_N=rhs_stride_n,
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, EVEN_K=problem.k % config.block_k == 0,
      UPCAST_OPERANDS=triton_call.interpreting_bf16(problem.dtype, platform),
      DOT_PRECISION=_dot_precision(problem), INDEX_64=needs_index_64(problem))
  out_shape = jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype)
  if config.persistent:
    programs = min(num_sms(platform), problem.batch * slots * tiles_n)
    return triton_call.Launch.make(
        ragged_m_persistent_kernel, (programs,), out_shape, num_warps=config.num_warps,
        num_stages=config.num_stages, BATCH=problem.batch, NUM_PROGRAMS=programs, **common)
  return triton_call.Launch.make(
      ragged_m_kernel, (slots * tiles_n, problem.batch), out_shape,
      num_warps=config.num_warps, num_stages=config.num_stages, **common)


def ragged_k_launch(problem, config, platform) -> triton_call.Launch:
  """The launch of the ragged-K kernel; its operands are (lhs, rhs, group_bounds table)."""
  tiles = triton.cdiv(problem.k, config.block_m) * triton.cdiv(problem.n, config.block_n)
  common = dict(
      M=problem.m, N=problem.n, K=problem.k, G=problem.groups,
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m,
      UPCAST_OPERANDS=triton_call.interpreting_bf16(problem.dtype, platform),
      DOT_PRECISION=_dot_precision(problem), INDEX_64=needs_index_64(problem))
  out_shape = jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype)
  if config.persistent:
    programs = min(num_sms(platform), problem.batch * problem.groups * tiles)
    return triton_call.Launch.make(
        ragged_k_persistent_kernel, (programs,), out_shape, num_warps=config.num_warps,
        num_stages=config.num_stages, BATCH=problem.batch, NUM_PROGRAMS=programs, **common)
  return triton_call.Launch.make(
      ragged_k_kernel, (problem.groups * tiles, problem.batch), out_shape,
      num_warps=config.num_warps, num_stages=config.num_stages, **common)


def ragged_dot(lhs, rhs, group_bounds, problem, config, platform):
  """The grouped GEMM of `problem` (a RaggedDotProblem) on its canonical operands.

  `group_bounds`: (B, 2, G), each group's [start, end) rows (`schedule.group_bounds`).
  The slot table is computed on the device from them (no host sync), then one
  kernel runs. An empty problem launches nothing.
  """
  if problem.is_empty:
    return jnp.zeros(problem.out_shape, problem.out_dtype)
  if problem.ragged_contracting:
    table = group_bounds
    launch = ragged_k_launch(problem, config, platform)
  else:
    table = schedule.row_tiles(group_bounds, problem.m, config.block_m, ROW_ALIGN)
    launch = ragged_m_launch(problem, config, platform)
  return triton_call.call(launch, lhs, rhs, table, platform=platform)
