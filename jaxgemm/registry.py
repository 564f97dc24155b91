"""The registry: which ops exist, and which backends (with their variants) serve each.

It only holds; `jaxgemm.dispatch` decides which kernel runs a call.

A backend is a :class:`Backend` subclass for one op (`op = "matmul"`), with a
frozen config dataclass and a ladder of kernel variants, registered by the
op's package at import (`jaxgemm/ops/matmul/__init__.py`).

A registered backend is listed (`backends`) and can be named in a call only
where it can run: `why_unavailable` checks its `requirements()` (the modules
it imports, per platform) and its own `unavailable_reason()`, once per process.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import importlib.util
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


@dataclasses.dataclass(frozen=True)
class Requirement:
  """A module a backend imports to run its kernels, and what installs it.

  platforms: the `jax.default_backend()` values ("cpu", "gpu") that need the
  module; () for every platform. import_it: check by importing the module, for
  one whose own imports can fail (jax's Mosaic GPU imports absl-py, which jax
  does not depend on); otherwise the module is only looked up, which costs
  nothing (importing torch takes seconds).

  >>> Requirement("no_such_module", "an example", "pip install it").missing("cpu")
  'needs no_such_module (an example; pip install it): it is not installed'
  """

  module: str
  why: str
  install: str
  platforms: tuple[str, ...] = ()
  import_it: bool = False

  def missing(self, platform: str) -> str | None:
    """None where `platform` does not need the module or it is there, else why not."""
    if self.platforms and platform not in self.platforms:
      return None
    needs = f"needs {self.module} ({self.why}; {self.install})"
    try:
      if not self.import_it:
        return None if importlib.util.find_spec(self.module) else f"{needs}: it is not installed"
      importlib.import_module(self.module)
    except Exception as e:  # noqa: BLE001 (ImportError, or a package that breaks on import)
      return f"{needs}: importing it failed ({type(e).__name__}: {e})"
    return None


# What the backends of each name import to run, by platform. Every op's triton
# backend runs through jaxgemm.triton_call (on a GPU through jax-triton, on the
# CPU in Triton's interpreter on torch tensors), every pallas one through Mosaic
# GPU (compiled, or in its interpreter on the CPU). The extras named are those of
# pyproject.toml; README.md's install section says what each gives.
REQUIREMENTS: dict[str, tuple[Requirement, ...]] = {
    "triton": (
        Requirement("triton", "the Triton compiler and its CPU interpreter",
                    "pip install 'jaxgemm[triton]'"),
        Requirement("jax_triton", "launches the compiled kernels from JAX",
                    "pip install 'jaxgemm[triton]'", platforms=("gpu",)),
        Requirement("torch", "Triton's CPU interpreter keeps its tensors in torch",
                    "pip install 'jaxgemm[cpu]'", platforms=("cpu",)),
    ),
    "pallas": (
        Requirement("jax.experimental.pallas.mosaic_gpu",
                    "Mosaic GPU, the kernels' Pallas dialect and its CPU interpreter",
                    "pip install 'jaxgemm[pallas]' for absl-py, which it imports",
                    import_it=True),
    ),
}


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

  @classmethod
  def requirements(cls) -> tuple[Requirement, ...]:
    """The modules the backend imports to run: by default those of its name in
    `REQUIREMENTS` (every op's backend of a name runs through the same machinery)."""
    return REQUIREMENTS.get(cls.name, ())

  def unavailable_reason(self) -> str | None:
    """A check of the backend's own beyond `requirements()`: None when it can run
    here, else why not. Callers ask `why_unavailable`, which asks both."""
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


# type(backend) -> why_unavailable's answer: a process's packages and default
# platform do not change, and the checks import modules.
_UNAVAILABLE: dict[type[Backend], str | None] = {}


def why_unavailable(backend: Backend) -> str | None:
  """None when `backend` can run on this machine, else why not and what to install.

  Every one of its `requirements()` missing for jax's default platform (all
  at once: one install for all), else its own `unavailable_reason()`;
  computed once per backend class.

  >>> import jaxgemm
  >>> jaxgemm.registry.why_unavailable(jaxgemm.registry.get_backend("xla")) is None
  True
  """
  cls = type(backend)
  if cls not in _UNAVAILABLE:
    platform = jax.default_backend()
    missing = "; ".join(filter(None, (r.missing(platform) for r in backend.requirements())))
    _UNAVAILABLE[cls] = missing or backend.unavailable_reason()
  return _UNAVAILABLE[cls]


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

  A registered backend that cannot run here (`why_unavailable`: a package
  missing) is left out, so `backend="auto"` never considers it.

  >>> import jaxgemm
  >>> jaxgemm.backends()[0]
  'xla'
  """
  return tuple(name for name, b in _BACKENDS.get(op, {}).items()
               if why_unavailable(b) is None)


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
