"""Which kernel runs a problem: the one place `backend`, `variant` and `config` are resolved.

For a named backend, the config is, in this order:

1. the caller's explicit ``config=`` (with ``variant=`` or the backend's
   heuristic variant);
2. the on-disk tuning cache (`jaxgemm.autotune` writes it; see
   `jaxgemm.tuning_cache` for where it lives);
3. the table shipped in the package for this device kind
   (``jaxgemm/tables/nvidia-h200.json``, made by this project's tuning run);
4. the backend's heuristic (`Backend.default_variant` / `default_config`:
   measured defaults with tiles clamped to the problem), sized for the
   device that runs the kernel (`Backend.for_platform`: the lowering's
   platform; Triton's tiles fill that device's SMs, and in the CPU
   interpreter, which has none to fill, are the largest that fit).

With ``variant=None`` steps 2 and 3 also choose the variant: the backend's
fastest tuned one. ``backend="auto"`` looks at the tuned records of every
backend for the problem and runs the fastest, if it beat XLA by at least
`AUTO_MARGIN` in its tuning run (against the XLA program a user may get:
`jaxgemm.tuning.XLA_PICK_SPREAD`), else XLA. For a problem nothing was tuned
for, it runs a backend's heuristic choice where that backend names a
structural win (`Backend.structural_win`: a problem class measured to beat
XLA on this device kind), and XLA (`FALLBACK`) otherwise. On a device kind that
the shipped rule's sweep measured (`tuning_cache.NeighbourRule`,
``jaxgemm/tables/rule.json``, fitted by research/sweep/fit.py), the rule decides
a problem with no record of its own instead, from the nearest measured problems.

On a GPU, a problem with no measurement of its own is measured first, when it
is lowered (`jaxgemm.measure.decide`, which then calls `choose`): the records
of its own shape decide, and a neighbour's record only where nothing is
measured (the no-measure path: the CPU, ``JAXGEMM_AUTOTUNE=off``, a program
partitioned over several devices).

Resolution happens per problem (`choose`, called by each op's lowering rule),
so the backward GEMMs of a gradient (other shapes, other layouts) each get
their own choice. The public functions call `validate` first, so a bad name or
config is reported before anything is traced. Nothing is measured here.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax

from jaxgemm import registry, tuning_cache
from jaxgemm.config import KernelConfig
from jaxgemm.ops.base import Problem

AUTO = "auto"
# A tuned kernel replaces XLA under backend="auto" only if it was at least this
# much faster in its tuning run: closer than that, the two swap places between
# runs, and XLA is the safer pick.
AUTO_MARGIN = 1.01
FALLBACK = "xla"


class KernelFallbackWarning(UserWarning):
  """backend="auto" chose a kernel that could not be built here, and ran XLA instead."""


_warned_fallbacks: set[tuple[str, str, str]] = set()


def fall_back(problem: Problem, choice: "Choice", cause: Exception,
              platform: str | None = None) -> "Choice":
  """XLA's choice for `problem`, after `choice` failed to build; warns once per cause.

  Only backend="auto" falls back: it promises to compute whatever jnp.matmul
  does, so a kernel that fails to compile or to fit (a missing package, a
  compiler error, a resource limit) must not fail the user's program. A named
  backend raises instead.
  """
  what = f"{type(cause).__name__}: {cause}"
  key = (choice.backend, choice.variant, what)
  if key not in _warned_fallbacks:
    _warned_fallbacks.add(key)
    warnings.warn(f"jaxgemm: backend='auto' chose {choice.backend}/{choice.variant} for "
                  f"{problem.describe()}, which could not be built here ({what[:500]}); "
                  f"running XLA instead", KernelFallbackWarning, stacklevel=2)
  return dataclasses.replace(choose(problem, FALLBACK, platform=platform), source="fallback")


@dataclasses.dataclass(frozen=True)
class Choice:
  """A resolved kernel, and where the choice came from."""

  backend: str
  variant: str
  config: KernelConfig
  source: str   # "explicit", "cache", "table", "measured", "rule", "heuristic" or "fallback"

  def describe(self) -> str:
    return f"{self.backend}/{self.variant} ({self.source}) {self.config.to_json()}"


@functools.cache
def device_kind(platform: str | None = None) -> str:
  """The device kind tuned records are keyed by ("NVIDIA H200"; "cpu" on the host).

  platform: a lowering platform ("cuda", "cpu"), or None for jax's default device.
  """
  devices = jax.devices({"cuda": "gpu"}.get(platform, platform))
  return devices[0].device_kind


def validate(op: str, backend: str, variant: str | None = None,
             config: KernelConfig | None = None) -> registry.Backend | None:
  """Checks the caller's kernel choice by name and type, before any problem is known.

  Returns the named backend (None for "auto"). ValueError for an unknown or
  unusable backend or variant, or variant/config with "auto"; TypeError for a
  config of another backend.
  """
  if backend == AUTO:
    if variant is not None or config is not None:
      raise ValueError(f"variant= and config= pick a kernel within a named backend; got "
                       f"backend='auto' with {variant=}, {config=}. Name one of "
                       f"{list(registry.backends(op))}.")
    return None
  b = registry.get_backend(backend, op)
  # Here, before tracing: a kernel that cannot run would otherwise fail inside
  # the lowering (a missing torch as an opaque error of the CPU callback).
  reason = registry.why_unavailable(b)
  if reason is not None:
    raise ValueError(f"backend={backend!r} cannot run here: {reason}. "
                     f"Usable backends: {['auto', *registry.backends(op)]}")
  if variant is not None and variant not in b.variants:
    raise ValueError(f"unknown variant={variant!r} for backend={backend!r}; "
                     f"valid variants: {list(b.variants)}")
  if config is not None and not isinstance(config, b.config_cls):
    raise TypeError(f"backend={backend!r} takes config={b.config_cls.__name__}(...), "
                    f"got {type(config).__name__}")
  return b


def _usable(problem: Problem, backend: registry.Backend, variant: str,
            config: KernelConfig) -> bool:
  try:
    backend.check(problem, variant, config)
  except (NotImplementedError, ValueError, TypeError):
    return False
  return True


def _tuned(problem: Problem, kind: str, backend: str | None,
           variant: str | None) -> list[tuple[float, Choice]]:
  """(speedup over XLA in tuning, Choice) of the usable tuned records, fastest first.

  Where the problem itself was measured (its XLA record is of its own shape), only
  the records of its own shape count: a neighbour's record is a guess that the
  measurement replaced.
  """
  out = []
  usable = registry.backends(problem.op)
  records = tuning_cache.lookup(problem, kind, backend)
  if backend is not None:   # XLA's record says whether the problem itself was measured
    records += [t for t in tuning_cache.lookup(problem, kind, FALLBACK) if backend != FALLBACK]
  own = problem.shape_key()
  if any(t.backend == FALLBACK and t.shape == own for t in records):
    records = [t for t in records if t.shape == own]
  records = [t for t in records if backend is None or t.backend == backend]
  for t in records:
    if (variant is not None and t.variant != variant) or t.backend not in usable:
      continue
    b = registry.get_backend(t.backend, problem.op)
    if t.variant not in b.variants:
      continue
    try:
      config = b.config_cls.from_dict(t.config)
    except (TypeError, ValueError):
      continue   # a config field that no longer exists, or no longer valid
    if _usable(problem, b, t.variant, config):
      out.append((t.speedup_vs_xla, Choice(t.backend, t.variant, config, t.source)))
  out.sort(key=lambda sc: -sc[0])
  return out


def _measured_itself(problem: Problem, kind: str) -> bool:
  """Whether this very problem was measured (an XLA record of its own shape)."""
  xla_variant = registry.get_backend(FALLBACK, problem.op).variants[-1]
  return tuning_cache.measured_backends(problem, kind, xla_variant) is not None


def _by_rule(problem: Problem, kind: str, rule: tuning_cache.NeighbourRule,
             platform: str | None) -> Choice | None:
  """The fitted rule's pick for a problem with no record of its own (`NeighbourRule`):
  the kernel whose worst speedup over the `k` nearest measured problems is highest, at
  least `margin`, with the nearest one's config that can run this problem; None: XLA."""
  near = tuning_cache.neighbours(problem, kind, rule.k, rule.align_penalty)
  reference = (FALLBACK, registry.get_backend(FALLBACK, problem.op).variants[-1])
  worst: dict[tuple[str, str], float] | None = None
  for records in near:
    speedups = {bv: t.speedup_vs_xla for bv, t in records.items() if bv != reference}
    worst = speedups if worst is None else {bv: min(x, speedups[bv])
                                            for bv, x in worst.items() if bv in speedups}
  usable = registry.backends(problem.op)
  for (name, variant), speedup in sorted((worst or {}).items(), key=lambda x: (-x[1], x[0])):
    if speedup < rule.margin:
      break
    if name not in usable:
      continue
    b = registry.get_backend(name, problem.op).for_platform(platform)
    if variant not in b.variants:
      continue
    for records in near:
      try:
        config = b.config_cls.from_dict(records[(name, variant)].config)
      except (TypeError, ValueError):
        continue
      if _usable(problem, b, variant, config):
        return Choice(name, variant, config, "rule")
  return None


