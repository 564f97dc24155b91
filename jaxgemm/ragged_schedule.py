"""Where each group's rows are, and which tiles of rows a kernel runs: computed on the device.

The grouped GEMM's schedule: `jaxgemm.ops.ragged_dot` and its kernels
(`jaxgemm.kernels.*.ragged_dot`) both use it, so it sits below both.

`group_sizes` is a device array under jit (routing changes every step), so
neither the host nor the compiler knows which rows belong to which group. The
primitive carries each group's row range instead, `group_bounds` (B, 2, G)
int32 (first row, past-the-end row), and the kernels take small int32 tables
made from it by a few XLA ops right before the launch: no host sync, no
recompile when the sizes change. The groups' ranges are contiguous and in
order; the rows before the first group and after the last are in no group
(zeros in a ragged-M result). On one device the first group starts at row 0;
a device of an expert- or token-sharded call sees the ranges of its own
groups within its own rows (`local_bounds`).

`row_tiles` (ragged-M kernels) has one entry per *slot* of a grid axis of
static length `num_slots(m, groups, block_m, align)`: a tile of at most
block_m rows of one group, [row_start, row_end). Each group's tiles start at
its first row rounded down to `align` (1: anywhere, as Triton's masked loads
take; 8: a TMA box's row tile; block_m: a fixed grid of row tiles, where a
tile cut by a group boundary runs once per group), each storing only its own
rows, so a group of r rows runs about r / block_m tiles whatever its offset.
The rows in no group (before the first group, after the last) form two
pseudo-groups numbered G, which the kernel stores as zeros without reading
anything. Slots past the last tile have row_start == row_end: the kernel
returns at once. An empty group gets no slot, so its weights are never read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Rows of the `row_tiles` table.
GROUP, ROW_START, ROW_END = 0, 1, 2


def num_slots(m: int, groups: int, block_m: int, align: int = 1) -> int:
  """Static length of the slot axis: the G + 2 ranges (groups and the rows in none) of
  x rows each take ceil((x + align - 1) / block_m) tiles at most."""
  return max(1, (m + (groups + 2) * (block_m + align - 2)) // block_m)


def group_bounds(group_sizes: jax.Array, m: int) -> jax.Array:
  """(B, 2, G) int32 from (B, G) sizes: each group's first and end row, clamped to m
  as `lax.ragged_dot` clamps them (negative sizes count as empty)."""
  sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
  ends = jnp.minimum(jnp.cumsum(sizes, axis=-1), m)
  starts = jnp.concatenate([jnp.zeros_like(ends[..., :1]), ends[..., :-1]], axis=-1)
  return jnp.stack([starts, ends], axis=-2)


def local_bounds(bounds: jax.Array, first_group, groups: int, first_row, rows: int):
  """The bounds of groups [first_group, first_group + groups) within rows
  [first_row, first_row + rows), in local row numbers: one device's share of a
  sharded call (`first_group`, `first_row` may be traced: axis_index products)."""
  mine = jax.lax.dynamic_slice_in_dim(bounds, first_group, groups, axis=-1)
  return jnp.clip(mine - first_row, 0, rows).astype(jnp.int32)


def row_tiles(bounds: jax.Array, m: int, block_m: int, align: int = 1) -> jax.Array:
  """(B, 3, num_slots) int32: each slot's group, first row and end row (module doc).

  A few elementwise ops and sums over (slots x ranges), which XLA fuses into one
  or two small kernels: a cumsum and a searchsorted here took 25.5 us before a
  ~280 us grouped GEMM on the H100 (research/ragged_dot/triton_gpu.py at ead8d4f).
  """
  batch, _, groups = bounds.shape
  # The ranges: [0, first group's start), the G groups, [the groups' last end, m). The
  # last end is the largest, not the last group's: an unevenly sharded G pads a device's
  # groups with (0, 0), whose end would make the zero range all of [0, m) (rows written
  # twice, racing the groups' own tiles).
  starts = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), bounds[:, 0],
                            jnp.max(bounds[:, 1], axis=-1, keepdims=True)], axis=-1)
  ends = jnp.concatenate([bounds[:, 0, :1], bounds[:, 1],
                          jnp.full((batch, 1), m, jnp.int32)], axis=-1)
  labels = jnp.concatenate([jnp.array([groups]), jnp.arange(groups),
                            jnp.array([groups])]).astype(jnp.int32)
  base = starts - starts % align
  tiles = jnp.where(ends > starts, (ends - base + block_m - 1) // block_m, 0)
  r = jnp.arange(groups + 2)
  slot_end = jnp.sum(jnp.where(r[:, None] <= r[None, :], tiles[:, :, None], 0), axis=1)
  slots = jnp.arange(num_slots(m, groups, block_m, align), dtype=jnp.int32)
  # The range of each slot: how many ranges' inclusive slot ends are <= it.
  index = jnp.sum(slot_end[:, None, :] <= slots[None, :, None], axis=-1, dtype=jnp.int32)
  valid = index < groups + 2
  index = jnp.minimum(index, groups + 1)
  take = lambda x: jnp.take_along_axis(x, index, axis=-1)
  tile_start = take(base) + (slots[None, :] - (take(slot_end) - take(tiles))) * block_m
  row_start = jnp.where(valid, jnp.maximum(tile_start, take(starts)), 0)
  row_end = jnp.where(valid, jnp.minimum(tile_start + block_m, take(ends)), 0)
  return jnp.stack([labels[index], row_start, row_end], axis=-2).astype(jnp.int32)
