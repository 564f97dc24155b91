"""Where each group's rows are, and which tiles of rows a kernel runs: computed on the device.

`group_sizes` is a device array under jit (routing changes every step), so
neither the host nor the compiler knows which rows belong to which group. The
kernels take these small int32 tables instead, made by a few XLA ops right
before the launch (no host sync, no recompile when the sizes change):

* `group_bounds` (ragged-K kernels): each group's first and past-the-end row.
* `row_tiles` (ragged-M kernels): one entry per *slot* of a grid axis of
  static length `num_slots(m, groups, block_m)`. A slot is one
  (group, block_m-aligned row tile) pair with rows [row_start, row_end): a tile
  that a group boundary cuts in two is run twice, once per group, each run
  storing only its own rows. A last pseudo-group, number G, covers the rows
  past sum(group_sizes), which the kernel stores as zeros without reading
  anything. Slots past the last tile have row_start == row_end: the kernel
  returns at once. An empty group gets no slot, so its weights are never read.

Sizes are clamped as `lax.ragged_dot` does: a group's rows end at M.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Rows of the `row_tiles` table.
GROUP, ROW_START, ROW_END = 0, 1, 2


def num_slots(m: int, groups: int, block_m: int) -> int:
  """Static length of the slot axis: every row tile once, plus one per group boundary
  that can cut a tile (G groups and the tail pseudo-group have G inner boundaries)."""
  return -(-m // block_m) + groups


def group_bounds(group_sizes: jax.Array, m: int) -> jax.Array:
  """(B, 2, G) int32: [:, 0] each group's first row, [:, 1] its end, clamped to m."""
  sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
  ends = jnp.minimum(jnp.cumsum(sizes, axis=-1), m)
  starts = jnp.concatenate([jnp.zeros_like(ends[..., :1]), ends[..., :-1]], axis=-1)
  return jnp.stack([starts, ends], axis=-2)


def row_tiles(group_sizes: jax.Array, m: int, block_m: int) -> jax.Array:
  """(B, 3, num_slots) int32: each slot's group, first row and end row (see module doc)."""
  batch, groups = group_sizes.shape
  bounds = group_bounds(group_sizes, m)
  # The tail pseudo-group G: rows [sum(group_sizes), m), stored as zeros.
  starts = jnp.concatenate([bounds[:, 0], bounds[:, 1, -1:]], axis=-1)        # (B, G+1)
  ends = jnp.concatenate([bounds[:, 1], jnp.full((batch, 1), m, jnp.int32)], axis=-1)
  first_tile = starts // block_m
  tiles = jnp.where(ends > starts, -(-ends // block_m) - first_tile, 0)         # (B, G+1)
  slot_end = jnp.cumsum(tiles, axis=-1)                                        # inclusive
  slots = jnp.arange(num_slots(m, groups, block_m), dtype=jnp.int32)
  # The group of each slot: the first whose inclusive end exceeds it.
  group = jax.vmap(lambda e: jnp.searchsorted(e, slots, side="right"))(slot_end)
  valid = group <= groups
  group = jnp.minimum(group, groups).astype(jnp.int32)
  take = lambda x: jnp.take_along_axis(x, group, axis=-1)
  tile = take(first_tile) + slots - (take(slot_end) - take(tiles))
  row_start = jnp.maximum(tile * block_m, take(starts))
  row_end = jnp.minimum((tile + 1) * block_m, take(ends))
  row_start = jnp.where(valid, row_start, 0)
  row_end = jnp.where(valid, row_end, 0)
  return jnp.stack([group, row_start, row_end], axis=-2).astype(jnp.int32)