def _is_reference(choice: Choice, problem: Problem) -> bool:
  """Whether `choice` is XLA's own program (what auto runs unless another beat it)."""
  return (choice.backend == FALLBACK
          and choice.variant == registry.get_backend(FALLBACK, problem.op).variants[-1])


def choose(problem: Problem, backend: str = AUTO, variant: str | None = None,
           config: KernelConfig | None = None, *, platform: str | None = None) -> Choice:
  """The kernel that runs `problem` (see the module docstring for the order).

  Raises what `validate` raises for a bad choice, and what the backend's
  `check` raises when an explicit choice cannot run the problem
  (NotImplementedError for unsupported features, ValueError for a config that
  cannot work).

  >>> import numpy as np, jaxgemm
  >>> from jaxgemm.dispatch import choose
  >>> p = jaxgemm.GemmProblem(1, 64, 64, 64, np.dtype("float32"), np.dtype("float32"),
  ...                         np.dtype("float32"))
  >>> choose(p, "xla").describe()
  'xla/dot_general (heuristic) {"backend": "xla"}'
  """
  b = validate(problem.op, backend, variant, config)
  kind = device_kind(platform)
  if b is None:
    rule = tuning_cache.rule_for(kind)
    if rule is not None and not _measured_itself(problem, kind):
      picked = _by_rule(problem, kind, rule, platform)
      if picked is not None:
        return picked
      return dataclasses.replace(choose(problem, FALLBACK, platform=platform), source="fallback")
    tuned = _tuned(problem, kind, None, None)
    if tuned and not _is_reference(tuned[0][1], problem) and tuned[0][0] >= AUTO_MARGIN:
      return tuned[0][1]
    if not tuned:
      for name in registry.backends(problem.op):
        candidate = registry.get_backend(name, problem.op).for_platform(platform)
        if name != FALLBACK and candidate.structural_win(problem, kind):
          chosen = candidate.default_variant(problem)
          config = candidate.default_config(problem, chosen)
          if _usable(problem, candidate, chosen, config):
            return Choice(name, chosen, config, "heuristic")
    return dataclasses.replace(choose(problem, FALLBACK, platform=platform), source="fallback")

  b = b.for_platform(platform)
  if config is not None:
    chosen = variant or b.default_variant(problem)
    b.check(problem, chosen, config)
    return Choice(backend, chosen, config, "explicit")
  tuned = _tuned(problem, kind, backend, variant)
  if tuned:
    return tuned[0][1]
  chosen = variant or b.default_variant(problem)
  config = b.default_config(problem, chosen)
  b.check(problem, chosen, config)
  return Choice(backend, chosen, config, "heuristic")
