"""Where each group's rows are, and which tiles of rows a kernel runs: computed on the device.

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
static length `num_slots(m, groups, block_m)`. A slot is one (group,
block_m-aligned row tile) pair with rows [row_start, row_end): a tile that a
group boundary cuts in two is run twice, once per group, each run storing only
its own rows. The rows in no group form two pseudo-groups numbered G, which
the kernel stores as zeros without reading anything. Slots past the last
tile have row_start == row_end: the kernel returns at once. An empty group
gets no slot, so its weights are never read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Rows of the `row_tiles` table.
GROUP, ROW_START, ROW_END = 0, 1, 2


def num_slots(m: int, groups: int, block_m: int) -> int:
  """Static length of the slot axis: every row tile once, plus one per boundary that
  can cut a tile (G groups between two pseudo-groups have G + 1 boundaries)."""
  return -(-m // block_m) + groups + 1


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


def row_tiles(bounds: jax.Array, m: int, block_m: int) -> jax.Array:
  """(B, 3, num_slots) int32: each slot's group, first row and end row (module doc)."""
  batch, _, groups = bounds.shape
  zeros_before = jnp.zeros((batch, 1), jnp.int32)
  # Pseudo-groups: [0, first group's start) first, [last group's end, m) last.
  starts = jnp.concatenate([zeros_before, bounds[:, 0], bounds[:, 1, -1:]], axis=-1)
  ends = jnp.concatenate([bounds[:, 0, :1], bounds[:, 1],
                          jnp.full((batch, 1), m, jnp.int32)], axis=-1)      # (B, G + 2)
  labels = jnp.concatenate([jnp.array([groups]), jnp.arange(groups), jnp.array([groups])])
  first_tile = starts // block_m
  tiles = jnp.where(ends > starts, -(-ends // block_m) - first_tile, 0)
  slot_end = jnp.cumsum(tiles, axis=-1)                                         # inclusive
  slots = jnp.arange(num_slots(m, groups, block_m), dtype=jnp.int32)
  # The range of each slot: the first whose inclusive end exceeds it.
  index = jax.vmap(lambda e: jnp.searchsorted(e, slots, side="right"))(slot_end)
  valid = index < groups + 2
  index = jnp.minimum(index, groups + 1)
  take = lambda x: jnp.take_along_axis(x, index, axis=-1)
  tile = take(first_tile) + slots - (take(slot_end) - take(tiles))
  row_start = jnp.where(valid, jnp.maximum(tile * block_m, take(starts)), 0)
  row_end = jnp.where(valid, jnp.minimum((tile + 1) * block_m, take(ends)), 0)
  return jnp.stack([labels[index], row_start, row_end], axis=-2).astype(jnp.int32)
