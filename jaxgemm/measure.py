"""`backend="auto"` decides by measurement: a GEMM problem with no record is timed when lowered.

When a jaxgemm op is lowered for a device with ``backend="auto"`` (or a named
backend with ``variant=None``), `decide` looks for a measurement of exactly that
problem: in this process, in the tuning cache, in the shipped table
(`jaxgemm.tuning_cache.measured_backends`). If there is none, it runs
`jaxgemm.autotune` on the problem alone: XLA's program and the first few
candidates of each kernel backend (`Backend.tuning_candidates`), each checked
against XLA's result and timed paired with it, within a time budget. It keeps the
records for the process and writes them to the cache, so a later process pays
nothing; then `jaxgemm.dispatch.choose` picks from the problem's own
measurements (the fastest, if it beat XLA by `dispatch.AUTO_MARGIN`). Each
measurement prints one line to stderr, with what it cost.

Every GEMM a program lowers is decided on its own: the forward and each backward
GEMM of a gradient, each with its shapes and layouts. A ragged_dot is measured on
a representative routing (`Op.example_operands`: the rows spread over the groups).

Where XLA's own program does not fit in device memory (its ragged_dot at 128 experts
and 65536 rows takes 34 GB of dense products), there is nothing to measure against, and
XLA is no choice: a kernel runs unmeasured (the no-measure path's if it picks one, else
the first kernel backend's own), said in one line.

Nothing is measured (the no-measure path of `jaxgemm.dispatch` decides from
the cache, the shipped tables and the backends' rules):

* with ``JAXGEMM_AUTOTUNE=off``;
* on the CPU (the kernels run in interpreters there: their times mean nothing),
  and wherever the lowering has no device to run on (`jax.export`,
  cross-compiling: the lowering platform is not the default backend's);
* for a program partitioned over several devices (the kernel's local problem is
  lowered inside XLA's partitioner, which must not run programs of its own):
  measure such problems ahead with `jaxgemm.autotune` on the local shapes;
* in a multi-process run, in any process but process 0: process 0 decides and
  shares its choice (`agree`), so that every process runs the same kernel and
  replicated values stay bit-identical.

Knobs (environment variables, read at each decision; `override` in code):

* ``JAXGEMM_AUTOTUNE``: "on" (default) or "off";
* ``JAXGEMM_AUTOTUNE_BUDGET_S``: seconds a problem's candidates may take
  (default 2.5: no new candidate starts after it; what was timed counts). XLA's
  own program is compiled and timed first, outside the budget: the user's
  program compiles that dot anyway (XLA keeps its autotuning for the process),
  and for an FP8 dot that compile alone took 9-12 s on an H100;
* ``JAXGEMM_AUTOTUNE_CANDIDATES``: candidates timed per kernel backend (default 2);
* ``JAXGEMM_AUTOTUNE_LOG``: "on" (default) prints a line per measurement, "off".

    >>> import jaxgemm
    >>> from jaxgemm import measure
    >>> with measure.override(enabled=False):
    ...   measure.settings().enabled
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import threading
import time
from typing import Any, Iterator

import jax
import numpy as np

from jaxgemm import dispatch, registry, tuning, tuning_cache
from jaxgemm.ops.base import Problem

ENABLED_ENV = "JAXGEMM_AUTOTUNE"
BUDGET_ENV = "JAXGEMM_AUTOTUNE_BUDGET_S"
CANDIDATES_ENV = "JAXGEMM_AUTOTUNE_CANDIDATES"
LOG_ENV = "JAXGEMM_AUTOTUNE_LOG"
# The target is 3 s per GEMM problem for a first compile with measurement; the
# budget stops new candidates, and the one running when it expires still finishes.
DEFAULT_BUDGET_S = 2.5
DEFAULT_CANDIDATES = 2
# Timed calls per program (paired with XLA's: `jaxgemm.timing.time_paired`).
DEFAULT_ITERS = 10
# Input sets rotated for a problem smaller than about twice the L2 (the tuner's default
# is 32): each set is one more dot or kernel in every program compiled, and compiling
# took most of a measurement (1.2-1.9 s of 2.5-3.4 s on an H100, the measure probe at
# 5d2b33f, seed 4242).
MAX_ROTATE = 4
# The lowering platforms whose kernels are compiled, so worth timing.
MEASURED_PLATFORMS = ("cuda", "rocm")

_ON, _OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")


@dataclasses.dataclass(frozen=True)
class Settings:
  """How `decide` measures (`settings()`: from the environment, or `override`).

  timer: a `jaxgemm.timing.Timer`-like object (tests pass a fake one), or None
    for the tuner's own. platforms: the lowering platforms measured on.
    backends: the kernel backends `backend="auto"` measures (None: every usable one).
  """

  enabled: bool = True
  budget_s: float = DEFAULT_BUDGET_S
  candidates: int = DEFAULT_CANDIDATES
  iters: int = DEFAULT_ITERS
  log: bool = True
  timer: Any = None
  platforms: tuple[str, ...] = MEASURED_PLATFORMS
  backends: tuple[str, ...] | None = None


_overrides = threading.local()


def _switch(name: str, default: bool) -> bool:
  value = os.environ.get(name, "").strip().lower()
  if not value:
    return default
  if value in _ON or value in _OFF:
    return value in _ON
  raise ValueError(f"{name}={os.environ[name]!r} must be one of {list(_ON + _OFF)}")


def _number(name: str, default, kind, least):
  value = os.environ.get(name, "").strip()
  if not value:
    return default
  try:
    x = kind(value)
  except ValueError:
    x = None
  if x is None or not x >= least:
    raise ValueError(f"{name}={value!r} must be a{'n integer' if kind is int else ' number'} "
                     f"of at least {least}")
  return x


def settings() -> Settings:
  """The measurement settings now: `override`'s, else the environment's.

  ValueError naming the variable for a value that cannot work.
  """
  stack = getattr(_overrides, "stack", None)
  if stack:
    return stack[-1]
  return Settings(enabled=_switch(ENABLED_ENV, True),
                  budget_s=_number(BUDGET_ENV, DEFAULT_BUDGET_S, float, 0.0),
                  candidates=_number(CANDIDATES_ENV, DEFAULT_CANDIDATES, int, 1),
                  log=_switch(LOG_ENV, True))


@contextlib.contextmanager
def override(**changes) -> Iterator[Settings]:
  """Measures with `changes` to the current settings inside the block (this thread).

  >>> with override(budget_s=1.0) as s:
  ...   s.budget_s
  1.0
  """
  new = dataclasses.replace(settings(), **changes)
  stack = getattr(_overrides, "stack", None)
  if stack is None:
    stack = _overrides.stack = []
  stack.append(new)
  try:
    yield new
  finally:
    stack.pop()


def _backends_to_measure(problem: Problem, backend: str) -> list[str]:
  """The backends whose candidates a measurement times: every usable one for "auto"
  (XLA's among them where it has programs beyond its reference: scaled_matmul's
  dequantize-then-bf16 dot), else the named one."""
  if backend != dispatch.AUTO:
    return [backend]
  chosen = settings().backends
  return [b for b in registry.backends(problem.op)
          if (chosen is None or b in chosen)
          and (b != dispatch.FALLBACK or len(registry.get_backend(b, problem.op).variants) > 1)]


def _xla_variant(problem: Problem) -> str:
  return registry.get_backend(dispatch.FALLBACK, problem.op).variants[-1]


# (device kind, problem, backends) whose measurement failed in this process: not tried
# again at every lowering.
_failed: set = set()
# (device kind, problem, backend): the kernel run where XLA's program did not fit (`_instead_of_xla`),
# at every lowering of the problem in this process.
_instead: dict = {}
_measuring = threading.local()


def why_not_measured(problem: Problem, backend: str, platform: str | None,
                     num_devices: int = 1, s: Settings | None = None) -> str | None:
  """None where `decide` would measure `problem` now, else why not (what the
  module docstring lists; also "measured": a measurement of it exists)."""
  s = s or settings()
  if not s.enabled:
    return f"{ENABLED_ENV}=off"
  if platform not in s.platforms:
    return f"lowered for {platform!r}, not a measured platform {list(s.platforms)}"
  if platform != "cpu" and jax.default_backend() != "gpu":
    return "no device of the lowering's platform here (exported or cross-compiled)"
  if num_devices != 1:
    return f"partitioned over {num_devices} devices"
  if getattr(_measuring, "active", False):
    return "inside a measurement"
  if jax.process_count() > 1 and jax.process_index() != 0:
    return "not process 0 (process 0 measures and shares its choice)"
  wanted = set(_backends_to_measure(problem, backend))
  kind = dispatch.device_kind(platform)
  if (kind, problem, frozenset(wanted)) in _failed:
    return "its measurement failed earlier in this process"
  done = tuning_cache.measured_backends(problem, kind, _xla_variant(problem))
  if done is not None and ("*" in done or wanted <= done):
    return "measured"
  return None


def measure(problem: Problem, backend: str = dispatch.AUTO,
            platform: str | None = None) -> tuning.TuningReport:
  """Times XLA and the first candidates of the backends `backend` names ("auto": every
  kernel backend) on `problem`, keeps the records for this process and writes them to
  the cache. What `decide` runs for a problem with no measurement."""
  s = settings()
  backends = _backends_to_measure(problem, backend)
  _measuring.active = True
  try:
    report = tuning.autotune(problems=[problem], backends=backends, backward=False,
                             time_budget_s=math.inf, candidate_budget_s=s.budget_s,
                             iters=s.iters, cache_path=None,
                             retune=True, log=None, max_candidates=s.candidates,
                             keep_partial=True, timer=s.timer, xla_programs="own",
                             max_rotate=MAX_ROTATE)
  finally:
    _measuring.active = False
  tuning_cache.remember(report.records)
  path = tuning_cache.default_cache_path()
  if path is not None and report.records:
    try:
      tuning_cache.store(path, report.records)
    except OSError as e:   # a read-only home: this process still uses what it measured
      _say(s, f"jaxgemm: could not write the tuning cache {path} ({e}); "
              f"the measurement holds for this process only")
  return report


def _say(s: Settings, line: str) -> None:
  if s.log:
    print(line, file=sys.stderr, flush=True)


def decide(problem: Problem, params, platform: str | None = None,
           num_devices: int = 1) -> dispatch.Choice:
  """The kernel that runs `problem` under `params` (backend, variant, config):
  measured first where `why_not_measured` says nothing stands in the way, then
  `jaxgemm.dispatch.choose`, then agreed across processes (`agree`).

  num_devices: how many devices the program being lowered runs on.
  """
  backend, variant, config = params["backend"], params["variant"], params["config"]
  s = settings()
  kind = dispatch.device_kind(platform)
  measurable = backend == dispatch.AUTO or (variant is None and config is None)
  if measurable and (kind, problem, backend) in _instead:
    return agree(_instead[kind, problem, backend], problem)
  if measurable and why_not_measured(problem, backend, platform, num_devices, s) is None:
    t0 = time.perf_counter()
    try:
      report = measure(problem, backend, platform)
    except Exception as e:  # noqa: BLE001 (a failed measurement leaves the no-measure path)
      _failed.add((kind, problem, frozenset(_backends_to_measure(problem, backend))))
      if isinstance(e, tuning.ReferenceFailed) and e.out_of_memory:
        choice = _instead[kind, problem, backend] = _instead_of_xla(problem, backend, variant,
                                                                    config, platform)
        _say(s, f"jaxgemm: XLA's program of {problem.describe()} does not fit in device "
                f"memory; running {choice.backend}/{choice.variant} unmeasured")
        return agree(choice, problem)
      _say(s, f"jaxgemm: measuring {problem.describe()} failed ({type(e).__name__}: "
              f"{str(e)[:200]}); deciding without a measurement")
    else:
      choice = dispatch.choose(problem, backend, variant, config, platform=platform)
      _say(s, _measured_line(problem, report, choice, time.perf_counter() - t0))
      return agree(choice, problem)
  return agree(dispatch.choose(problem, backend, variant, config, platform=platform), problem)


def _instead_of_xla(problem: Problem, backend: str, variant, config,
                    platform: str | None) -> dispatch.Choice:
  """The no-measure path's choice where it is a kernel, else the first kernel backend's
  own: where XLA's program ran out of device memory, it is no choice (a user's program
  has less memory free than the measurement had)."""
  choice = dispatch.choose(problem, backend, variant, config, platform=platform)
  if choice.backend != dispatch.FALLBACK:
    return choice
  for name in _backends_to_measure(problem, backend):
    if name == dispatch.FALLBACK:
      continue
    try:
      return dispatch.choose(problem, name, platform=platform)
    except (NotImplementedError, ValueError, TypeError):
      continue   # this backend cannot run the problem
  return choice


def _measured_line(problem: Problem, report: tuning.TuningReport, choice: dispatch.Choice,
                   seconds: float) -> str:
  xla_ms = report.xla_ms.get(problem)
  best = report.best(problem)
  timed = sum(t.status == "ok" for t in report.trials)
  failed = sum(t.status in ("fail", "error") for t in report.trials)
  parts = [f"jaxgemm: measured {problem.describe()} on {report.device_kind} in {seconds:.2f} s "
           f"({report.compile_s:.2f} s compiling; XLA and {timed} kernel programs"
           f"{f', {failed} failed' if failed else ''}"
           f"{', out of time' if problem in report.out_of_time else ''}):"]
  if xla_ms is not None:
    parts.append(f"XLA {xla_ms:.4f} ms")
  if best is not None:
    parts.append(f"best kernel {best.backend}/{best.variant} {best.time_ms:.4f} ms "
                 f"({best.speedup_vs_xla:.2f}x)")
  parts.append(f"-> {choice.backend}/{choice.variant}")
  return " ".join(parts)


# ---------------------------------------------------------------- several processes

# A choice travels as JSON in a fixed-size byte array (broadcast_one_to_all needs the
# same shape in every process); configs are a few hundred bytes.
_CHOICE_BYTES = 4096


def encode_choice(choice: dispatch.Choice) -> np.ndarray:
  """`choice` as the fixed-size byte array `agree` broadcasts.

  >>> c = dispatch.Choice("xla", "dot_general", registry.get_backend("xla").config_cls(),
  ...                     "heuristic")
  >>> decode_choice(encode_choice(c), "matmul") == dataclasses.replace(c, source="process 0")
  True
  """
  data = json.dumps({"backend": choice.backend, "variant": choice.variant,
                     "config": choice.config.to_dict()}).encode()
  if len(data) > _CHOICE_BYTES:
    raise ValueError(f"a kernel choice of {len(data)} bytes does not fit the "
                     f"{_CHOICE_BYTES} shared between processes")
  out = np.zeros(_CHOICE_BYTES, np.uint8)
  out[:len(data)] = np.frombuffer(data, np.uint8)
  return out


def decode_choice(data: np.ndarray, op: str) -> dispatch.Choice:
  """The `Choice` `encode_choice` wrote (source "process 0")."""
  raw = bytes(np.asarray(data, np.uint8)).rstrip(b"\0")
  d = json.loads(raw)
  b = registry.get_backend(d["backend"], op)
  config = b.config_cls.from_dict({k: v for k, v in d["config"].items() if k != "backend"})
  return dispatch.Choice(d["backend"], d["variant"], config, "process 0")


def agree(choice: dispatch.Choice, problem: Problem) -> dispatch.Choice:
  """Process 0's choice for `problem`, in every process of a multi-process run.

  Every process lowers the same program, so they reach each decision in the
  same order and each takes part in the broadcast, whether or not it had a
  record of its own (a process with a different cache must still run process
  0's kernel). One process: `choice` itself.
  """
  if jax.process_count() == 1:
    return choice
  from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-process runs only)
  shared = multihost_utils.broadcast_one_to_all(encode_choice(choice))
  return choice if jax.process_index() == 0 else decode_choice(shared, problem.op)
