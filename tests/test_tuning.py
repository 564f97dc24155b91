"""Autotuning and dispatch: resolution order, the cache, the tables, backend="auto".

Everything here runs on the CPU: the device kind is then "cpu", tables are
written to a temporary folder, and kernels run in their interpreters.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import (DriftingTimer, assert_gemm_close, matmul_reference, random_array,
                          tolerance)
from jaxgemm import dispatch, registry, timing, tuning, tuning_cache
from jaxgemm.ops import rules
from jaxgemm.ops.matmul import primitive
from jaxgemm.ops.matmul.triton import TritonConfig

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float32)
KIND = dispatch.device_kind()          # "cpu" here
pytestmark = pytest.mark.skipif("triton" not in jaxgemm.backends(),
                                reason="the triton backend (its interpreter) is not installed")


def problem(m=48, n=40, k=32, dtype=F32, batch=1, **kw) -> jaxgemm.GemmProblem:
  return jaxgemm.GemmProblem(batch, m, n, k, np.dtype(dtype), np.dtype(dtype), F32, **kw)


def record(backend, config, time_ms, xla_time_ms=1.0, version=None) -> dict:
  """A record of `backend`; `write` stamps it with its rung's version unless `version`."""
  cfg = {k: v for k, v in config.to_dict().items() if k != "backend"} if config else {}
  return {"config": cfg, "time_ms": time_ms, "xla_time_ms": xla_time_ms,
          "version": version, "timer": "test"}


def write(path, p, entries: dict[tuple[str, str], dict]):
  """A tuning file holding `entries` {(backend, variant): record} for problem `p`."""
  data = {"format": tuning_cache.FORMAT, "entries": {
      tuning_cache.entry_key(KIND, b, v, p): {p.shape_key(): stamped(r, b, v, p.op)}
      for (b, v), r in entries.items()}}
  path.write_text(json.dumps(data))


def stamped(r: dict, backend: str, variant: str, op: str = "matmul") -> dict:
  """`r`, with the current version of backend/variant where it has none."""
  return {**r, "version": r["version"] or tuning_cache.kernel_version(backend, op,
                                                                      variant=variant)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """A private cache file (not yet written) and an empty table folder."""
  path = tmp_path / "cache" / "autotune.json"
  monkeypatch.setenv(tuning_cache.CACHE_ENV, str(path))
  tables = tmp_path / "tables"
  tables.mkdir()
  monkeypatch.setattr(tuning_cache, "TABLES_DIR", tables)
  return path


@pytest.fixture
def table(cache):
  return tuning_cache.table_path(KIND)


SMALL = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
OTHER = TritonConfig(block_m=32, block_n=32, block_k=16, num_warps=4, num_stages=2)


# ---------------------------------------------------------------- resolution order

def test_resolution_order_explicit_cache_table_heuristic(cache, table):
  p = problem()
  heuristic = registry.get_backend("triton").default_config(p, "tensorcore")
  assert heuristic not in (SMALL, OTHER)

  c = dispatch.choose(p, "triton", "tensorcore")
  assert (c.source, c.config) == ("heuristic", heuristic)

  write(table, p, {("triton", "tensorcore"): record("triton", OTHER, 2.0)})
  c = dispatch.choose(p, "triton", "tensorcore")
  assert (c.source, c.config) == ("table", OTHER)

  cache.parent.mkdir()
  write(cache, p, {("triton", "tensorcore"): record("triton", SMALL, 3.0)})
  c = dispatch.choose(p, "triton", "tensorcore")
  assert (c.source, c.config) == ("cache", SMALL), "the cache overrides the table"

  explicit = TritonConfig(block_m=64, block_n=16, block_k=16)
  c = dispatch.choose(p, "triton", "tensorcore", explicit)
  assert (c.source, c.config) == ("explicit", explicit)


def test_variant_none_picks_the_fastest_tuned_variant(table):
  p = problem()
  write(table, p, {("triton", "tensorcore"): record("triton", SMALL, 2.0),
                   ("triton", "persistent"): record("triton", OTHER, 1.5),
                   ("triton", "tiled"): record("triton", SMALL, 9.0)})
  c = dispatch.choose(p, "triton")
  assert (c.variant, c.config, c.source) == ("persistent", OTHER, "table")


def test_lowering_uses_the_resolved_config(cache, rng, monkeypatch):
  """The config of the cache reaches the kernel, forward and backward, and the
  result stays right."""
  p = problem(m=48, n=40, k=32)
  cache.parent.mkdir()
  write(cache, p, {("triton", "tensorcore"): record("triton", SMALL, 1.0)})
  seen = []
  backend = registry.get_backend("triton")
  impl = backend.impl
  monkeypatch.setattr(type(backend), "impl",
                      lambda self, prob, v, cfg, plat: (seen.append((prob, v, cfg)),
                                                        impl(prob, v, cfg, plat))[1])
  a = random_array(rng, (48, 32), F32)
  b = random_array(rng, (32, 40), F32)
  out = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="triton", variant="tensorcore"))(a, b)
  ref, bound = matmul_reference(a, b)
  assert_gemm_close(out, ref, bound, tolerance(F32), "tuned config")
  assert seen and seen[-1][1:] == ("tensorcore", SMALL)
  # The backward GEMMs have other shapes: no record, so they get the heuristic.
  jax.grad(lambda a: jaxgemm.matmul(a, b, backend="triton", variant="tensorcore").sum())(a)
  grads = [(prob, cfg) for prob, _, cfg in seen if prob != p]
  assert grads and all(cfg == backend.default_config(prob, "tensorcore")
                       for prob, cfg in grads)


