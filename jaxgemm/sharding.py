"""Sharded ops: each op's primitive partitions like `lax.dot_general` under jit, by one rule.

An op declares how its dimensions relate, as an einsum over named factors
(matmul: ``"b m k, b k n -> b m n"``), and hands its kernel lowerings to
`make_partitionable`. From then on, under `jax.jit` on a mesh:

* every factor keeps the mesh axes its operand is sharded on, so no sharded
  operand is gathered: a factor of the result (batch, M, N) splits the
  problem into independent local problems, with no communication;
* where the operands' shardings conflict (M and N on one mesh axis: x on tokens
  and W on columns in Megatron's sequence parallelism), something must move,
  and the plan is the resolution that moves the fewest bytes, from the global
  shapes and dtypes (`plan`, `moved_bytes`): the smaller operand is gathered,
  as XLA's partitioner does (issue 44);
* a contracted factor (K) that is sharded leaves a partial result on each
  device: the mechanism adds one `psum` (all-reduce), or a `psum_scatter`
  (reduce-scatter) where the requested result is sharded on those axes;
* the kernel lowering runs on each device's LOCAL operands, so the kernel
  and its tiles are chosen for the local problem.

How: the op's primitive keeps all its rules (abstract eval, JVP, transpose,
batching: they never see any of this), and its lowering becomes a
`jax.experimental.custom_partitioning` call of a second primitive,
``<name>_local``, which carries the kernel lowerings. XLA's partitioner asks
the rule (Shardy: ``sharding_rule``; GSPMD: ``infer_sharding_from_operands``),
then calls `partition`, whose function binds ``<name>_local`` on the local
shards and adds the reduction `plan` asks for. On one device, and inside a
`shard_map` that is manual over every mesh axis, the local primitive is
lowered directly, on the whole (or per-shard) operands. On the CPU, where the kernel
backends run interpreted in a callback that jit's partitioned program cannot hold, a
mesh of several devices gets XLA under ``backend="auto"`` and a NotImplementedError for
a named kernel backend (`INTERPRETED_PLATFORM`).

    >>> import jax
    >>> from jax.sharding import PartitionSpec as P
    >>> from jaxgemm import sharding
    >>> rule = sharding.EinsumRule.parse("b m k, b k n -> b m n")
    >>> rule.reduction
    ('k',)
    >>> p = sharding.plan(rule, [P(None, None, "model"), P(None, "model", None)])
    >>> p.operands, p.result, p.reduce_axes
    ((P(None, None, 'model'), P(None, 'model', None)), P(None, None, None), ('model',))

What jax keeps private and this module needs is looked up in one place
(`_internal`), by name, with an error naming the jax version if it moved.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
import itertools
import math
import re
import threading
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgemm import dispatch

# ---------------------------------------------------------------- jax internals


def _internal(module: str, *names: str) -> Any:
  """A jax internal that has no public name, by the first of `names` that `module` has.

  Every internal the package relies on is looked up here, so a jax upgrade that
  moves one fails at import with its name, not deep inside a lowering.
  """
  mod = importlib.import_module(module)
  for name in names:
    if hasattr(mod, name):
      return getattr(mod, name)
  raise ImportError(f"jaxgemm.sharding needs {' or '.join(f'{module}.{n}' for n in names)}, "
                    f"which jax {jax.__version__} does not have (written against jax 0.10.2 "
                    f"and 0.11.2)")


# Primitives whose lowering needs the device assignment (custom_partitioning's
# does); without it jit lowers with none and it fails ("AssertionError: Please
# file a bug"). jax's own cuDNN GEMM wrapper registers itself the same way.
_REQUIRES_DEVICES: set = _internal("jax._src.dispatch", "prim_requires_devices_during_lowering")
# What lax.dot_general calls before binding: an operand that is invariant over
# a shard_map axis its partner varies over is cast with `pvary`, whose
# transpose is the psum the gradient of an invariant operand needs.
_INSERT_PVARY: Callable = _internal("jax._src.core", "auto_insert_reshard",
                                    "standard_insert_pvary")
# How jax's own lowerings constrain a result to the sharding in its type
# (Explicit mesh axes).
_CONSTRAIN_TO_TYPE: Callable = _internal("jax._src.interpreters.mlir",
                                         "lower_with_sharding_in_types")
# How lax and jnp read an `out_sharding=` argument (a PartitionSpec needs
# jax.set_mesh; Auto axes are refused), so ours raise the same errors.
_CANONICALIZE_SHARDING: Callable = _internal("jax._src.sharding_impls", "canonicalize_sharding")
# Batching rules that receive the vmapped axis's data (its explicit mesh axes).
AXIS_AWARE_BATCHERS: dict = _internal("jax._src.interpreters.batching",
                                      "fancy_primitive_batchers")


def insert_pvary(*operands):
  """The operands, each cast to vary over the shard_map axes any other one varies over.

  Call it in an op's bind, as `lax.dot_general` does: under `shard_map` with
  `check_vma=True`, a weight replicated across the data axis times a varying
  activation is then typed correctly, and its gradient is psum'd by `pvary`'s
  transpose. Outside `shard_map` it returns the operands unchanged.

  >>> import jax.numpy as jnp
  >>> a, b = insert_pvary(jnp.ones(2), jnp.ones(2))
  """
  return _INSERT_PVARY(*operands)


def canonical_out_sharding(out_sharding, api_name: str) -> NamedSharding | None:
  """An `out_sharding=` argument as jax's APIs take it: None, or a NamedSharding on
  the abstract mesh (a PartitionSpec is read against `jax.set_mesh`'s mesh).

  Raises what `jnp.matmul` raises for the same argument: a PartitionSpec outside
  `jax.set_mesh`, a mesh axis that is not Explicit, another type.

  >>> canonical_out_sharding(None, "matmul") is None
  True
  """
  return _CANONICALIZE_SHARDING(out_sharding, api_name)


def type_sharding(aval) -> NamedSharding | None:
  """The sharding in `aval`'s type, as an `out_sharding=` for a value stored as it is (a
  gradient GEMM's result, which takes its primal's, as `dot_general`'s transpose does);
  None where the type has no mesh (the GEMM's rule decides).

  >>> import jax.numpy as jnp
  >>> type_sharding(jax.typeof(jnp.ones(2))) is None
  True
  """
  return None if aval.sharding.mesh.empty else aval.sharding


def with_vmapped_dim(sharding: NamedSharding | None, axis_data, dim: int):
  """`sharding` (of a batched result) with the vmapped axis inserted at `dim`, sharded
  on the explicit mesh axes vmap maps it over (as jax's own batching rules do).

  For a batching rule registered in `AXIS_AWARE_BATCHERS`, which receives `axis_data`.
  """
  if sharding is None:
    return None
  axes = axis_data.explicit_mesh_axis   # None, or a tuple of Explicit mesh axis names
  entry = None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
  partitions = tuple(sharding.spec) + (None,) * max(0, dim - len(sharding.spec))
  return sharding.update(spec=sharding.spec.update(
      partitions=partitions[:dim] + (entry,) + partitions[dim:]))


def leading_dims_merged(sharding: NamedSharding, ndim: int) -> NamedSharding:
  """`sharding` (of an `ndim`-D array) for the array reshaped to 2-D, (-1, last): the
  leading dimensions' mesh axes on the merged rows, major first, as jax's reshape
  merges a dimension sharded ahead of unsharded ones.

  >>> mesh = jax.sharding.AbstractMesh((2, 4), ("x", "y"))
  >>> leading_dims_merged(NamedSharding(mesh, P("x")), 3).spec
  P('x', None)
  """
  *lead, last = padded_spec(sharding.spec, max(ndim, 1))
  return sharding.update(spec=P(_entry([a for entry in lead for a in axes_of(entry)]), last))


def split_dim(entry, count: int, size: int, axis_sizes: Mapping[str, int]) -> tuple:
  """The PartitionSpec entries of (count, size) for a dimension sharded as `entry` and
  reshaped into `count` blocks of `size`, keeping each device's elements where it is:
  as jax's reshape splits one dimension, the major axes on the count until it is used
  up, the rest on the block. (None, None) where an axis does not divide what it would
  shard (then the split moves data: that dimension is gathered).

  >>> split_dim(("x", "y"), 2, 128, {"x": 2, "y": 4})
  ('x', 'y')
  >>> split_dim("y", 2, 128, {"y": 4})
  (None, None)
  """
  axes = axes_of(entry)
  outer = []
  for axis in axes:
    if count == 1:
      break
    if count % axis_sizes[axis]:
      return None, None
    count //= axis_sizes[axis]
    outer.append(axis)
  inner = axes[len(outer):]
  if size % math.prod(axis_sizes[a] for a in inner):
    return None, None
  return _entry(outer), _entry(inner)


# ---------------------------------------------------------------- the rule

_FACTOR = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\Z")


@dataclasses.dataclass(frozen=True)
class EinsumRule:
  """How an op's dimensions relate: a factor name per dimension of each operand and
  of the result. A factor absent from the result is contracted (a reduction: a
  sharded one leaves partial results to be summed). `replicated` names factors
  the op cannot split at all (the partitioner gathers them), e.g. a K that an
  epilogue after the reduction needs whole.

  >>> rule = EinsumRule.parse("b m k, b k n -> b m n")
  >>> rule.operands, rule.result, rule.reduction
  ((('b', 'm', 'k'), ('b', 'k', 'n')), ('b', 'm', 'n'), ('k',))
  >>> str(EinsumRule.parse("m k, k n, n -> m n"))   # with a bias over N
  'm k, k n, n -> m n'
  >>> EinsumRule.parse("r c, -> r c, c r").results   # fp8 x and x^T, one scalar scale
  (('r', 'c'), ('c', 'r'))

  Results after the first (`more_results`) have dimensions of their own, as a
  cast-transpose's x^T; an op whose results all share the first's dimensions
  (a GEMM and its saved pre-activation) names just the first. A factor in results
  only (the scales' block counts of a block quantizer, sized by the op) must be
  `replicated`: no operand says how it would be sharded.

  >>> EinsumRule.parse("r c -> r c, r nc", replicated=("nc",)).reduction
  ()
  """

  operands: tuple[tuple[str, ...], ...]
  result: tuple[str, ...]
  replicated: tuple[str, ...] = ()
  more_results: tuple[tuple[str, ...], ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "operands", tuple(tuple(dims) for dims in self.operands))
    object.__setattr__(self, "result", tuple(self.result))
    object.__setattr__(self, "replicated", tuple(self.replicated))
    object.__setattr__(self, "more_results", tuple(tuple(dims) for dims in self.more_results))
    if not self.operands:
      raise ValueError(f"EinsumRule needs at least one operand; got operands={self.operands}")
    factors = set(self.factors)
    result_factors = {f for result in self.results for f in result}
    for name in factors | result_factors | set(self.replicated):
      if not isinstance(name, str) or not _FACTOR.match(name):
        raise ValueError(f"factor {name!r} must be an identifier (letters, digits, _)")
    for result in self.results:
      if missing := [f for f in result if f not in factors and f not in self.replicated]:
        raise ValueError(f"result factors {missing} must appear in an operand or be "
                         f"replicated; operands={self.operands}")
      if len(set(result)) != len(result):
        raise ValueError(f"result={result} must name each factor once")
    if self.more_results and self.reduction:
      raise ValueError(f"a rule with several results of their own dimensions reduces "
                       f"nothing; {self.reduction} are in no result")
    if unknown := [f for f in self.replicated if f not in factors | result_factors]:
      raise ValueError(f"replicated={self.replicated} must name the rule's factors; "
                       f"{unknown} are not among {sorted(factors | result_factors)}")

  @classmethod
  def parse(cls, text: str, replicated: Sequence[str] = ()) -> "EinsumRule":
    """From einsum-like text, factors separated by spaces: ``"b m k, b k n -> b m n"``."""
    if text.count("->") != 1:
      raise ValueError(f"rule text={text!r} must read 'operand, operand -> result'")
    lhs, rhs = text.split("->")
    first, *more = (tuple(part.split()) for part in rhs.split(","))
    return cls(tuple(tuple(part.split()) for part in lhs.split(",")), first,
               tuple(replicated), tuple(more))

  @property
  def factors(self) -> tuple[str, ...]:
    """Every factor, in order of first appearance in the operands."""
    return tuple(dict.fromkeys(f for dims in self.operands for f in dims))

  @property
  def results(self) -> tuple[tuple[str, ...], ...]:
    """Every result's factors: the first's, then `more_results`."""
    return (self.result, *self.more_results)

  @property
  def reduction(self) -> tuple[str, ...]:
    """The contracted factors: in an operand, in no result."""
    return tuple(f for f in self.factors if all(f not in r for r in self.results))

  def __str__(self):
    return (", ".join(" ".join(dims) for dims in self.operands) + " -> "
            + ", ".join(" ".join(dims) for dims in self.results))


def axes_of(entry) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
  if entry is None or entry is P.UNCONSTRAINED:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(axes: Sequence[str]):
  return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def padded_spec(spec, ndim: int) -> tuple:
  """`spec`'s entries, one per dimension of an `ndim`-D array (None for the missing tail).

  >>> padded_spec(P("x"), 3)
  ('x', None, None)
  """
  entries = tuple(spec) if spec is not None else ()
  return entries + (None,) * (ndim - len(entries))


@dataclasses.dataclass(frozen=True)
class Plan:
  """How one call runs on the mesh.

  factor_axes: the mesh axes that shard each factor (absent: replicated).
  scatter_dim: the result dimension a reduction is scattered into
    (reduce-scatter), or None (all-reduce, if anything is reduced).
  """

  rule: EinsumRule
  factor_axes: Mapping[str, tuple[str, ...]]
  scatter_dim: int | None = None

  def spec(self, dims: Sequence[str]) -> P:
    return P(*(_entry(self.factor_axes.get(f, ())) for f in dims))

  @property
  def operands(self) -> tuple[P, ...]:
    """The sharding each operand must have: what it had, less what conflicts."""
    return tuple(self.spec(dims) for dims in self.rule.operands)

  @property
  def result(self) -> P:
    """The local results' sharding, after the reduction."""
    spec = list(padded_spec(self.spec(self.rule.result), len(self.rule.result)))
    if self.scatter_dim is not None:
      spec[self.scatter_dim] = _entry(self.reduce_axes)
    return P(*spec)

  @property
  def results(self) -> tuple[P, ...]:
    """Every result's sharding: `result`, then those of the rule's `more_results`
    (which reduce nothing)."""
    return (self.result, *(self.spec(dims) for dims in self.rule.more_results))

  @property
  def reduce_axes(self) -> tuple[str, ...]:
    """The mesh axes the local results are summed over: those of the sharded reductions."""
    return tuple(a for f in self.rule.reduction for a in self.factor_axes.get(f, ()))


def plan(rule: EinsumRule, operand_specs: Sequence[P | None], result_spec: P | None = None,
         *, result_shape: Sequence[int] | None = None,
         axis_sizes: Mapping[str, int] | None = None,
         operand_types: Sequence[Any] | None = None, result_dtype: Any = None) -> Plan:
  """How to run `rule` on operands sharded as `operand_specs`.

  Where the operands' shardings agree, nothing sharded is gathered: each factor
  takes the mesh axes of the first operand dimension that shards it; a mesh axis
  shards one factor only. Factors in `rule.replicated` are not sharded. A sharded
  reduction factor leaves partial results: they are summed over its axes, and
  scattered (reduce-scatter) into the result dimension that `result_spec` shards
  on exactly those axes, if one does (and, when `result_shape` and `axis_sizes` are
  given, divides evenly). A result factor no operand shards takes the axes
  `result_spec` gives it, where they are free: the operands are then sliced
  locally, not communicated.

  Where they conflict (one mesh axis on two factors: x's tokens and W's columns on
  "tp"; or one factor on two axes), something must move. With `operand_types`
  (each operand's GLOBAL shape and dtype: arrays or jax.ShapeDtypeStruct) and
  `axis_sizes`, the plan is then the resolution that moves the fewest bytes
  (`moved_bytes`), as XLA's SPMD partitioner resolves a dot's; without them, the
  first operand's sharding wins and the other is resharded.

  >>> from jax.sharding import PartitionSpec as P
  >>> rule = EinsumRule.parse("m k, k n -> m n")
  >>> plan(rule, [P("d", None), P()]).result          # data parallel: rows split
  P('d', None)
  >>> p = plan(rule, [P(None, "d"), P("d", None)], P("d", None))   # K split, M out
  >>> p.reduce_axes, p.scatter_dim, p.result
  (('d',), 0, P('d', None))

  Sequence parallel into a column-parallel weight, both on "tp": x (8192, 8192) is
  smaller than W (8192, 28672), so x is gathered and W stays split:

  >>> import jax, jax.numpy as jnp
  >>> types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((8192, 8192), (8192, 28672))]
  >>> plan(rule, [P("tp", None), P(None, "tp")], operand_types=types,
  ...      axis_sizes={"tp": 4}).operands
  (P(None, None), P(None, 'tp'))
  """
  if len(operand_specs) != len(rule.operands):
    raise ValueError(f"operand_specs has {len(operand_specs)} entries; "
                     f"rule {rule} takes {len(rule.operands)} operands")
  if operand_types is not None and len(operand_types) != len(rule.operands):
    raise ValueError(f"operand_types has {len(operand_types)} entries; "
                     f"rule {rule} takes {len(rule.operands)} operands")
  first_wins = _first_operand_wins(rule, operand_specs, result_spec, result_shape, axis_sizes)
  if operand_types is None or axis_sizes is None or not _operands_conflict(rule, operand_specs):
    return first_wins
  # Issue 44: on 4 x H100 (commit c3e0863) the Megatron sequence-parallel MLP at
  # Llama-3-70B sizes (x (8192, 8192) on tokens over "tp", W1 (8192, 28672) on
  # columns over "tp") ran its forward in 4.57 ms with the first operand winning
  # (x kept, W1 gathered: 470 MB) against XLA's 3.35 ms (x gathered: 128 MB).
  # Every resolution that keeps the most devices busy is costed; the cheapest wins,
  # the first-operand plan on a tie.
  cost = functools.partial(moved_bytes, operand_specs=operand_specs,
                           operand_types=operand_types, result_spec=result_spec,
                           result_shape=result_shape, result_dtype=result_dtype,
                           axis_sizes=axis_sizes)
  candidates = [first_wins, *_resolutions(rule, operand_specs, result_spec, result_shape,
                                          axis_sizes)]
  devices_busy = lambda p: math.prod(axis_sizes[a] for axes in p.factor_axes.values()
                                     for a in axes)
  most = max(map(devices_busy, candidates))
  return min((p for p in candidates if devices_busy(p) == most), key=cost)


def _first_operand_wins(rule, operand_specs, result_spec, result_shape, axis_sizes) -> Plan:
  """The plan that keeps every operand sharding it can, operands in order: a mesh
  axis or a factor already taken drops a later operand's use of it."""
  factor_axes: dict[str, tuple[str, ...]] = {}
  used: set[str] = set()

  def claim(factor, axes):
    if axes and factor not in factor_axes and factor not in rule.replicated \
        and not used & set(axes):
      factor_axes[factor] = axes
      used.update(axes)

  for dims, spec in zip(rule.operands, operand_specs):
    for factor, entry in zip(dims, padded_spec(spec, len(dims))):
      claim(factor, axes_of(entry))

  reduce_axes = tuple(a for f in rule.reduction for a in factor_axes.get(f, ()))
  scatter_dims = _scatter_dims(rule, factor_axes, reduce_axes, result_spec, result_shape,
                               axis_sizes)
  scatter_dim = scatter_dims[0] if scatter_dims else None
  for dim, (factor, entry) in enumerate(zip(rule.result,
                                            padded_spec(result_spec, len(rule.result)))):
    if dim != scatter_dim:
      claim(factor, axes_of(entry))
  return Plan(rule, factor_axes, scatter_dim)


def _scatter_dims(rule, factor_axes, reduce_axes, result_spec, result_shape,
                  axis_sizes) -> list[int]:
  """The result dimensions a reduction over `reduce_axes` can be scattered into: those
  `result_spec` shards on exactly those axes, whose factor is not split, and that divide
  evenly (psum_scatter(tiled=True) needs equal pieces)."""
  if not reduce_axes:
    return []
  shards = math.prod(axis_sizes[a] for a in reduce_axes) if axis_sizes else 1
  return [dim for dim, (factor, entry) in enumerate(
              zip(rule.result, padded_spec(result_spec, len(rule.result))))
          if not factor_axes.get(factor) and axes_of(entry) == reduce_axes
          and (result_shape is None or result_shape[dim] % shards == 0)]


def _operand_claims(rule, operand_specs) -> list[tuple[str, tuple[str, ...]]]:
  """(factor, mesh axes) of every sharded operand dimension a factor may keep."""
  return [(factor, axes_of(entry))
          for dims, spec in zip(rule.operands, operand_specs)
          for factor, entry in zip(dims, padded_spec(spec, len(dims)))
          if axes_of(entry) and factor not in rule.replicated]


def _operands_conflict(rule, operand_specs) -> bool:
  """Whether the operands' shardings cannot all be kept: a mesh axis on two factors,
  or a factor on two different sets of axes."""
  axes_of_factor: dict[str, set] = {}
  factor_of_axis: dict[str, str] = {}
  for factor, axes in _operand_claims(rule, operand_specs):
    axes_of_factor.setdefault(factor, set()).add(axes)
    for axis in axes:
      if factor_of_axis.setdefault(axis, factor) != factor:
        return True
  return any(len(claims) > 1 for claims in axes_of_factor.values())


def _resolutions(rule, operand_specs, result_spec, result_shape, axis_sizes) -> Iterator[Plan]:
  """Every plan that gives each factor one of the axes an operand (or the result) shards
  it on, or a leading part of them (from ("x", "y"), ("x",): an all-gather over "y"),
  or none, with each mesh axis on one factor at most; with each way to reduce
  (all-reduce, or reduce-scatter into a dimension the result is wanted split on)."""
  claims = _operand_claims(rule, operand_specs) + [
      (factor, axes_of(entry))
      for factor, entry in zip(rule.result, padded_spec(result_spec, len(rule.result)))
      if axes_of(entry) and factor not in rule.replicated]
  options: dict[str, list[tuple[str, ...]]] = {}
  for factor, axes in claims:
    options.setdefault(factor, []).extend(axes[:n] for n in range(len(axes), 0, -1))
  factors = list(options)
  choices = [list(dict.fromkeys(options[f])) + [()] for f in factors]
  for picked in itertools.product(*choices):
    flat = [a for axes in picked for a in axes]
    if len(flat) != len(set(flat)):
      continue   # a mesh axis on two factors
    factor_axes = {f: axes for f, axes in zip(factors, picked) if axes}
    reduce_axes = tuple(a for f in rule.reduction for a in factor_axes.get(f, ()))
    for scatter_dim in [*_scatter_dims(rule, factor_axes, reduce_axes, result_spec,
                                       result_shape, axis_sizes), None]:
      yield Plan(rule, factor_axes, scatter_dim)


# ---------------------------------------------------------------- what a plan moves


def _itemsize(dtype) -> int:
  return np.dtype(dtype).itemsize


def reshard_bytes(shape: Sequence[int], itemsize: int, current: P | None, target: P | None,
                  axis_sizes: Mapping[str, int]) -> float:
  """Bytes one device sends to reshard an array of GLOBAL `shape` from `current` to
  `target` (ring collectives: an all-gather or all-to-all over n devices moves
  (n - 1) / n of its per-device result). Axes that leave the array are all-gathered;
  axes that move to another dimension, all-to-all'd; new axes are a local slice (free).

  >>> reshard_bytes((8192, 8192), 2, P("tp", None), P(), {"tp": 4}) / 2**20   # gather x
  96.0
  >>> reshard_bytes((64, 32), 4, P(None, "d"), P("d", None), {"d": 8})      # all-to-all
  896.0
  >>> reshard_bytes((64, 32), 4, P(), P("d", None), {"d": 8})               # slice
  0.0
  """
  ndim = len(shape)
  cur = [axes_of(e) for e in padded_spec(current, ndim)]
  new = {a: d for d, entry in enumerate(padded_spec(target, ndim)) for a in axes_of(entry)}
  kept = [a for d, axes in enumerate(cur) for a in axes if new.get(a) == d]
  moved = [a for d, axes in enumerate(cur) for a in axes if a in new and new[a] != d]
  gathered = [a for axes in cur for a in axes if a not in new]
  size = lambda axes: math.prod(axis_sizes[a] for a in axes)
  remaining = math.prod(shape) * itemsize / size(kept + moved)   # per device, once gathered
  moved_out = lambda axes: remaining * (size(axes) - 1) / size(axes)
  return (moved_out(gathered) if gathered else 0.0) + (moved_out(moved) if moved else 0.0)


def moved_bytes(candidate: Plan, *, operand_specs: Sequence[P | None],
                operand_types: Sequence[Any], axis_sizes: Mapping[str, int],
                result_spec: P | None = None, result_shape: Sequence[int] | None = None,
                result_dtype: Any = None) -> float:
  """Bytes one device sends to run `candidate`: its operands resharded from
  `operand_specs` to the plan's (`reshard_bytes`), the partial results reduced (ring
  all-reduce: 2 (n - 1) / n of the local result; reduce-scatter: half that), and the
  result resharded to `result_spec` where it is given. Computed from the GLOBAL shapes
  and dtypes (`operand_types`), so the same for every device.

  >>> import jax, jax.numpy as jnp
  >>> rule = EinsumRule.parse("m k, k n -> m n")
  >>> specs, types = [P(None, "d"), P("d", None)], [jax.ShapeDtypeStruct((64, 32), jnp.float32),
  ...                                                jax.ShapeDtypeStruct((32, 48), jnp.float32)]
  >>> moved_bytes(plan(rule, specs), operand_specs=specs, operand_types=types,
  ...             axis_sizes={"d": 8}, result_shape=(64, 48))   # one all-reduce of 64x48 f32
  21504.0
  """
  total = 0.0
  for dims, spec, typ in zip(candidate.rule.operands, operand_specs, operand_types):
    total += reshard_bytes(typ.shape, _itemsize(typ.dtype), spec, candidate.spec(dims),
                           axis_sizes)
  if result_shape is None:
    return total
  itemsize = _itemsize(result_dtype if result_dtype is not None else operand_types[0].dtype)
  if candidate.reduce_axes:
    shards = math.prod(axis_sizes[a] for f in candidate.rule.result
                       for a in candidate.factor_axes.get(f, ()))
    local = math.prod(result_shape) * itemsize / shards
    n = math.prod(axis_sizes[a] for a in candidate.reduce_axes)
    total += local * (n - 1) / n * (1 if candidate.scatter_dim is not None else 2)
  if result_spec is not None:
    total += reshard_bytes(result_shape, itemsize, candidate.result, result_spec, axis_sizes)
  return total


def shardy_rule(rule: EinsumRule, num_results: int = 1) -> tuple[str, dict]:
  """`rule` as custom_partitioning's `sharding_rule` callback returns it to Shardy.

  A factor may be in one of Shardy's sets only: one that is never sharded is
  "need replication", not also a reduction. An op with several results gives
  each the rule's result dimensions (a GEMM and its saved pre-activation),
  unless the rule names each result's own (`more_results`).

  >>> shardy_rule(EinsumRule.parse("m k, k n, s -> m n", replicated=("s",)))
  ('m k, k n, s -> m n', {'reduction_factors': ('k',), 'need_replication_factors': ('s',)})
  >>> shardy_rule(EinsumRule.parse("m k, k n -> m n"), num_results=2)[0]
  'm k, k n -> m n, m n'
  """
  text = str(rule)
  if rule.more_results:
    if num_results != len(rule.results):
      raise ValueError(f"rule {rule} has {len(rule.results)} results; the op has {num_results}")
  elif num_results > 1:
    lhs, result = text.split(" -> ")
    text = f"{lhs} -> {', '.join([result] * num_results)}"
  # Shardy numbers the factors as they appear, operands then results, and wants each
  # set in that order.
  order = list(dict.fromkeys(f for dims in (*rule.operands, *rule.results) for f in dims))
  return text, dict(
      reduction_factors=tuple(f for f in rule.reduction if f not in rule.replicated),
      need_replication_factors=tuple(sorted(rule.replicated, key=order.index)))


# ---------------------------------------------------------------- recording


@dataclasses.dataclass(frozen=True)
class LocalLowering:
  """One kernel lowering: the op, its operands' local shapes, and the problem they make."""

  op: str
  shapes: tuple[tuple[int, ...], ...]
  problem: Any   # the op's Problem (jaxgemm.ops.base.Problem)


_recorders: list[list[LocalLowering]] = []
_recorders_lock = threading.Lock()


@contextlib.contextmanager
def recording_local_problems() -> Iterator[list[LocalLowering]]:
  """Collects every kernel lowering of a partitionable op while the context is open:
  the local problem each device's kernel is chosen for.

  Lowering happens when a program is compiled (XLA's partitioner calls back for
  the local problems), and only once per program: compile inside the context.

  >>> import jax, jax.numpy as jnp, jaxgemm
  >>> with recording_local_problems() as seen:
  ...   _ = jax.jit(lambda a: jaxgemm.matmul(a, a, backend="xla")).lower(jnp.ones((4, 4))).compile()
  >>> [x.problem.describe() for x in seen]
  ['1x(4x4 @ 4x4) NN float32->float32']
  """
  seen: list[LocalLowering] = []
  with _recorders_lock:
    _recorders.append(seen)
  try:
    yield seen
  finally:
    with _recorders_lock:
      _recorders.remove(seen)


def _record(op_primitive, avals, params):
  if not _recorders:
    return
  from jaxgemm import registry  # noqa: PLC0415 (registry imports the ops; avoid the cycle)
  op = registry.op_of_primitive(op_primitive)
  problem = None if op is None else op.problem_of(avals, params)
  entry = LocalLowering(op_primitive.name, tuple(tuple(a.shape) for a in avals), problem)
  with _recorders_lock:
    for seen in _recorders:
      seen.append(entry)


# ---------------------------------------------------------------- compiled programs' collectives

# Here, not in the benchmark or the tests, because all three ask the same question of a
# compiled program ("does jaxgemm's move more than jnp's?"): the tests and the
# benchmark (bench/sharded.py) import it from the package they both import, and a user
# can ask it of their own program. The per-device bytes are read off the compiled HLO,
# so they count what XLA really emitted, not what `moved_bytes` estimates.
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# `%name = TYPE KIND(` or `KIND-start(`; `-done` ops and fusions named like one are not.
COLLECTIVE_OP = re.compile(r"=\s*(\S.*?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_ARRAY_TYPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "bf16": 16, "f16": 16, "s16": 16,
         "u16": 16, "f32": 32, "s32": 32, "u32": 32, "f64": 64, "s64": 64, "u64": 64,
         "c64": 64, "c128": 128}   # fp8 types (f8e4m3fn, ...): 8, the default


def _top_level(type_text: str) -> list[str]:
  """The elements of a tuple type, '(a, (b, c))' -> ['a', '(b, c)']; a non-tuple: itself."""
  text = type_text.strip()
  if not text.startswith("("):
    return [text]
  parts, depth, start = [], 0, 1
  for i, ch in enumerate(text):
    if ch in "([":
      depth += 1
    elif ch in ")]":
      depth -= 1
    if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
      parts.append(text[start:i].strip())
      start = i + 1
  return [p for p in parts if p]


def hlo_collectives(hlo: str) -> collections.Counter:
  """Counter of (kind, result type) of every collective in a compiled HLO text
  (`jax.jit(f).lower(...).compile().as_text()`), async `-start` ops included. An
  all-gather's or collective-permute's `-start` holds (operands, results, ...): its
  results are what is counted, as for the synchronous op.

  >>> hlo = "%ar = bf16[64,48]{1,0} all-reduce(%p), channel_id=1, to_apply=%add"
  >>> dict(hlo_collectives(hlo))
  {('all-reduce', 'bf16[64,48]'): 1}
  >>> dict(hlo_collectives("%s = (f32[8]{0}, f32[64]{0}) all-gather-start(%p)"))
  {('all-gather', 'f32[64]'): 1}
  """
  found = collections.Counter()
  for m in COLLECTIVE_OP.finditer(hlo):
    type_text = re.sub(r"\{[^}]*\}", "", m.group(1)).strip()
    if m.group(3) and m.group(2) in ("all-gather", "collective-permute"):
      elements = _top_level(type_text)
      type_text = elements[1] if len(elements) > 1 else type_text
    found[(m.group(2), type_text)] += 1
  return found


def _type_bytes(type_text: str) -> int:
  return sum(_BITS.get(dtype, 8) * math.prod(int(d) for d in dims.split(",") if d) // 8
             for dtype, dims in _ARRAY_TYPE.findall(type_text))


def collective_totals(found: collections.Counter) -> dict[str, tuple[int, int]]:
  """{kind: (ops, bytes of their results on one device)} of `hlo_collectives`' count:
  what two programs are compared by. XLA combines collectives into tuples and may lay a
  gradient out transposed, so the op lists of two equivalent programs can differ where
  the kinds and bytes do not.

  >>> collective_totals(hlo_collectives("%a = (f32[16,32]{1,0}, f32[]) all-reduce(%p, %q)"))
  {'all-reduce': (1, 2052)}
  """
  totals: dict[str, list[int]] = {}
  for (kind, type_text), n in found.items():
    t = totals.setdefault(kind, [0, 0])
    t[0] += n
    t[1] += n * _type_bytes(type_text)
  return {k: tuple(v) for k, v in sorted(totals.items())}


def collective_bytes(hlo: str) -> int:
  """The bytes of every collective's results on one device, all kinds together: the
  number to hold jaxgemm's program to jnp's (no more).

  >>> import jax, jax.numpy as jnp
  >>> collective_bytes(jax.jit(lambda a: a @ a).lower(jnp.ones((4, 4))).compile().as_text())
  0
  """
  return sum(b for _, b in collective_totals(hlo_collectives(hlo)).values())


# ---------------------------------------------------------------- the mechanism

# An op's hook to run its local problem: (bind_local, operands, params, plan) ->
# result. The default binds the local primitive; an op overrides it to compute
# what depends on the device's place in the mesh, e.g. a grouped GEMM's
# group_offset from lax.axis_index(plan.factor_axes["g"]).
LocalCall = Callable[[Callable[..., Any], Sequence[Any], dict, Plan], Any]


def _bind_local(bind_local, operands, params, plan):
  del plan
  return bind_local(*operands, **params)


# An op's hook to run its plan's move under its local GEMMs (`jaxgemm.collective_matmul`:
# a ring of collective-permutes): (plan, the operands' specs as they come, their global
# types, axis sizes, params) -> None (XLA's collective), or a ring with `operands` (the
# shardings the operands keep) and `run(local, operands, reduce)` (the local result, from
# `local` (the op on local operands) and `reduce` (the plan's reduction)).
Overlap = Callable[[Plan, Sequence[P], Sequence[Any], Mapping[str, int], Mapping[str, Any]],
                   Any]


def reduce_locally(the_plan: Plan, out):
  """The plan's reduction of the local results: a psum_scatter into the scatter
  dimension, else a psum over the reduced axes, else nothing."""
  if the_plan.scatter_dim is not None:
    return jax.tree.map(lambda x: lax.psum_scatter(
        x, the_plan.reduce_axes, scatter_dimension=the_plan.scatter_dim, tiled=True), out)
  return lax.psum(out, the_plan.reduce_axes) if the_plan.reduce_axes else out


def _global_params_dropped(params: Mapping[str, Any]) -> dict:
  """The params for the local call: `out_sharding` names the global result's type,
  which the local result (another shape, inside the partitioned program) does not have."""
  return {**params, "out_sharding": None} if "out_sharding" in params else dict(params)


def _is_partly_manual(axis_context) -> bool:
  """Inside a shard_map that is manual over some mesh axes only."""
  manual = getattr(axis_context, "manual_axes", None)   # SPMDAxisContext only
  return bool(manual) and set(manual) != set(axis_context.mesh.axis_names)


def _mesh_for_callbacks(axis_context):
  """The Mesh custom_partitioning should name its callbacks' shardings with, where
  it finds none itself, or None.

  It takes the abstract mesh jit found on a NamedSharding of a concrete Mesh
  (operands, results, constraints), else the mesh of `with mesh:`. A program
  whose only shardings are in types (numpy operands and an `out_sharding`, with
  Explicit axes) gives it neither, and its callbacks would get shardings without
  a spec. Then the context mesh (`jax.set_mesh`) on the program's devices is it.
  """
  devices = getattr(axis_context, "device_assignment", None)   # ShardingContext only
  mesh = jax.sharding.get_abstract_mesh()
  if getattr(axis_context, "abstract_mesh", 0) is None and devices and \
      not mesh.empty and mesh.size == len(devices):
    return jax.sharding.Mesh(np.array(devices).reshape(mesh.axis_sizes), mesh.axis_names)
  return None


@contextlib.contextmanager
def _entered(mesh):
  if mesh is None:
    yield
    return
  with warnings.catch_warnings():
    # "`with mesh:` is deprecated": custom_partitioning still reads it (0.10.2, 0.11.2).
    warnings.simplefilter("ignore", DeprecationWarning)
    with mesh:
      yield


def _spec_of(arg, what: str, *, unknown_is_replicated: bool = False) -> P:
  if arg.sharding is None and unknown_is_replicated:
    return P()
  spec = getattr(arg.sharding, "spec", None)
  if spec is None:
    raise RuntimeError(
        f"jaxgemm: the partitioner gave {what} the sharding {arg.sharding!r}, which names no "
        f"mesh axes. Run the program under `jax.set_mesh(mesh)` or shard its inputs with a "
        f"NamedSharding on a concrete Mesh.")
  return spec


def _zero_padding(x, dims: Sequence[str], factor_axes, factor_sizes, axis_sizes):
  """`x` with the padding of unevenly sharded reduction factors set to zero.

  XLA pads a dimension that does not divide among the devices, and what the
  padding holds is unspecified: summed over K, it would be added to the result
  (K=36 over 8 devices, operands computed on the shards: off by 1.0 unmasked).
  """
  for dim, factor in enumerate(dims):
    axes = factor_axes.get(factor, ())
    if not axes:
      continue
    shards = math.prod(axis_sizes[a] for a in axes)
    size = factor_sizes[factor]
    if size % shards == 0:
      continue
    local = x.shape[dim]
    start = lax.axis_index(axes if len(axes) > 1 else axes[0]) * local
    index = lax.broadcasted_iota(np.int32, x.shape, dim) + start
    x = lax.select(index < size, x, lax.full_like(x, 0))
  return x


# ---------------------------------------------------------------- interpreted kernels

# The platform whose kernel lowerings run a kernel backend (triton, pallas) in its
# interpreter, called back from the program (`jaxgemm.triton_call`,
# `jaxgemm.pallas_call`: a `jax.pure_callback`); only XLA's own ops compile there.
INTERPRETED_PLATFORM = "cpu"


def _mesh_without_callbacks(axis_context) -> str | None:
  """The mesh a kernel lowering is partitioned over where no callback can run in it,
  described ("8 cpu devices, mesh axes {'d': 8}"); None where callbacks run.

  jit over several devices lowers the kernel in custom_partitioning's `partition`, into
  a module of its own whose host callbacks no executable keeps: the program compiled and
  the process died of a segmentation fault when it ran (jax 0.10.2, 8 CPU devices, an
  M-sharded matmul). A shard_map manual over some mesh axes only refuses callbacks
  ("callbacks are only supported in spmd computations when all mesh axes are partitioned
  manually"). One device, and a shard_map manual over every axis (each device's own
  call), lower the kernel in place: there callbacks run.
  """
  manual = getattr(axis_context, "manual_axes", None)   # SPMDAxisContext (shard_map)
  if manual is not None:
    mesh = axis_context.mesh
    if set(manual) == set(mesh.axis_names) or mesh.size == 1:
      return None
    devices = getattr(mesh, "devices", None)   # None on an AbstractMesh
    kind = f"{devices.flat[0].platform} " if devices is not None else ""
    return (f"{mesh.size} {kind}devices, mesh axes {dict(mesh.shape)}, in a shard_map "
            f"manual over {sorted(manual)} only")
  devices = getattr(axis_context, "device_assignment", None)   # ShardingContext (jit)
  if not devices or len(devices) == 1:
    return None
  mesh = getattr(axis_context, "abstract_mesh", None) or jax.sharding.get_abstract_mesh()
  axes = (f", mesh axes {dict(mesh.shape)}" if not mesh.empty and mesh.size == len(devices)
          else "")
  return f"{len(devices)} {devices[0].platform} devices{axes}"


def _params_without_interpreter(primitive: Primitive, params: dict, mesh: str) -> dict:
  """`params` for a call whose kernel lowering cannot run an interpreted kernel (on
  `mesh`): backend="auto" becomes "xla" (XLA's op, which is what auto computes anyway);
  a named kernel backend, or an op with only a kernel (no `backend` param), raises."""
  backend = params.get("backend")
  if backend == dispatch.FALLBACK:
    return params
  if backend == dispatch.AUTO:
    return {**params, "backend": dispatch.FALLBACK}
  what = f"backend={backend!r}" if backend is not None else "its kernel"
  raise NotImplementedError(
      f"jaxgemm: {primitive.name} with {what} cannot run on {mesh}: on the CPU the kernel "
      f"runs in its interpreter, called back from the program (jax.pure_callback), and no "
      f"callback can run inside the partitioned program of a multi-device mesh (it crashed "
      f"the process). What works: backend='xla' or 'auto' (XLA's own op; 'auto' picks no "
      f"interpreted kernel on a CPU mesh), the kernel on one device, in a jax.shard_map "
      f"manual over every mesh axis (each device runs its own call), or on a GPU.")


def make_partitionable(primitive: Primitive, rule_of: Callable[..., EinsumRule],
                       kernel_lowerings: Mapping[str, Callable], *,
                       local_call: LocalCall = _bind_local,
                       overlap: Overlap | None = None) -> Primitive:
  """Make `primitive` partition by the rule `rule_of(**params)` returns; returns the
  local primitive that now carries `kernel_lowerings`.

  Args:
    primitive: the op's primitive, with its abstract eval (which should carry the
      result's sharding in its type, as `lax.dot_general`'s does) and its JVP,
      transpose and batching rules; they are untouched.
    rule_of: the op's params -> its `EinsumRule` (it may depend on them: a
      transpose flag permutes an operand's factors).
    kernel_lowerings: platform -> the op's kernel lowering rule, which chooses the
      kernel for the shapes it is given. They are registered on a new primitive,
      ``<name>_local``, and `primitive`'s lowering on each platform becomes the
      partitioned one.
    local_call: the op's hook to run its local problem (see `LocalCall`).
    overlap: the op's hook to hide its plan's collective under its local GEMMs
      (see `Overlap`); None: the collective runs before or after one local call.

  A param named ``out_sharding`` is taken to be the global result's sharding and
  is None in the local call.

  Example (what `jaxgemm/ops/matmul/primitive.py` does):

    matmul_local_p = make_partitionable(
        matmul_p, lambda *, trans_a, trans_b, **_: EinsumRule.parse(...),
        {"cpu": cpu_lowering, "cuda": cuda_lowering})
  """
  local_p = Primitive(primitive.name + "_local")
  local_p.multiple_results = primitive.multiple_results
  local_p.def_abstract_eval(lambda *avals, **params: primitive.abstract_eval(*avals, **params)[0])
  for platform, kernel_lowering in kernel_lowerings.items():
    def recorded(ctx, *operands, _kernel_lowering=kernel_lowering, **params):
      _record(primitive, ctx.avals_in, params)
      return _kernel_lowering(ctx, *operands, **params)
    mlir.register_lowering(local_p, recorded, platform=platform)

  def local(params, *operands):
    return local_p.bind(*operands, **dict(params))

  multiple = primitive.multiple_results
  # Several results (a GEMM and its saved pre-activation) share the rule's result
  # dimensions and the sharding the first one is given, unless the rule names
  # each one's own (`EinsumRule.more_results`: a cast-transpose's x^T).
  first = lambda results: results[0] if multiple else results

  def result_shardings(mesh, the_plan, count):
    if the_plan.rule.more_results:
      return [NamedSharding(mesh, spec) for spec in the_plan.results]
    result = NamedSharding(mesh, the_plan.result)
    return [result] * count if multiple else result

  def partition(params, mesh, arg_shapes, result_shape):
    params = dict(params)
    rule = rule_of(**params)
    # The global shapes and dtypes: where the operands' shardings conflict, the plan
    # moves the fewest bytes (`plan`).
    operand_specs = [_spec_of(x, f"operand {i}") for i, x in enumerate(arg_shapes)]
    the_plan = plan(rule, operand_specs, _spec_of(first(result_shape), "the result"),
                    result_shape=first(result_shape).shape, axis_sizes=dict(mesh.shape),
                    operand_types=arg_shapes, result_dtype=first(result_shape).dtype)
    factor_sizes = {f: x.shape[d] for dims, x in zip(rule.operands, arg_shapes)
                    for d, f in enumerate(dims)}
    local_params = _global_params_dropped(params)
    ring = None if overlap is None else overlap(the_plan, operand_specs, arg_shapes,
                                                dict(mesh.shape), params)

    def lower_fn(*operands):   # on each device's shards
      operands = [_zero_padding(x, dims, the_plan.factor_axes, factor_sizes, dict(mesh.shape))
                  if set(dims) & set(rule.reduction) else x
                  for x, dims in zip(operands, rule.operands)]
      local = lambda xs: local_call(local_p.bind, xs, local_params, the_plan)
      if ring is not None:
        return ring.run(local, operands, functools.partial(reduce_locally, the_plan))
      return reduce_locally(the_plan, local(operands))

    kept = the_plan.operands if ring is None else ring.operands
    return (mesh, lower_fn, result_shardings(mesh, the_plan, len(result_shape) if multiple else 1),
            tuple(NamedSharding(mesh, s) for s in kept))

  def infer_sharding_from_operands(params, mesh, arg_shapes, result_shape):   # GSPMD
    # GSPMD asks before it has propagated a sharding to every operand (one computed
    # in the program from constants: ragged_dot's group bounds); the known ones decide.
    the_plan = plan(rule_of(**dict(params)),
                    [_spec_of(x, f"operand {i}", unknown_is_replicated=True)
                     for i, x in enumerate(arg_shapes)],
                    result_shape=first(result_shape).shape, axis_sizes=dict(mesh.shape),
                    operand_types=arg_shapes, result_dtype=first(result_shape).dtype)
    return result_shardings(mesh, the_plan, len(result_shape) if multiple else 1)

  def sharding_rule(params, mesh, operand_types, result_types):   # Shardy
    return shardy_rule(rule_of(**dict(params)), len(result_types) if multiple else 1)

  partitioned = custom_partitioning(local, static_argnums=(0,))
  partitioned.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                            sharding_rule=sharding_rule)

  def lowering_on(platform):
    def lowering(ctx, *operands, **params):
      axis_context = ctx.module_context.axis_context
      if platform == INTERPRETED_PLATFORM:
        # Where the kernel lowering will run, before the partitioner calls it.
        if (mesh := _mesh_without_callbacks(axis_context)) is not None:
          params = _params_without_interpreter(primitive, params, mesh)
      if _is_partly_manual(axis_context):
        # A shard_map manual over some axes only: shardings returned without the
        # manual subgroup abort XLA ("Check failed: ... IsManualSubgroup()"), so
        # the kernel runs on what the partitioner gives it (auto axes gathered).
        return mlir.lower_fun(local_p.bind, multiple_results=local_p.multiple_results)(
            ctx, *operands, **params)
      static = tuple(sorted(params.items()))
      call = lambda *xs: partitioned(static, *xs)
      with _entered(_mesh_for_callbacks(axis_context)):
        outs = mlir.lower_fun(call, multiple_results=primitive.multiple_results)(ctx, *operands)
      # As jax's own lowerings do: with Explicit axes, the result keeps its type's sharding.
      return [_CONSTRAIN_TO_TYPE(ctx, out, aval) for out, aval in zip(outs, ctx.avals_out)]
    return lowering

  for platform in kernel_lowerings:
    mlir.register_lowering(primitive, lowering_on(platform), platform=platform)
  _REQUIRES_DEVICES.add(primitive)
  return local_p
