"""The backend registry: what a backend is, and the one place backends are found.

A backend (`xla`, `triton`, `pallas`) is a :class:`Backend` subclass with a
config dataclass and a ladder of kernel variants. `matmul_p` asks the registry
for the backend named in its params and lowers to what the backend returns for
the platform (`cuda` for the GPU kernels, `cpu` for their interpreters).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm.config import KernelConfig

# An implementation takes the canonical operands, a: (B, M, K) (or (B, K, M)
# with trans_a) and b: (B, K, N) (or (B, N, K) with trans_b), and returns
# c: (B, M, N) of the problem's out_dtype. It runs inside a lowering rule, so
# it may use any JAX op (`jax_triton.triton_call`, `pl.pallas_call`, ...).
Impl = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class GemmProblem:
  """One canonical GEMM: C[b] = op(A[b]) @ op(B[b]), op = transpose if flagged."""

  batch: int
  m: int
  n: int
  k: int
  dtype: np.dtype        # of both operands
  out_dtype: np.dtype
  acc_dtype: np.dtype
  trans_a: bool = False
  trans_b: bool = False
  precision: tuple[lax.Precision, lax.Precision] | None = None

  @property
  def a_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.k, self.m) if self.trans_a else (self.batch, self.m, self.k)

  @property
  def b_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.n, self.k) if self.trans_b else (self.batch, self.k, self.n)

  @property
  def out_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.m, self.n)

  @property
  def is_empty(self) -> bool:
    return 0 in (self.batch, self.m, self.n, self.k)

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k

  @property
  def min_bytes(self) -> int:
    """Bytes moved when each operand is read once and the output written once."""
    elems_in = self.batch * (self.m * self.k + self.k * self.n)
    return (elems_in * np.dtype(self.dtype).itemsize
            + self.batch * self.m * self.n * np.dtype(self.out_dtype).itemsize)

  @property
  def fp32_precision(self) -> str | None:
    """How fp32 operands are multiplied: "tf32", "tf32x3" or "ieee" (None if not fp32).

    The most precise of the two operands' precisions wins: DEFAULT is TF32
    tensor cores (jnp.matmul's default on GPU), HIGH is 3-pass TF32, HIGHEST
    exact fp32.
    """
    if np.dtype(self.dtype) != np.float32:
      return None
    precisions = self.precision or (lax.Precision.DEFAULT,)
    if lax.Precision.HIGHEST in precisions:
      return "ieee"
    if lax.Precision.HIGH in precisions:
      return "tf32x3"
    return "tf32"

  def describe(self) -> str:
    t = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
    return (f"{self.batch}x({self.m}x{self.k} @ {self.k}x{self.n}) {t} "
            f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}")


class Backend(abc.ABC):
  """A family of GEMM kernels behind `matmul_p`.

  Subclasses set `name` and `config_cls` and list their `variants` in ladder
  order (simplest first; the last is the backend's best).
  """

  name: ClassVar[str]
  config_cls: ClassVar[type[KernelConfig]]
  variants: ClassVar[tuple[str, ...]]

  def unavailable_reason(self) -> str | None:
    """None when the backend can run here, else why not (e.g. a missing package)."""
    return None

  def default_variant(self, problem: GemmProblem) -> str:
    """The variant `variant=None` runs: by default the highest rung that takes `problem`."""
    for variant in reversed(self.variants):
      try:
        self.check(problem, variant, self.default_config(problem, variant))
      except NotImplementedError:
        continue
      return variant
    return self.variants[-1]  # its check raises the reason to the caller

  def tuning_candidates(self, problem: GemmProblem) -> list[tuple[str, KernelConfig]]:
    """(variant, config) pairs `jaxgemm.autotune` times on `problem`, most promising first.

    By default the heuristic choice alone; backends list the rungs and tiles
    worth a measurement (the autotuner skips those whose `check` refuses).
    """
    variant = self.default_variant(problem)
    return [(variant, self.default_config(problem, variant))]

  @abc.abstractmethod
  def check(self, problem: GemmProblem, variant: str, config: KernelConfig) -> None:
    """Raises if `variant` with `config` cannot run `problem`, before compiling.

    NotImplementedError for what the variant does not support (dtype,
    precision): `backend="auto"` falls through on it. ValueError for a config
    that cannot work for this problem (e.g. shared memory overflow).
    """

  @abc.abstractmethod
  def default_config(self, problem: GemmProblem, variant: str) -> KernelConfig:
    """A config that works for `problem` (tiles clamped to the problem)."""

  @abc.abstractmethod
  def impl(self, problem: GemmProblem, variant: str, config: KernelConfig,
           platform: str) -> Impl:
    """The implementation for `platform` ("cuda", or "cpu" for the interpreter)."""


_BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
  _BACKENDS[backend.name] = backend
  return backend


def get_backend(name: str) -> Backend:
  """The registered backend `name`; ValueError naming the valid ones otherwise."""
  if not isinstance(name, str) or name not in _BACKENDS:
    raise ValueError(f"unknown backend={name!r}; valid backends: "
                     f"{['auto', *_BACKENDS]}")
  return _BACKENDS[name]


def backends() -> tuple[str, ...]:
  """The backend names usable on this machine, in preference order.

  >>> import jaxgemm
  >>> jaxgemm.backends()[0]
  'xla'
  """
  return tuple(name for name, b in _BACKENDS.items() if b.unavailable_reason() is None)


def variants(backend: str) -> tuple[str, ...]:
  """`backend`'s kernel variants in ladder order (simplest first, best last).

  >>> import jaxgemm
  >>> jaxgemm.variants("xla")
  ('dot_general',)
  """
  return get_backend(backend).variants


def resolve_variant(backend: Backend, variant: str | None, problem: GemmProblem | None) -> str:
  if variant is None:
    return backend.default_variant(problem) if problem is not None else backend.variants[-1]
  if variant not in backend.variants:
    raise ValueError(f"unknown variant={variant!r} for backend={backend.name!r}; "
                     f"valid variants: {list(backend.variants)}")
  return variant


FLOAT_DTYPES = tuple(map(np.dtype, (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)))


def require_dtypes(problem: GemmProblem, what: str, supported) -> None:
  """NotImplementedError naming the dtype and what `what` supports."""
  supported = tuple(np.dtype(d) for d in supported)
  if np.dtype(problem.dtype) not in supported:
    names = [d.name for d in supported]
    raise NotImplementedError(
        f"{what} does not support dtype={np.dtype(problem.dtype).name}; "
        f"supported dtypes: {names}")