def test_records_of_a_bucket_apply_to_its_neighbours(table):
  tuned = problem(m=48, n=40, k=32)
  write(table, tuned, {("triton", "tensorcore"): record("triton", SMALL, 1.0)})
  assert dispatch.choose(problem(m=60, n=36, k=32), "triton", "tensorcore").config == SMALL
  # Another power-of-two bucket, another alignment, or other flags: not the same problem.
  for other in (problem(m=100, n=40, k=32), problem(m=48, n=40, k=31),
                problem(m=48, n=40, k=32, trans_a=True), problem(m=48, n=40, k=32, dtype=BF16)):
    assert dispatch.choose(other, "triton", "tensorcore").source == "heuristic", other


def test_a_tuned_config_that_no_longer_fits_is_not_used(table):
  p = problem(dtype=F32, precision=(jax.lax.Precision.HIGHEST,) * 2)
  # A tensor-core record cannot run exact fp32: the heuristic variant runs instead.
  write(table, p, {("triton", "tensorcore"): record("triton", SMALL, 0.1)})
  c = dispatch.choose(p, "triton")
  assert (c.variant, c.source) == ("pipelined", "heuristic")


# ---------------------------------------------------------------- backend="auto"

def test_auto_falls_back_to_xla_without_records(cache):
  c = dispatch.choose(problem(), "auto")
  assert (c.backend, c.source) == ("xla", "fallback")


@pytest.mark.parametrize("kernel_ms, picked", [
    (0.5, "triton"),              # twice as fast as XLA
    (0.995, "xla"),               # faster, but within AUTO_MARGIN: XLA
    (2.0, "xla"),                 # slower
])
def test_auto_picks_a_kernel_only_if_it_beat_xla(table, kernel_ms, picked):
  p = problem()
  write(table, p, {("xla", "dot_general"): record("xla", None, 1.0),
                   ("triton", "tensorcore"): record("triton", SMALL, kernel_ms)})
  assert dispatch.choose(p, "auto").backend == picked


def test_auto_runs_the_tuned_kernel_under_jit_grad_and_vmap(table, rng):
  m, n, k = 48, 40, 32
  p = problem(m, n, k)
  write(table, p, {("triton", "tensorcore"): record("triton", SMALL, 0.5)})
  a = random_array(rng, (m, k), F32)
  b = random_array(rng, (k, n), F32)
  jaxpr = jax.make_jaxpr(jaxgemm.matmul)(a, b)
  eqn, = [e for e in jaxpr.eqns if e.primitive is primitive.matmul_p]
  assert eqn.params["backend"] == "auto"
  c = rules.resolve_kernel(p, eqn.params, "cpu")
  assert (c.backend, c.variant, c.config) == ("triton", "tensorcore", SMALL)

  ref, bound = matmul_reference(a, b)
  assert_gemm_close(jax.jit(jaxgemm.matmul)(a, b), ref, bound, tolerance(F32), "auto")
  ct = random_array(rng, (m, n), F32)
  da = jax.grad(lambda a: jnp.vdot(jaxgemm.matmul(a, b), ct))(a)
  ref, bound = matmul_reference(ct, b.T)
  assert_gemm_close(da, ref, bound, tolerance(F32), "auto grad")
  batched = jax.vmap(jaxgemm.matmul, (0, None))(jnp.stack([a, a]), b)
  assert batched.shape == (2, m, n)


def test_auto_falls_back_to_xla_for_what_kernels_do_not_take(table):
  p = problem(dtype=np.float64)
  write(table, p, {("triton", "tensorcore"): record("triton", SMALL, 0.01)})
  assert dispatch.choose(p, "auto").backend == "xla"


def test_auto_rejects_variant_and_config():
  with pytest.raises(ValueError, match="backend='auto'"):
    jaxgemm.matmul(jnp.ones((4, 4)), jnp.ones((4, 4)), variant="tensorcore")


# ---------------------------------------------------------------- the cache file

