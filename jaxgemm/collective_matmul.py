"""Collective matmuls: a sharded GEMM's all-gather or reduce-scatter run as a ring of
collective-permutes, one chunk per step, under the local GEMMs (issue 46).

Where `jaxgemm.sharding.plan` resolves a call by moving data over one mesh axis of n
devices, XLA would all-gather an operand before the GEMM, or reduce-scatter the partial
results after it, while no GEMM runs. A ring splits the move into n - 1 steps. Each
device computes with the chunk it holds while it sends that chunk (or its running sum)
to the next device. A permute and the GEMM beside it do not depend on each other, so
XLA's scheduler runs them at the same time (async collective-permute):

* `GatherRing`, all-gather + GEMM: the gathered operand's chunks go round the ring.
  - A chunk of a factor the result keeps (x's tokens, in Megatron's sequence
    parallelism: x on tokens, W1 on columns) gives the result's rows for that chunk.
  - A chunk of a contracted factor (FSDP: the weight sharded on K; the weight gradient
    of a sequence-parallel layer) gives a partial sum, added in float32 on the device.
* `ScatterRing`, GEMM + reduce-scatter: device j computes the partial result of one
  chunk at a time, adds the running sum it receives, and sends it on. After n - 1
  steps it holds its own chunk of the sum (W2's row-parallel GEMM into tokens).

The backward of one is the other: the gradient GEMMs are `matmul_p`s on the mesh too,
and `plan` gives each its own move, which a ring then runs. The fused ops (`fused_matmul`,
`glu`) take the same hook: each chunk is one kernel with its epilogue. Their K stays whole,
so only gather rings of kept factors apply to them.

`ring_for` is the hook an op hands to `sharding.make_partitionable` (`overlap=`); the
op's `overlap` param decides: True runs a ring wherever the plan moves data over one
axis; False and None (the default) never, since no ring has yet measured faster than
XLA's collectives on H100s (below, and docs/overlap.md).

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from jaxgemm import sharding
    >>> rule = sharding.EinsumRule.parse("m k, k n -> m n")
    >>> specs = [P("tp", None), P(None, "tp")]      # x on tokens, W1 on columns
    >>> types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((8192, 8192), (8192, 28672))]
    >>> p = sharding.plan(rule, specs, operand_types=types, axis_sizes={"tp": 4})
    >>> ring = ring_for(p, specs, types, {"tp": 4}, {"overlap": True})
    >>> type(ring).__name__, ring.operands, ring.result_dim
    ('GatherRing', (P('tp', None), P(None, 'tp')), 0)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxgemm import sharding

# What `overlap=None` does: no ring. None measured faster than XLA's collectives on H100s
# (research/overlap/ring_schedule.py; the Megatron-SP MLP at Llama-3-8B and 70B sizes,
# commit f2f08dd, wall clock of back-to-back calls; docs/overlap.md has the tables):
# - 2 GPUs: rings gathering x only ran the forward at 0.97-1.01x of XLA's program and the
#   forward + backward at 0.93-0.96x; every ring, 0.98-1.02x and 0.91-0.92x. The
#   timeline: the permute did run under the first chunk's GEMM (33.5 MB in 143 us; XLA's all-gather took 160 us), but splitting
#   the GEMM (+100 us at 70B) and placing the chunks' results (+63 us) took back what it
#   hid. A reduce-scatter ring lost outright: slicing the operand cost 55-58 us a step, and
#   its permute, launched beside the GEMM, took 529 us instead of 143 and slowed that
#   GEMM from 300 to 432 us.
# - 4 GPUs: XLA's dot merger joined the chunks' GEMMs (fixed since: `_apart`), and the
#   70B forward ran at 0.89x (gathers only) and 0.77x (every ring) of the same program
#   without rings. With `_apart` (commit 8560031), every ring: forward 3.956 ms against
#   XLA's 3.385, forward + backward 11.713 against 9.675 (0.86x, 0.83x).
# The rings stay available as overlap=True.


def check_overlap(overlap) -> None:
  """Raises for an `overlap=` argument other than None, True or False."""
  if overlap is not None and not isinstance(overlap, bool):
    raise TypeError(f"overlap={overlap!r} must be None (jaxgemm decides), True (a ring "
                    f"wherever the call moves data over one mesh axis) or False (never)")


def _ring_permute(size: int) -> list[tuple[int, int]]:
  """Device i sends to i + 1 (mod size)."""
  return [(i, (i + 1) % size) for i in range(size)]


def _slice(x, chunk, count: int, dim: int):
  """Chunk `chunk` (traced) of `count` equal chunks of x along `dim`."""
  length = x.shape[dim] // count
  return lax.dynamic_slice_in_dim(x, chunk * length, length, axis=dim)


def _apart(operands: list) -> list:
  """One step's operands, kept from being merged with another step's.

  The steps' GEMMs share an operand (W), so XLA's dot merger joins independent ones into
  one dot over their concatenated chunks, which then waits for every permute: on 4 x
  H100 (Llama-3-70B's MLP, commit f2f08dd) the merged ring ran its permutes one after
  another, 3.83 ms against 3.40 without a ring. An optimization barrier makes each step's
  operands values of their own (no copy)."""
  return list(lax.optimization_barrier(tuple(operands)))


@dataclasses.dataclass(frozen=True)
class GatherRing:
  """All-gather + GEMM: operand `operand`'s dimension `dim`, sharded on mesh axis `axis`
  (`size` devices), goes round the ring instead of being gathered first.

  operands: the shardings the operands keep (the gathered one keeps its own).
  result_dim: the result dimension the chunks' results fill, for a factor the result
    keeps; None for a contracted factor, whose chunks' results are summed.
  partners: (operand, dimension) of the other operands' share of the factor (a
    contracted factor's partner, a residual over the gathered rows): each step slices
    the chunk that meets the one it holds.
  """

  operands: tuple[P, ...]
  axis: str
  size: int
  operand: int
  dim: int
  result_dim: int | None
  partners: tuple[tuple[int, int], ...] = ()

  def run(self, local: Callable[[Sequence], Any], operands: Sequence,
          reduce: Callable[[Any], Any]):
    """The local result: `local` (the op on local operands) once per chunk, then the
    plan's own reduction over other axes (`reduce`)."""
    n, me = self.size, lax.axis_index(self.axis)
    held, result, dtypes = operands[self.operand], None, None
    for step in range(n):
      # Sent before this step's GEMM, which does not wait for it: the two overlap.
      coming = lax.ppermute(held, self.axis, _ring_permute(n)) if step < n - 1 else None
      source = (me - step) % n   # whose shard `held` is
      xs = list(operands)
      xs[self.operand] = held
      for op, dim in self.partners:
        xs[op] = _slice(operands[op], source, n, dim)
      out = local(_apart(xs))
      if self.result_dim is None:   # partial sums of a contracted factor, in float32
        dtypes = jax.tree.map(lambda o: o.dtype, out)
        out = jax.tree.map(lambda o: o.astype(jnp.promote_types(o.dtype, jnp.float32)), out)
        result = out if result is None else jax.tree.map(jnp.add, result, out)
      else:
        d = self.result_dim
        if result is None:
          result = jax.tree.map(
              lambda o: jnp.zeros((*o.shape[:d], o.shape[d] * n, *o.shape[d + 1:]), o.dtype),
              out)
        result = jax.tree.map(
            lambda r, o: lax.dynamic_update_slice_in_dim(r, o, source * o.shape[d], axis=d),
            result, out)
      held = coming
    if dtypes is not None:
      result = jax.tree.map(lambda r, t: r.astype(t), result, dtypes)
    return reduce(result)


@dataclasses.dataclass(frozen=True)
class ScatterRing:
  """GEMM + reduce-scatter: the partial results, summed over mesh axis `axis` (`size`
  devices) and scattered along `result_dim`, computed and passed one chunk at a time.

  sliced: (operand, dimension) of the operands' share of the result's `result_dim`
    factor: each step computes one chunk of it.
  """

  operands: tuple[P, ...]
  axis: str
  size: int
  result_dim: int
  sliced: tuple[tuple[int, int], ...]

  def run(self, local: Callable[[Sequence], Any], operands: Sequence,
          reduce: Callable[[Any], Any]):
    """The local result: device j's chunk of the sum, the plan's reduction done here."""
    del reduce   # the ring is the plan's reduction
    n, me = self.size, lax.axis_index(self.axis)
    total = None
    for step in range(n):
      # At step s, device j computes chunk j - s - 1 and adds what j - 1 summed of the
      # same chunk; after the last step (s = n - 1) it holds chunk j, summed over all.
      coming = (lax.ppermute(total, self.axis, _ring_permute(n))
                if total is not None else None)
      chunk = (me - step - 1) % n
      xs = list(operands)
      for op, dim in self.sliced:
        xs[op] = _slice(operands[op], chunk, n, dim)
      out = local(_apart(xs))
      total = out if coming is None else jax.tree.map(jnp.add, coming, out)
    return total


def _moved(the_plan, operand_specs) -> list[tuple[int, int, tuple, tuple]]:
  """(operand, dimension, its mesh axes as it comes, as the plan wants them) of every
  operand dimension the plan reshards."""
  out = []
  for i, (dims, spec, want) in enumerate(zip(the_plan.rule.operands, operand_specs,
                                             the_plan.operands)):
    for d, (have, need) in enumerate(zip(sharding.padded_spec(spec, len(dims)),
                                         sharding.padded_spec(want, len(dims)))):
      if sharding.axes_of(have) != sharding.axes_of(need):
        out.append((i, d, sharding.axes_of(have), sharding.axes_of(need)))
  return out


def _gather_ring(the_plan, operand_specs, operand_types, axis_sizes) -> GatherRing | None:
  """The ring for a plan that gathers one operand dimension over one mesh axis and
  moves nothing else; None for any other plan."""
  rule = the_plan.rule
  moved = _moved(the_plan, operand_specs)
  if len(moved) != 1:
    return None
  (op, dim, have, want), = moved
  factor = rule.operands[op][dim]
  axis = have[0] if len(have) == 1 else None
  if (axis is None or want or factor in rule.replicated or rule.more_results
      or axis in the_plan.reduce_axes):
    return None   # not one axis gathered whole
  n = axis_sizes[axis]
  if operand_types[op].shape[dim] % n:
    return None   # uneven shards: XLA's padding would go round the ring
  specs = list(the_plan.operands)
  specs[op] = operand_specs[op]
  # The other operands' share of the factor (a contracted one's partner; a fused
  # epilogue's residual over the gathered rows): each step slices the chunk it meets.
  partners = tuple((i, dims.index(factor)) for i, dims in enumerate(rule.operands)
                   if i != op and factor in dims)
  result_dim = rule.result.index(factor) if factor in rule.result else None
  return GatherRing(tuple(specs), axis, n, op, dim, result_dim, partners)


def _scatter_ring(the_plan, operand_specs, axis_sizes) -> ScatterRing | None:
  """The ring for a plan that reduce-scatters over one mesh axis and moves no operand."""
  rule = the_plan.rule
  if the_plan.scatter_dim is None or len(the_plan.reduce_axes) != 1 or rule.more_results:
    return None
  if _moved(the_plan, operand_specs):
    return None
  axis, = the_plan.reduce_axes
  factor = rule.result[the_plan.scatter_dim]
  sliced = tuple((i, dims.index(factor)) for i, dims in enumerate(rule.operands)
                 if factor in dims)
  if not sliced:
    return None
  # (The plan scatters only into dimensions that divide evenly.)
  return ScatterRing(the_plan.operands, axis, axis_sizes[axis], the_plan.scatter_dim, sliced)


def ring_for(the_plan, operand_specs: Sequence[P], operand_types: Sequence[Any],
             axis_sizes: Mapping[str, int], params: Mapping[str, Any]
             ) -> GatherRing | ScatterRing | None:
  """The ring that runs `the_plan`'s move under the local GEMMs, or None (no ring: XLA's
  collective before or after one local GEMM).

  operand_specs: the operands' shardings as they come (the plan's are what it wants).
  operand_types: the operands' GLOBAL shapes and dtypes.
  params: the op's params; `overlap` decides: True rings wherever it can, False and None
    (see the measurements above) never.
  """
  if params.get("overlap") is not True:
    return None
  return (_gather_ring(the_plan, operand_specs, operand_types, axis_sizes)
          or _scatter_ring(the_plan, operand_specs, axis_sizes))
