"""Index math shared by the Triton kernels."""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(tile_id, M: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
  """(pid_m, pid_n) of `tile_id`, walking GROUP_M tile-rows column by column.

  Consecutive programs then share B's column tiles and A's row tiles while they
  are in L2 (GROUP_M=1 is plain row-major order).
  """
  tiles_m = tl.cdiv(M, BLOCK_M)
  tiles_n = tl.cdiv(N, BLOCK_N)
  tiles_per_group = GROUP_M * tiles_n
  first_m = (tile_id // tiles_per_group) * GROUP_M
  group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
  pid_m = first_m + (tile_id % tiles_per_group) % group_rows
  pid_n = (tile_id % tiles_per_group) // group_rows
  return pid_m, pid_n


@triton.jit
def tile_ptrs(base, batch, offs_rows, offs_cols, BATCH_STRIDE: tl.constexpr,
              ROW_STRIDE: tl.constexpr, COL_STRIDE: tl.constexpr, INDEX_64: tl.constexpr):
  """Pointers to a (rows, cols) tile of a batched operand with constexpr strides.

  A transposed operand is the same tile with its strides swapped, so kernels
  need no transpose logic; a unit stride is a constexpr 1, which is what lets
  Triton vectorize along it. Offsets are int64 when an operand has 2^31
  elements or more (INDEX_64): int32 index math would wrap.
  """
  if INDEX_64:
    batch = batch.to(tl.int64)
    offs_rows = offs_rows.to(tl.int64)
    offs_cols = offs_cols.to(tl.int64)
  return (base + batch * BATCH_STRIDE + offs_rows[:, None] * ROW_STRIDE
          + offs_cols[None, :] * COL_STRIDE)


@triton.jit
def store_tile(c_ptr, batch, offs_m, offs_n, tile, M: tl.constexpr, N: tl.constexpr,
               INDEX_64: tl.constexpr):
  """Stores a (BLOCK_M, BLOCK_N) tile of C (B, M, N), masking the ragged edges."""
  mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
  ptrs = tile_ptrs(c_ptr, batch, offs_m, offs_n, M * N, N, 1, INDEX_64)
  tl.store(ptrs, tile.to(c_ptr.dtype.element_ty), mask=mask)
