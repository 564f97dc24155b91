"""Which kernel runs a problem: the one place `backend`, `variant` and `config` are resolved.

For a named backend, the config is, in this order:

1. the caller's explicit ``config=`` (with ``variant=`` or the backend's
   heuristic variant);
2. the on-disk tuning cache (`jaxgemm.autotune` writes it; see
   `jaxgemm.tuning_cache` for where it lives);
3. the table shipped in the package for this device kind
   (``jaxgemm/tables/nvidia-h200.json``, made by this project's tuning run);
4. the backend's heuristic (`Backend.default_variant` / `default_config`:
   measured defaults with tiles clamped to the problem).

With ``variant=None`` steps 2 and 3 also choose the variant: the backend's
fastest tuned one. ``backend="auto"`` looks at the tuned records of every
backend for the problem and runs the fastest, if it beat XLA's dot by at least
`AUTO_MARGIN` in its tuning run (against the XLA program a user may get:
`jaxgemm.tuning.XLA_PICK_SPREAD`); otherwise, and for any problem nothing was
tuned for (or on a device kind without a table), it runs XLA's dot.

Resolution happens per problem, so the backward GEMMs of a gradient (other
shapes, other layouts) each get their own choice. Nothing is tuned here.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from jaxgemm import registry, tuning_cache
from jaxgemm.config import KernelConfig
from jaxgemm.registry import GemmProblem

AUTO = "auto"
# A tuned kernel replaces XLA's dot under backend="auto" only if it was at
# least this much faster in its tuning run: closer than that, the two swap
# places between runs, and XLA is the safer pick.
AUTO_MARGIN = 1.01
FALLBACK = "xla"


@dataclasses.dataclass(frozen=True)
class Choice:
  """A resolved kernel, and where the choice came from."""

  backend: str
  variant: str
  config: KernelConfig
  source: str   # "explicit", "cache", "table", "heuristic" or "fallback"

  def describe(self) -> str:
    return f"{self.backend}/{self.variant} ({self.source}) {self.config.to_json()}"


@functools.cache
def device_kind(platform: str | None = None) -> str:
  """The device kind tuned records are keyed by ("NVIDIA H200"; "cpu" on the host).

  platform: a lowering platform ("cuda", "cpu"), or None for jax's default device.
  """
  devices = jax.devices({"cuda": "gpu"}.get(platform, platform))
  return devices[0].device_kind


def _usable(problem: GemmProblem, backend: registry.Backend, variant: str,
            config: KernelConfig) -> bool:
  try:
    backend.check(problem, variant, config)
  except (NotImplementedError, ValueError, TypeError):
    return False
  return True


def _tuned(problem: GemmProblem, kind: str, backend: str | None,
           variant: str | None) -> list[tuple[float, Choice]]:
  """(speedup over XLA in tuning, Choice) of the usable tuned records, fastest first."""
  out = []
  for t in tuning_cache.lookup(problem, kind, backend):
    if variant is not None and t.variant != variant:
      continue
    try:
      b = registry.get_backend(t.backend)
    except ValueError:
      continue
    if b.unavailable_reason() is not None or t.variant not in b.variants:
      continue
    try:
      config = b.config_cls.from_dict(t.config)
    except (TypeError, ValueError):
      continue   # a config field that no longer exists, or no longer valid
    if _usable(problem, b, t.variant, config):
      out.append((t.speedup_vs_xla, Choice(t.backend, t.variant, config, t.source)))
  out.sort(key=lambda sc: -sc[0])
  return out


def choose(problem: GemmProblem, backend: str = AUTO, variant: str | None = None,
           config: KernelConfig | None = None, *, platform: str | None = None) -> Choice:
  """The kernel that runs `problem` (see the module docstring for the order).

  Raises what the backend's `check` raises when an explicit choice cannot run
  the problem (NotImplementedError for unsupported features, ValueError for a
  config that cannot work).

  >>> import numpy as np, jaxgemm
  >>> from jaxgemm.dispatch import choose
  >>> p = jaxgemm.GemmProblem(1, 64, 64, 64, np.dtype("float32"), np.dtype("float32"),
  ...                         np.dtype("float32"))
  >>> choose(p, "xla").describe()
  'xla/dot_general (heuristic) {"backend": "xla"}'
  """
  kind = device_kind(platform)
  if backend == AUTO:
    if variant is not None or config is not None:
      raise ValueError(f"variant= and config= pick a kernel within a named backend; got "
                       f"backend='auto' with {variant=}, {config=}. Name one of "
                       f"{list(registry.backends())}.")
    tuned = _tuned(problem, kind, None, None)
    if tuned and tuned[0][1].backend != FALLBACK and tuned[0][0] >= AUTO_MARGIN:
      return tuned[0][1]
    return dataclasses.replace(choose(problem, FALLBACK, platform=platform), source="fallback")

  b = registry.get_backend(backend)
  if config is not None:
    chosen = registry.resolve_variant(b, variant, problem)
    b.check(problem, chosen, config)
    return Choice(backend, chosen, config, "explicit")
  if variant is not None:
    registry.resolve_variant(b, variant, problem)   # validates the name
  tuned = _tuned(problem, kind, backend, variant)
  if tuned:
    return tuned[0][1]
  chosen = registry.resolve_variant(b, variant, problem)
  config = b.default_config(problem, chosen)
  b.check(problem, chosen, config)
  return Choice(backend, chosen, config, "heuristic")