def test_cache_location(monkeypatch, tmp_path):
  monkeypatch.setenv(tuning_cache.CACHE_ENV, str(tmp_path / "x.json"))
  assert tuning_cache.default_cache_path() == tmp_path / "x.json"
  monkeypatch.setenv(tuning_cache.CACHE_ENV, "off")
  assert tuning_cache.default_cache_path() is None
  monkeypatch.delenv(tuning_cache.CACHE_ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert tuning_cache.default_cache_path() == tmp_path / "jaxgemm" / "autotune.json"


def test_autotune_round_trip(cache):
  p = problem(m=32, n=32, k=32)
  report = jaxgemm.autotune(problems=[p], backends=["triton"], iters=1, log=None)
  assert report.tuned == [p] and not report.out_of_time
  ok = [t for t in report.trials if t.status == "ok"]
  assert ok, report.summary()
  assert all(t.error <= tuning.tolerance(p) for t in ok)
  data = json.loads(cache.read_text())
  assert data["format"] == tuning_cache.FORMAT
  xla_key = tuning_cache.entry_key(KIND, "xla", "dot_general", p)
  assert data["entries"][xla_key][p.shape_key()]["time_ms"] > 0

  # Each tuned (backend, variant) comes back as its config fastest against XLA.
  for variant in {t.variant for t in ok}:
    fastest = max((t for t in ok if t.variant == variant), key=lambda t: t.speedup_vs_xla)
    c = dispatch.choose(p, "triton", variant)
    assert (c.source, c.config) == ("cache", fastest.config)

  again = jaxgemm.autotune(problems=[p], backends=["triton"], iters=1, log=None)
  assert again.already_tuned == [p] and not again.trials
  redo = jaxgemm.autotune(problems=[p], backends=["triton"], iters=1, retune=True, log=None)
  assert redo.tuned == [p] and redo.trials


def test_autotune_times_each_candidate_interleaved_with_xla(cache, monkeypatch):
  """Each candidate's ratio is against XLA's dot timed around it: under a clock
  that slows 10% per timed block, a kernel as fast as XLA reads ~1x (timed
  against one XLA timing at the problem's start it would read 0.1-0.5x), and
  the cache keeps that pair of times for auto to rank by."""
  timer = DriftingTimer()
  monkeypatch.setattr(tuning, "Timer", lambda platform: timer)
  p = problem(m=32, n=32, k=32)
  report = jaxgemm.autotune(problems=[p], backends=["triton"], iters=2, log=None)
  ok = [t for t in report.trials if t.status == "ok"]
  assert len(ok) >= 2, report.summary()
  blocks = [f for f, _ in timer.calls]
  xla_first = blocks[0]
  for t in ok:
    assert t.speedup_vs_xla == pytest.approx(1.0, abs=0.02)
    assert t.xla_time_ms != report.xla_ms[p]
  # XLA alone, then per candidate: XLA once to size the blocks, then XLA,
  # kernel, kernel, XLA.
  assert blocks[1] is xla_first and blocks[2] is xla_first
  assert blocks[3] is not xla_first and blocks[4] is not xla_first and blocks[5] is xla_first
  data = json.loads(cache.read_text())["entries"]
  for t in ok:
    stored = data[tuning_cache.entry_key(KIND, "triton", t.variant, p)][p.shape_key()]
    best = max((u for u in ok if u.variant == t.variant), key=lambda u: u.speedup_vs_xla)
    assert (stored["time_ms"], stored["xla_time_ms"]) == (best.time_ms, best.xla_time_ms)


class CountingTimer:
  """1 ms per timed call; records how many arrays each timed call took."""
  label = "fake"

  def __init__(self):
    self.arg_counts = []

  def time(self, f, args, iters, chunk=None):
    self.arg_counts.append(len(args))
    return [1.0] * iters


def test_autotune_rotates_input_sets_of_problems_smaller_than_l2(cache, monkeypatch):
  """On a GPU a problem smaller than about twice the L2 is timed over several
  input sets in one call, as the benchmark times it, and its times are per set."""
  timer = CountingTimer()
  monkeypatch.setattr(tuning, "Timer", lambda platform: timer)
  monkeypatch.setattr(tuning, "platform_of", lambda: "gpu")
  p = problem(m=32, n=32, k=32)
  sets = timing.rotation(3 * 32 * 32 * 4, timing.l2_bytes(KIND))
  assert sets == timing.MAX_ROTATE
  report = jaxgemm.autotune(problems=[p], backends=[], iters=2, log=None)
  assert set(timer.arg_counts) == {2 * sets}
  assert report.xla_ms[p] == pytest.approx(1.0 / sets)


class TwoXlaProgramsTimer:
  """The first program timed (XLA's dot as it comes) takes `own` ms, the
  second (XLA's dot with its Triton GEMMs off) 1 ms, every kernel `kernel` ms."""
  label = "fake"

  def __init__(self, own, kernel):
    self.own, self.kernel, self.seen = own, kernel, []

  def time(self, f, args, iters, chunk=None):
    if f not in self.seen:
      self.seen.append(f)
    return [{0: self.own, 1: 1.0}.get(self.seen.index(f), self.kernel)] * iters


@pytest.mark.parametrize("own_ms, kernel_ms, reference_ms, auto", [
    (1.05, 1.03, 1.0, "xla"),      # a close race: either program may be XLA's pick
    (1.3, 1.2, 1.3, "triton"),     # a stable, slower pick: what every user gets
    (0.9, 1.2, 0.9, "xla"),        # XLA's own pick is the faster
])
def test_autotune_measures_kernels_against_the_xla_program_users_may_get(
    cache, monkeypatch, own_ms, kernel_ms, reference_ms, auto):
  """On a GPU XLA's dot is compiled as it comes and with its Triton GEMMs off;
  kernels are measured against the faster where the two are within
  XLA_PICK_SPREAD, against XLA's own pick otherwise."""
  timer = TwoXlaProgramsTimer(own_ms, kernel_ms)
  monkeypatch.setattr(tuning, "Timer", lambda platform: timer)
  monkeypatch.setattr(tuning, "platform_of", lambda: "gpu")
  assert tuning.XLA_PICK_SPREAD == 0.10   # the cases above straddle it
  p = problem(m=32, n=32, k=32)
  sets = timing.rotation(p.min_bytes, timing.l2_bytes(KIND))
  report = jaxgemm.autotune(problems=[p], backends=["triton"], iters=2, log=None)
  assert report.xla_ms[p] == pytest.approx(reference_ms / sets)
  ok = [t for t in report.trials if t.status == "ok"]
  assert ok and all(t.xla_time_ms == pytest.approx(reference_ms / sets) for t in ok)
  assert dispatch.choose(p, "auto").backend == auto


class LuckyFirstTimer:
  """XLA's dot and every kernel take 1.0 ms, except the first kernel timed:
  0.9 in its first (screening) pair of blocks, 1.05 ever after."""
  label = "fake"

  def __init__(self):
    self.seen = {}   # function -> blocks timed

  def time(self, f, args, iters, chunk=None):
    n = self.seen.setdefault(f, 0)
    self.seen[f] = n + 1
    lucky = len(self.seen) >= 2 and f is list(self.seen)[1]   # the first kernel
    return [(0.9 if n < 2 else 1.05) if lucky else 1.0] * iters


def test_autotune_ranks_close_contenders_by_a_second_timing(cache, monkeypatch):
  """A kernel that read 10% faster by luck in its screening timing is timed
  again with the other contenders (here within 20% of its lucky reading) and
  loses on the second timing."""
  monkeypatch.setattr(tuning, "Timer", lambda platform: LuckyFirstTimer())
  monkeypatch.setattr(tuning, "CONTENDER_MARGIN", 0.2)
  p = problem(m=32, n=32, k=32)
  report = jaxgemm.autotune(problems=[p], backends=["triton"], iters=2, log=None)
  ok = [t for t in report.trials if t.status == "ok"]
  assert len(ok) >= 2, report.summary()
  lucky = ok[0]
  assert lucky.time_ms == 1.05 and lucky.note.startswith("contender, timed twice (first 1.111x)")
  assert all(t.time_ms == 1.0 and "timed twice" in t.note for t in ok[1:])
  assert report.best(p) is not lucky and report.best(p).speedup_vs_xla == 1.0

  # Outside the margin nothing is timed again: the lucky reading stands.
  monkeypatch.setattr(tuning, "CONTENDER_MARGIN", 0.05)
  monkeypatch.setattr(tuning, "Timer", lambda platform: LuckyFirstTimer())
  again = jaxgemm.autotune(problems=[p], backends=["triton"], iters=2, retune=True, log=None)
  ok = [t for t in again.trials if t.status == "ok"]
  assert again.best(p) is ok[0] and ok[0].time_ms == 0.9 and not ok[0].note


def test_autotune_never_stores_a_wrong_kernel(cache, monkeypatch):
  monkeypatch.setattr(tuning, "tolerance", lambda p: -1.0)   # every result is "wrong"
  p = problem(m=32, n=32, k=32)
  report = jaxgemm.autotune(problems=[p], backends=["triton"], iters=1, log=None)
  assert report.trials and all(t.status == "fail" for t in report.trials
                               if t.note.split(":")[0] not in ("unsupported", "invalid"))
  assert dispatch.choose(p, "triton").source == "heuristic"
  assert dispatch.choose(p, "auto").backend == "xla"


def test_autotune_time_budget(cache):
  report = jaxgemm.autotune(problems=[problem()], backends=["triton"], time_budget_s=0,
                            log=None)
  assert report.out_of_time == [problem()] and not report.tuned
  assert not cache.exists()


def test_stale_records_are_ignored(table, cache):
  p = problem()
  write(table, p, {("triton", "tensorcore"): record("triton", SMALL, 0.1, version="old")})
  assert dispatch.choose(p, "triton", "tensorcore").source == "heuristic"
  assert dispatch.choose(p, "auto").backend == "xla"
  assert not tuning_cache.has_record(p, KIND, "triton", "tensorcore", table)


def test_kernel_version_follows_the_sources():
  """Every rung of every backend has a version; rungs running other code differ."""
  versions = {}
  for op in registry.ops():
    for name in registry.backends(op):
      backend = registry.get_backend(name, op)
      for variant in backend.variants:
        version = tuning_cache.kernel_version(name, op, variant=variant)
        assert len(version) == 12 and int(version, 16) >= 0, (op, name, variant)
        versions[op, name, variant] = version
  for name, rungs in (("triton", registry.variants("triton")),
                      ("pallas", registry.variants("pallas"))):
    mine = {versions["matmul", name, v] for v in rungs}
    assert len(mine) == len(rungs), (name, mine)   # one module per rung: all differ
  with pytest.raises(ValueError, match="unknown variant='bogus'"):
    tuning_cache.kernel_version("triton", "matmul", variant="bogus")


_KERNEL = textwrap.dedent('''
    """A kernel module."""
    import math

    BLOCK = 128  # the tile


    def tile_count(n):
      """How many tiles cover n."""
      return math.ceil(n / BLOCK)
    ''')


def fake_package(tmp_path, monkeypatch, files: dict[str, str]) -> str:
  """A package of `files` {module: source} importable under a name of its own (a
  name once imported keeps its folder in sys.modules, so every test gets another)."""
  name = "fake_kernels_" + "".join(c for c in tmp_path.name if c.isalnum())
  package = tmp_path / name
  package.mkdir()
  (package / "__init__.py").write_text("")
  for module, source in files.items():   # PACKAGE: the package's name
    (package / f"{module}.py").write_text(textwrap.dedent(source).replace("PACKAGE", name))
  monkeypatch.syspath_prepend(str(tmp_path))
  return name


@pytest.mark.parametrize("edit, same", [
    (lambda s: s.replace("A kernel module.", "A kernel module, documented better."), True),
    (lambda s: s.replace("How many tiles", "The number of tiles that"), True),
    (lambda s: s.replace("# the tile", "# the tile, measured best on the H200"), True),
    (lambda s: s.replace("\n\n\ndef", "\n\ndef") + "\n# trailing note\n", True),
    (lambda s: s.replace("BLOCK = 128", "BLOCK = 64"), False),
    (lambda s: s.replace("math.ceil(n / BLOCK)", "-(-n // BLOCK)"), False),
    (lambda s: s.replace('"""How many tiles cover n."""\n  ', ""), True),
    (lambda s: s + "EXTRA = 1\n", False),
])
def test_kernel_version_ignores_prose_and_follows_code(tmp_path, monkeypatch, edit, same):
  """A docstring or comment edit keeps a kernel's version (the shipped table stays
  current); any code edit changes it (its tuned records go stale)."""
  name = fake_package(tmp_path, monkeypatch, {"rung": _KERNEL})
  before = tuning_cache.modules_version([f"{name}.rung"], follow=name)
  edited = edit(_KERNEL)
  assert edited != _KERNEL
  (tmp_path / name / "rung.py").write_text(edited)
  assert (tuning_cache.modules_version([f"{name}.rung"], follow=name) == before) == same


def test_a_rung_version_follows_its_imports_within_the_package(tmp_path, monkeypatch):
  """A rung hashes its module and what it imports from the package, in every form
  (absolute, relative, a module or a name from it, inside a function), and nothing else."""
  name = fake_package(tmp_path, monkeypatch, {
      "common": "TILE = 64\n",
      "unused": "X = 1\n",
      "basic": "from PACKAGE.common import TILE\n",
      "tiled": "from . import common\n",
      "pipelined": "from PACKAGE import tiled\n",           # a sibling rung
      "late": "def f():\n  from .common import TILE\n  return TILE\n",
      "outside": "import json\nfrom os import path\n",
  })
  hashed = lambda rung: tuning_cache.hashed_modules([f"{name}.{rung}"], follow=name)
  assert hashed("basic") == (name, f"{name}.basic", f"{name}.common")
  assert hashed("pipelined") == (name, f"{name}.common", f"{name}.pipelined", f"{name}.tiled")
  assert hashed("late") == (name, f"{name}.common", f"{name}.late")
  assert hashed("outside") == (name, f"{name}.outside")
  with pytest.raises(ValueError, match="is a package"):
    tuning_cache.hashed_modules([name], follow=name)
  with pytest.raises(ModuleNotFoundError, match="no module"):
    tuning_cache.hashed_modules([f"{name}.gone"], follow=name)


def _edited(monkeypatch, *files: str):
  """Has the version code read `files` (repository paths) with one more line of code,
  as an edit of them would, and forgets the versions computed before."""
  root = Path(jaxgemm.__file__).resolve().parents[1]
  targets = {(root / f).resolve() for f in files}
  assert all(t.is_file() for t in targets), targets
  read = tuning_cache._read_source
  monkeypatch.setattr(tuning_cache, "_read_source", lambda path: read(path) + (
      "EDITED = 1\n" if Path(path).resolve() in targets else ""))
  tuning_cache.kernel_version.cache_clear()


def _all_versions() -> dict[tuple[str, str, str], str]:
  return {(op, name, v): tuning_cache.kernel_version(name, op, variant=v)
          for op in registry.ops() for name in registry.backends(op)
          for v in registry.get_backend(name, op).variants}


def _rungs_of(name: str) -> set[tuple[str, str, str]]:
  return {(op, name, v) for op in registry.ops() if name in registry.backends(op)
          for v in registry.variants(name, op)}


@pytest.fixture
def fresh_versions():
  tuning_cache.kernel_version.cache_clear()
  yield
  tuning_cache.kernel_version.cache_clear()


@pytest.mark.parametrize("edited, changed", [
    # One rung's module: that rung's records alone (in every op running it).
    ("kernels/triton/matmul/persistent.py",
     {("matmul", "triton", "persistent"), ("fused_matmul", "triton", "persistent")}),
    ("kernels/triton/matmul/splitk.py", {("matmul", "triton", "splitk")}),
    ("kernels/pallas/matmul/pingpong.py", {("matmul", "pallas", "pingpong")}),
    ("kernels/pallas/matmul/basic.py", {("matmul", "pallas", "basic")}),
    ("kernels/pallas/scaled_matmul/scaled.py",
     {("scaled_matmul", "pallas", "warp_specialized"),
      ("scaled_matmul", "pallas", "warp_specialized_tma_scales")}),
    ("kernels/triton/matmul/layout.py",   # the tensor-core rungs' layout pass
     {("matmul", "triton", v) for v in ("tensorcore", "persistent", "splitk")}
     | {("fused_matmul", "triton", v) for v in ("tensorcore", "persistent")}
     | {("glu", "triton", "dual")}),
    # A module many rungs import: each of them (a rung importing a sibling rung included).
    ("kernels/pallas/matmul/warp_specialized.py",
     {("matmul", "pallas", v) for v in ("warp_specialized", "clusters", "stream_k", "pingpong")}
     | {("fused_matmul", "pallas", v) for v in ("warp_specialized", "clusters")}
     | {("glu", "pallas", v) for v in ("dual", "dual_clusters")}
     | {("scaled_matmul", "pallas", v)
        for v in ("warp_specialized", "warp_specialized_tma_scales")}),
    ("kernels/pallas/common.py", _rungs_of("pallas")),
    ("kernels/triton/epilogue.py",
     {("matmul", "triton", v) for v in registry.variants("triton")}
     | {("fused_matmul", "triton", v) for v in ("tensorcore", "persistent")}
     | {("glu", "triton", "dual"), ("scaled_matmul", "triton", "blocked"),
        ("scaled_ragged_dot", "triton", "grouped")}),   # through scaled_matmul's kernel
    ("jaxgemm/triton_call.py",
     _rungs_of("triton")
     | {("scaled_matmul", "pallas", v)     # its fp8 transpose is a Triton kernel
        for v in ("warp_specialized", "warp_specialized_tma_scales")}),
    ("jaxgemm/ops/matmul/xla.py", {("matmul", "xla", "dot_general")}),
])
def test_an_edit_stales_exactly_the_rungs_that_run_the_code(
    monkeypatch, fresh_versions, edited, changed):
  before = _all_versions()
  _edited(monkeypatch, edited)
  after = _all_versions()
  assert {k for k in before if before[k] != after[k]} == changed


def test_an_edit_of_the_matmul_heuristics_stales_nothing(monkeypatch, fresh_versions):
  """The tile heuristics choose among configs; a record's config is timed as it is."""
  before = _all_versions()
  _edited(monkeypatch, "jaxgemm/ops/matmul/triton.py", "jaxgemm/ops/matmul/pallas.py")
  assert _all_versions() == before


# Imports of jaxgemm modules outside jaxgemm.kernels from a rung's kernel code that
# do not decide a tuned config's speed (the version does not follow them).
NOT_SPEED = {
    "jaxgemm.gemm": "the GEMM family's layer: GemmProblem in signatures "
                    "(triton/matmul/layout.py), DEFAULT_NUM_SMS where the device cannot say "
                    "(triton/matmul/persistent.py), the FP8 formats; the rest is the API's "
                    "contract, which no kernel runs",
}


def test_every_module_outside_the_kernels_that_a_rung_imports_is_classified():
  """A kernel's import of another jaxgemm module is either hashed (the backend names it
  in `kernel_modules_of`) or known not to decide speed (NOT_SPEED): a new import
  must be classified, so a rung's version cannot silently miss code it runs."""
  missing = {}
  for op in registry.ops():
    for name in registry.backends(op):
      backend = registry.get_backend(name, op)
      for variant in backend.variants:
        roots = backend.kernel_modules_of(variant)
        for module in tuning_cache.hashed_modules(roots):
          if not module.startswith(tuning_cache.KERNELS):
            continue
          spec = tuning_cache._spec(module)
          _, names = tuning_cache._analyse(module, bool(spec.submodule_search_locations),
                                           tuning_cache._read_source(Path(spec.origin)))
          for n in names:
            if (n.startswith("jaxgemm.") and not n.startswith(tuning_cache.KERNELS)
                and tuning_cache._spec(n) is not None and not
                tuning_cache._spec(n).submodule_search_locations
                and n not in roots and n not in NOT_SPEED):
              missing.setdefault(n, set()).add((op, name, variant, module))
  assert not missing, missing


OLD_TRITON = "0fcda76b446b"   # matmul/triton's per-backend version at c3e0863


def test_restamp_makes_current_records_current_and_keeps_stale_ones_stale(cache, table):
  """A record stamped with the per-backend version of c3e0863 reads stale now; the
  restamp makes it current, and leaves a record that was stale then stale."""
  p = problem()
  write(table, p, {("triton", "tensorcore"): record("triton", SMALL, 0.1, version=OLD_TRITON),
                   ("triton", "persistent"): record("triton", OTHER, 0.2, version="older"),
                   ("triton", "gone"): record("triton", OTHER, 0.3, version=OLD_TRITON)})
  assert tuning_cache.lookup(p, KIND) == []
  entries = tuning_cache.load(table)
  new, counts = tuning_cache.restamp(entries, {"matmul/triton": OLD_TRITON})
  assert counts == {"matmul/triton": {"current before": 2, "current after": 1, "stale": 1}}
  versions = {tuning_cache.parse_key(k)[3]: next(iter(v.values()))["version"]
              for k, v in new.items()}
  assert versions == {"tensorcore": tuning_cache.kernel_version("triton", variant="tensorcore"),
                      "persistent": "older", "gone": OLD_TRITON}
  assert entries == tuning_cache.load(table)   # the input is not modified
  table.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": new}))
  assert [(t.variant, t.time_ms) for t in tuning_cache.lookup(p, KIND)] == [("tensorcore", 0.1)]
  # A per-rung old version wins over its backend's; run twice, nothing changes.
  again, _ = tuning_cache.restamp(new, {"matmul/triton": OLD_TRITON,
                                        "matmul/triton/persistent": "older"})
  assert next(iter(again[tuning_cache.entry_key(KIND, "triton", "persistent", p)].values()))[
      "version"] == tuning_cache.kernel_version("triton", variant="persistent")
  assert again[tuning_cache.entry_key(KIND, "triton", "tensorcore", p)] == new[
      tuning_cache.entry_key(KIND, "triton", "tensorcore", p)]


def test_tables_off_reads_no_table(cache, table, monkeypatch):
  p = problem(m=24, n=24, k=24)
  key = tuning_cache.entry_key(KIND, "triton", "tensorcore", p)
  tuning_cache.store(table, {key: {p.shape_key(): stamped(record("triton", SMALL, 0.5),
                                                          "triton", "tensorcore")}})
  assert [t.source for t in tuning_cache.lookup(p, KIND)] == ["table"]
  monkeypatch.setenv(tuning_cache.TABLES_ENV, "off")
  assert tuning_cache.lookup(p, KIND) == []


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99, "entries": {}}),
                                     json.dumps({"format": 1, "entries": []}), ""])
