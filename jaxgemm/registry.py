"""The registry: which ops exist, and which backends (with their variants) serve each.

It only holds; `jaxgemm.dispatch` decides which kernel runs a call.

A backend is a :class:`Backend` subclass for one op (`op = "matmul"`), with a
frozen config dataclass and a ladder of kernel variants, registered by the
op's package at import (`jaxgemm/ops/matmul/__init__.py`).
"""

from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm.config import KernelConfig
from jaxgemm.ops.base import Op, Problem

# An implementation takes the op's canonical operands and returns its output.
# It runs inside a lowering rule, so it may use any JAX op
# (`jax_triton.triton_call`, `pl.pallas_call`, ...).
Impl = Callable[..., jax.Array]

DEFAULT_OP = "matmul"


class Backend(abc.ABC):
  """A family of kernels for one op.

  Subclasses set `op`, `name` and `config_cls`, list their `variants` in ladder
  order (simplest first; the last is the backend's best), and name the modules
  whose code decides a tuned config's speed, per rung (`kernel_modules_of`: a
  change to their code, not their prose, makes that rung's tuning records stale).
  """

  op: ClassVar[str]
  name: ClassVar[str]
  config_cls: ClassVar[type[KernelConfig]]
  variants: ClassVar[tuple[str, ...]]
  # The modules whose code decides a tuned config's speed (`kernel_modules_of`):
  # `rung_package` holds one module per variant, named after it; `kernel_modules`
  # are what every rung runs beyond its own module.
  rung_package: ClassVar[str | None] = None
  kernel_modules: ClassVar[tuple[str, ...]] = ()

  def unavailable_reason(self) -> str | None:
    """None when the backend can run here, else why not (e.g. a missing package)."""
    return None

  def default_variant(self, problem: Problem) -> str:
    """The variant `variant=None` runs: by default the highest rung that takes `problem`."""
    for variant in reversed(self.variants):
      try:
        self.check(problem, variant, self.default_config(problem, variant))
      except NotImplementedError:
        continue
      return variant
    return self.variants[-1]  # its check raises the reason to the caller

  def for_platform(self, platform: str | None) -> "Backend":
    """This backend with its heuristics sized for the device that runs `platform`'s kernels.

    platform: a lowering platform ("cuda", "cpu"), or None for jax's default
    device. `dispatch.choose` calls `default_variant` / `default_config` on
    the result. By default the backend itself; a backend whose heuristic
    depends on the device (Triton's tiles by waves of SMs) returns a copy
    bound to it.
    """
    return self

  def structural_win(self, problem: Problem, device_kind: str) -> str | None:
    """Why this backend's heuristic choice beats XLA on `problem` with no tuning record.

    None (the default) where that is not known. `backend="auto"` runs the
    heuristic choice where a reason is given and nothing was tuned for the
    problem: backends give one only for problem classes measured to win on
    `device_kind`.
    """
    return None

  def tuning_candidates(self, problem: Problem) -> list[tuple[str, KernelConfig]]:
    """(variant, config) pairs `jaxgemm.autotune` times on `problem`, most promising first.

    By default the heuristic choice alone; backends list the rungs and tiles
    worth a measurement (the autotuner skips those whose `check` refuses).
    """
    variant = self.default_variant(problem)
    return [(variant, self.default_config(problem, variant))]

  def kernel_modules_of(self, variant: str) -> tuple[str, ...]:
    """The modules whose code decides the speed of `variant`'s tuned configs.

    By default the variant's module in `rung_package` (if set) and
    `kernel_modules`. `tuning_cache.kernel_version` hashes these and every
    module of `jaxgemm.kernels` they import, directly or not, so a module
    imported from the rung (a sibling rung, `common`) need not be listed; a
    backend lists here what runs beyond them (`jaxgemm.triton_call`, a layout
    pass its `impl` applies). Modules, not packages: a rung hashes only its own code.

    >>> import jaxgemm
    >>> from jaxgemm import registry
    >>> registry.get_backend("triton").kernel_modules_of("persistent")[0]
    'jaxgemm.kernels.triton.matmul.persistent'
    """
    if variant not in self.variants:
      raise ValueError(f"unknown variant={variant!r} for backend={self.name!r} of op="
                       f"{self.op!r}; valid variants: {list(self.variants)}")
    own = (f"{self.rung_package}.{variant}",) if self.rung_package else ()
    return own + tuple(self.kernel_modules)

  @abc.abstractmethod
  def check(self, problem: Problem, variant: str, config: KernelConfig) -> None:
    """Raises if `variant` with `config` cannot run `problem`, before compiling.

    NotImplementedError for what the variant does not support (dtype,
    precision): `backend="auto"` falls through on it. ValueError for a config
    that cannot work for this problem (e.g. shared memory overflow).
    """

  @abc.abstractmethod
  def default_config(self, problem: Problem, variant: str) -> KernelConfig:
    """A config that works for `problem` (tiles clamped to the problem)."""

  @abc.abstractmethod
  def impl(self, problem: Problem, variant: str, config: KernelConfig, platform: str) -> Impl:
    """The implementation for `platform` ("cuda", or "cpu" for the interpreter)."""


_OPS: dict[str, Op] = {}
_BACKENDS: dict[str, dict[str, Backend]] = {}


def register_op(op: Op) -> Op:
  _OPS[op.name] = op
  _BACKENDS.setdefault(op.name, {})
  return op


def register(backend: Backend) -> Backend:
  """Registers `backend` for its op; registration order is preference order."""
  _BACKENDS.setdefault(backend.op, {})[backend.name] = backend
  return backend


def ops() -> tuple[str, ...]:
  return tuple(_OPS)


def get_op(name: str) -> Op:
  if name not in _OPS:
    raise ValueError(f"unknown op={name!r}; valid ops: {list(_OPS)}")
  return _OPS[name]


def op_of_primitive(primitive: Any) -> Op | None:
  """The registered op whose primitive this is (None for any other primitive)."""
  return next((op for op in _OPS.values() if op.primitive is primitive), None)


def get_backend(name: str, op: str = DEFAULT_OP) -> Backend:
  """The backend `name` registered for `op`; ValueError naming the valid ones otherwise."""
  table = _BACKENDS.get(op, {})
  if not isinstance(name, str) or name not in table:
    raise ValueError(f"unknown backend={name!r}; valid backends: {['auto', *table]}")
  return table[name]


def backends(op: str = DEFAULT_OP) -> tuple[str, ...]:
  """The backend names usable for `op` on this machine, in preference order.

  >>> import jaxgemm
  >>> jaxgemm.backends()[0]
  'xla'
  """
  return tuple(name for name, b in _BACKENDS.get(op, {}).items()
               if b.unavailable_reason() is None)


def variants(backend: str, op: str = DEFAULT_OP) -> tuple[str, ...]:
  """`backend`'s kernel variants for `op` in ladder order (simplest first, best last).

  >>> import jaxgemm
  >>> jaxgemm.variants("xla")
  ('dot_general',)
  """
  return get_backend(backend, op).variants


FLOAT_DTYPES = tuple(map(np.dtype, (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)))


def require_dtypes(problem: Problem, what: str, supported) -> None:
  """NotImplementedError naming the dtype and what `what` supports."""
  supported = tuple(np.dtype(d) for d in supported)
  if np.dtype(problem.dtype) not in supported:
    names = [d.name for d in supported]
    raise NotImplementedError(
        f"{what} does not support dtype={np.dtype(problem.dtype).name}; "
        f"supported dtypes: {names}")
