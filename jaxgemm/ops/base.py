"""What every op shares: its `Problem` (the static description of one call) and its `Op` record.

An op is one JAX primitive with its rules (`jaxgemm/ops/<op>/primitive.py`), a
public function (`api.py`), a `Problem` subclass (`problem.py`) and one
backend module per kernel family (`xla.py`, `triton.py`, `pallas.py`). The
op-independent machinery works on these two types only:

* `jaxgemm.registry` holds the `Op` records and the backends registered for each;
* `jaxgemm.dispatch` resolves a problem to a (backend, variant, config);
* `jaxgemm.tuning` finds an op's problems in a jaxpr (`Op.problem_of`), times
  candidates on random operands (`Op.example_operands`, `Op.call`) and stores
  winners in `jaxgemm.tuning_cache`, keyed by `Problem.cache_fields()` and
  `Problem.bucket()`.

A new op adds a folder under `jaxgemm/ops/` and registers its `Op`; nothing
here changes.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def fp32_precision(dtype, precision) -> str | None:
  """How fp32 operands are multiplied: "tf32", "tf32x3" or "ieee" (None if not fp32).

  The most precise of the two operands' precisions wins: DEFAULT is TF32
  tensor cores (jnp.matmul's default on GPU), HIGH is 3-pass TF32, HIGHEST
  exact fp32.
  """
  if np.dtype(dtype) != np.float32:
    return None
  precisions = precision or (lax.Precision.DEFAULT,)
  if lax.Precision.HIGHEST in precisions:
    return "ieee"
  if lax.Precision.HIGH in precisions:
    return "tf32x3"
  return "tf32"


def next_pow2(x: int) -> int:
  return 1 if x <= 1 else 1 << (x - 1).bit_length()


class Problem(abc.ABC):
  """The static description of one call of an op: shapes, dtypes, layout, precision.

  Subclasses are frozen dataclasses (hashable: they key tuning reports and
  caches). What the tuning cache needs of them is below; everything else is
  the op's own business.
  """

  op: ClassVar[str]
  dtype: np.dtype        # of the (floating) operands: what gradients exist for

  @property
  @abc.abstractmethod
  def dims(self) -> dict[str, int]:
    """The named sizes that tuning buckets and distances are measured in, e.g. {"m": 128, ...}."""

  @abc.abstractmethod
  def cache_fields(self) -> tuple[str, ...]:
    """What must match exactly for a tuned record to apply: dtypes, precision, layout."""

  @property
  @abc.abstractmethod
  def aligned(self) -> bool:
    """Whether every operand row is 16-byte aligned (TMA and vector loads need it)."""

  @property
  @abc.abstractmethod
  def flops(self) -> int: ...

  @property
  @abc.abstractmethod
  def min_bytes(self) -> int:
    """Bytes moved when each operand is read once and the output written once."""

  @property
  @abc.abstractmethod
  def accuracy_class(self) -> str:
    """The name tolerances are looked up by ("bfloat16", "tf32", "ieee", ...)."""

  @abc.abstractmethod
  def describe(self) -> str: ...

  @property
  def is_empty(self) -> bool:
    return 0 in self.dims.values()

  def shape_key(self) -> str:
    return "x".join(str(v) for v in self.dims.values())

  def bucket(self) -> str:
    """Each size rounded up to a power of two, plus alignment: records are shared within it."""
    sizes = ".".join(f"{k}{next_pow2(v)}" for k, v in self.dims.items())
    return f"{sizes}.{'a16' if self.aligned else 'unaligned'}"

  def distance(self, shape_key: str) -> float:
    """How far a tuned shape (`shape_key()` of another problem) is from this one, in log space."""
    dims = [int(x) for x in shape_key.split("x")]
    return sum(abs(math.log(max(a, 1) / max(b, 1))) for a, b in zip(dims, self.dims.values()))


@dataclasses.dataclass(frozen=True)
class Op:
  """An op as the op-independent machinery sees it (registered by the op's package).

  name: the op's name ("matmul"); keys backends, tuning records and suites.
  primitive: its JAX primitive.
  arity: how many operands the primitive takes, or problem -> that number
    (an epilogue's extra operands come and go with the problem).
  problem_of: (operand avals, primitive params) -> its Problem.
  call: (problem, operands, backend, variant, config) -> the primitive bound
    with that kernel choice (what the tuner compiles and times).
  example_operands: (problem, key) -> random operands for `call`.
  """

  name: str
  primitive: Any
  arity: int | Callable[[Problem], int]
  problem_of: Callable[[Sequence[Any], dict], Problem]
  call: Callable[..., jax.Array]
  example_operands: Callable[[Problem, jax.Array], list[jax.Array]]

  def arity_of(self, problem: Problem) -> int:
    return self.arity(problem) if callable(self.arity) else self.arity



def normal_operands(shapes_dtypes, key) -> list[jax.Array]:
  """Standard-normal operands drawn in float32 and rounded to each dtype (never zeros)."""
  keys = jax.random.split(key, len(shapes_dtypes))
  return [jax.random.normal(k, s, jnp.float32).astype(np.dtype(d))
          for k, (s, d) in zip(keys, shapes_dtypes)]