def test_corrupt_cache_is_reported_and_ignored(cache, rng, content):
  cache.parent.mkdir()
  cache.write_text(content)
  p = problem(m=24, n=24, k=24)
  with pytest.warns(tuning_cache.TuningCacheWarning, match="ignoring the tuning file"):
    c = dispatch.choose(p, "triton", "tensorcore")
  assert c.source == "heuristic"
  a, b = random_array(rng, (24, 24), F32), random_array(rng, (24, 24), F32)
  ref, bound = matmul_reference(a, b)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", tuning_cache.TuningCacheWarning)
    assert_gemm_close(jaxgemm.matmul(a, b), ref, bound, tolerance(F32), "corrupt cache")
    # Tuning again replaces the corrupt file with a good one.
    jaxgemm.autotune(problems=[p], backends=[], iters=1, log=None)
  assert json.loads(cache.read_text())["format"] == tuning_cache.FORMAT


def test_unreadable_cache_is_reported_and_ignored(cache):
  cache.mkdir(parents=True)   # a folder where the file should be: reading fails
  with pytest.warns(tuning_cache.TuningCacheWarning):
    assert tuning_cache.lookup(problem(), KIND, cache_path=cache) == []
  assert dispatch.choose(problem(), "auto").backend == "xla"


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from pathlib import Path
    from jaxgemm import tuning_cache
    from jaxgemm import GemmProblem
    path, worker = Path(sys.argv[1]), int(sys.argv[2])
    f32 = np.dtype("float32")
    for i in range(25):
      p = GemmProblem(1, 16 * (worker + 1), 16, 16 * (i + 1), f32, f32, f32)
      key = tuning_cache.entry_key("cpu", "xla", "dot_general", p)
      tuning_cache.store(path, {key: {p.shape_key(): {
          "config": {}, "time_ms": 1.0, "xla_time_ms": 1.0, "version": "v"}}})
