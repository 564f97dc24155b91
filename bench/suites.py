"""Every suite of the benchmark, collected from the ops' entries (bench/ops/*.py).

    ENTRIES              each op's `entry.BenchOp`, in their `order`
    ALL_SUITES           every suite's name, in that order
    SUITE_OP             suite -> the jaxgemm op it measures
    SUITE_HELP           suite -> its help line (and "default")
    GPU_DEFAULT_SUITES   what `--suite default` runs on a GPU
    CPU_DEFAULT_SUITES   ... and without one
    PEERS                values of the CSV's `backend` column beside XLA's reference and
                         jaxgemm's kernels (programs measured for comparison)
    entry_of(suite), suite(name), select(suite, default_only=, quick=)

The entries hold data and report code (no jax), so `--help` and the report stay light;
each suite's runner module is imported when it runs (`run.py`).

>>> select("tiny", default_only=True, quick=True)[0].name
'sq128'
>>> SUITE_OP["moe"], entry_of("square (fp32)").name
('ragged_dot', 'matmul')
"""

from __future__ import annotations

import importlib
import pkgutil

from . import ops as _ops
from .entry import BenchOp, Suite


def _collect() -> list[BenchOp]:
  """Each module of bench/ops/'s ENTRY, in `order`; a module without one, or two entries
  naming one suite, is an error."""
  entries = []
  for info in pkgutil.iter_modules(_ops.__path__):
    module = importlib.import_module(f"{_ops.__name__}.{info.name}")
    entry = getattr(module, "ENTRY", None)
    if not isinstance(entry, BenchOp):
      raise TypeError(f"bench/ops/{info.name}.py must define ENTRY = entry.BenchOp(...)")
    entries.append(entry)
  entries.sort(key=lambda e: e.order)
  seen: dict[str, str] = {}
  for e in entries:
    for s in e.suites:
      if s.name in seen or s.name == "default":
        other = f"bench/ops/{seen[s.name]}.py's" if s.name in seen else "reserved"
        raise ValueError(f"suite {s.name!r} of bench/ops/{e.name}.py is also {other}")
      seen[s.name] = e.name
  return entries


ENTRIES: tuple[BenchOp, ...] = tuple(_collect())
_SUITES: dict[str, tuple[Suite, BenchOp]] = {s.name: (s, e) for e in ENTRIES for s in e.suites}

ALL_SUITES = tuple(_SUITES)
SUITE_OP = {name: e.op for name, (_, e) in _SUITES.items()}
GPU_DEFAULT_SUITES = tuple(n for n, (s, _) in _SUITES.items() if s.gpu_default)
CPU_DEFAULT_SUITES = tuple(n for n, (s, _) in _SUITES.items() if s.cpu_default)
SUITE_HELP = {
    **{n: s.help for n, (s, _) in _SUITES.items()},
    "default": f"the default subset of {', '.join(GPU_DEFAULT_SUITES)} (under 10 minutes on an "
               f"H200); on a machine without a GPU: {' + '.join(CPU_DEFAULT_SUITES)}",
}
PEERS = tuple(dict.fromkeys(p for e in ENTRIES for p in e.peers))

# The entry whose tables show a suite no entry names (a suite an older run had).
_FALLBACK = "matmul"


def suite(name: str) -> Suite:
  """The suite called `name`."""
  try:
    return _SUITES[name][0]
  except KeyError:
    raise ValueError(f"unknown suite {name!r}; valid: {[*ALL_SUITES, 'default']}") from None


def entry_of(suite_name: str) -> BenchOp:
  """The entry of the suite `suite_name` (a merged run's 'square (fp32)' is square's); a
  suite no entry names (an older run's) is shown as matmul's GEMM suites are."""
  found = _SUITES.get(suite_name.split(" (", 1)[0])
  return found[1] if found else next(e for e in ENTRIES if e.name == _FALLBACK)


def select(suite_name: str, *, default_only: bool, quick: bool) -> list:
  """The problems of `suite_name`, restricted to its default (or quick) subset."""
  probs = suite(suite_name).problems
  if probs is None:
    raise ValueError(f"suite {suite_name!r} is not a table of problems (it runs "
                     f"bench/{suite(suite_name).runner}.py)")
  if quick:
    return [p for p in probs if p.quick]
  if default_only:
    return [p for p in probs if p.default]
  return list(probs)