""")


def test_concurrent_writers_lose_nothing(tmp_path):
  path = tmp_path / "shared.json"
  procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w)])
           for w in range(4)]
  assert all(p.wait(timeout=300) == 0 for p in procs)
  entries = json.loads(path.read_text())["entries"]
  shapes = {s for v in entries.values() for s in v}
  assert len(shapes) == 4 * 25
  assert not list(tmp_path.glob("*.tmp")), "temporary files left behind"


# ---------------------------------------------------------------- finding GEMMs

def test_problems_in_finds_forward_backward_and_nested_gemms():
  x = jax.ShapeDtypeStruct((8, 16), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)

  def f(w, x):
    def body(h, _):
      return jaxgemm.matmul(h, jnp.ones((32, 32), h.dtype)), None
    h = jax.checkpoint(lambda x: jaxgemm.matmul(x, w))(x)
    h, _ = jax.lax.scan(body, h, None, length=2)
    return h.astype(jnp.float32).sum()

  forward = jaxgemm.problems_in(f, w, x, backward=False)
  assert [(p.m, p.n, p.k) for p in forward] == [(8, 32, 16), (8, 32, 32)]
  with_grads = jaxgemm.problems_in(f, w, x)
  flags = {(p.m, p.n, p.k, p.trans_a, p.trans_b) for p in with_grads}
  assert {(8, 16, 32, False, True), (16, 32, 8, True, False)} <= flags
  # jax.grad of f traced directly finds the same backward GEMMs.
  grad_flags = {(p.m, p.n, p.k, p.trans_a, p.trans_b)
                for p in jaxgemm.problems_in(jax.grad(f), w, x, backward=False)}
  assert grad_flags <= flags


def test_every_backends_tuning_candidates_are_valid():
  for p in (problem(), problem(m=4096, n=4096, k=4096, dtype=BF16),
            problem(m=128, n=8192, k=8192, dtype=BF16)):
    for name in jaxgemm.backends():
      b = registry.get_backend(name)
      try:
        candidates = b.tuning_candidates(p)
      except NotImplementedError:
        continue
      assert candidates, name
      for variant, config in candidates:
        assert variant in b.variants
        assert isinstance(config, b.config_cls)
        try:
          b.check(p, variant, config)
        except NotImplementedError:
          pass   # e.g. pallas on float32: the autotuner skips it, saying why


def test_choice_describe_is_json():
  c = dispatch.choose(problem(), "xla")
  assert json.loads(c.describe().split(" ", 2)[2]) == {"backend": "xla"}
  assert dataclasses.asdict(c)["source"] == "heuristic"


def test_auto_falls_back_to_xla_with_one_warning_when_a_kernel_cannot_be_built(
    table, monkeypatch, rng):
  """backend="auto" never fails where jnp.matmul works: a tuned kernel that cannot be
  built here (a compile error, a missing package, a resource limit) is replaced by
  XLA's dot, with one warning naming the kernel and the cause."""

  class Broken(registry.Backend):
    op, name, variants = "matmul", "broken", ("only",)
    config_cls = jaxgemm.XlaConfig
    kernel_modules = ("jaxgemm.ops.matmul.xla",)

    def check(self, problem, variant, config):
      pass

    def default_config(self, problem, variant):
      return jaxgemm.XlaConfig()

    def impl(self, problem, variant, config, platform):
      raise RuntimeError("out of resources: shared memory, required 300000, limit 232448")

  monkeypatch.setitem(registry._BACKENDS["matmul"], "broken", Broken())
  monkeypatch.setattr(dispatch, "_warned_fallbacks", set())
  p = problem()
  write(table, p, {("broken", "only"): record("broken", None, 0.5),
                   ("xla", "dot_general"): record("xla", None, 1.0)})
  assert dispatch.choose(p, "auto").backend == "broken"
  a, b = random_array(rng, (p.m, p.k), F32), random_array(rng, (p.k, p.n), F32)
  ref, bound = matmul_reference(a, b)
  with pytest.warns(dispatch.KernelFallbackWarning,
                    match=r"broken/only .*out of resources: shared memory.*running XLA"):
    out = jax.jit(lambda a, b: jaxgemm.matmul(a, b))(a, b)
  assert_gemm_close(out, ref, bound, tolerance(F32), "fallback")
  with warnings.catch_warnings():
    warnings.simplefilter("error", dispatch.KernelFallbackWarning)   # once per cause
    out = jax.jit(lambda a, b: 2 * jaxgemm.matmul(a, b))(a, b)
  assert_gemm_close(out / 2, ref, bound, tolerance(F32), "fallback, again")
  # A named backend is what the caller asked for: its failure is raised.
  with pytest.raises(RuntimeError, match="out of resources"):
    jaxgemm.matmul(a, b, backend="broken")


# ---------------------------------------------------------------- the fitted rule

def write_rule(k=1, margin=1.5, align_penalty=0.5, kinds=(KIND,)):
  (tuning_cache.TABLES_DIR / tuning_cache.RULE_FILE).write_text(json.dumps(
      {"k": k, "margin": margin, "align_penalty": align_penalty,
       "records": {"device_kinds": list(kinds)}}))


def measured(path, problems: dict) -> None:
  """A table of measured problems: {problem: triton's speedup over XLA on it}."""
  xla = registry.get_backend("xla").variants[-1]
  entries = {}
  for p, speedup in problems.items():
    for (b, v), r in {(("triton", "tensorcore")): record("triton", SMALL, 1.0 / speedup),
                      ("xla", xla): record("xla", None, 1.0)}.items():
      entries.setdefault(tuning_cache.entry_key(KIND, b, v, p), {})[p.shape_key()] = (
          stamped(r, b, v))
  path.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": entries}))


def test_the_rule_decides_from_the_nearest_measured_problems(table):
  """Where the shipped rule's sweep measured the device, a problem with no record of its
  own runs the kernel its k nearest measured problems all ran `margin` faster, with the
  nearest one's config; below the margin, or with no neighbour, XLA."""
  near, far = problem(m=64, n=48, k=32), problem(m=4096, n=4096, k=4096)
  measured(table, {near: 2.0, far: 1.1})
  write_rule(k=1, margin=1.5)
  c = dispatch.choose(problem(m=60, n=44, k=32), "auto")
  assert (c.backend, c.variant, c.source, c.config) == ("triton", "tensorcore", "rule", SMALL)
  assert dispatch.choose(problem(m=3000, n=4000, k=4096), "auto").backend == "xla"  # 1.1x
  write_rule(k=2, margin=1.5)        # the worst of the two nearest: 1.1x, under the margin
  assert dispatch.choose(problem(m=60, n=44, k=32), "auto").backend == "xla"
  write_rule(k=2, margin=1.05)
  assert dispatch.choose(problem(m=60, n=44, k=32), "auto").source == "rule"
  # another op or dtype has no neighbours here: XLA, not a structural guess
  assert dispatch.choose(problem(m=60, n=44, k=32, dtype=BF16), "auto").source == "fallback"


def test_the_rule_leaves_measured_problems_and_other_cards_alone(table):
  p = problem(m=64, n=48, k=32)
  measured(table, {p: 0.5})          # measured itself: XLA won, the records decide
  write_rule(k=1, margin=1.0)
  assert dispatch.choose(p, "auto").source == "fallback"
  write_rule(k=1, margin=1.0, kinds=("NVIDIA H100 80GB HBM3",))   # not this card
  assert tuning_cache.rule_for(KIND) is None
  write_rule(k=1, margin=1.0, align_penalty=None)   # other alignment: never a neighbour
  unaligned = problem(m=60, n=45, k=33)
  assert not unaligned.aligned and not tuning_cache.neighbours(unaligned, KIND, 1, None)
