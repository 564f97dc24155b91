"""CPU tests of the benchmark (bench/, installed as jaxgemm.bench).

The problem tables (shapes that really are what their suite says), the
correctness gate (a wrong kernel is a failure row, never a time), the CSV,
report and plots from a small real CPU run and from a synthetic GPU-like CSV,
jaxgemm's default (backend="auto") as a row of its own, the generated blocks
of README.md and docs/ladders.md, the runs' history CSV, and the CLI's --list.
Only the xla backend, the default (XLA's dot on a CPU) and fake kernels run
here, so the file stays fast whatever backends are registered.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from bench_testing import cpu_context
import jaxgemm
from gemm_testing import DriftingTimer
from jaxgemm import registry, timing, tuning_cache
from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import history as H
from jaxgemm.bench import problems as P
from jaxgemm.bench import runner
from jaxgemm.bench import suites as S
from jaxgemm.bench import training as T
from jaxgemm.bench.ops import matmul as MM
from jaxgemm.bench.ops import sharded as SH
from jaxgemm.bench.report import csvio, plots, tables, view
from jaxgemm.bench.report.make import generate

REPO = Path(__file__).resolve().parent.parent
ALL_PROBLEMS = [p for probs in P.SUITES.values() for p in probs]


# ---------------------------------------------------------------- problem tables

def test_random_suites_are_fixed_draws():
  """The development set is what issue 23 asks for, and the same draw every time."""
  dev, holdout = P.SUITES["random"], P.SUITES["random-holdout"]
  assert len(dev) >= 40
  assert {p.dtype for p in dev} == {"bf16", "fp16", "fp32"}
  assert {p.layout for p in dev} == {"NN", "NT", "TN", "TT"}
  assert {p.note for p in dev} == {"aligned", "as drawn"}
  assert all(1 <= x <= 16384 for p in dev + holdout for x in (p.m, p.k, p.n))
  assert any(p.m <= 16 for p in dev)
  assert all(x % 64 == 0 or x & (x - 1) == 0
             for p in dev if p.note == "aligned" for x in (p.m, p.k, p.n))
  # Pinned: a numpy that drew differently would silently change the set.
  assert dev[0].name == "r00.8x256x4.fp16.NN" and dev[47].name == "r47.24x4188x16083.fp32.TN"
  assert not {(p.m, p.k, p.n) for p in dev} & {(p.m, p.k, p.n) for p in holdout}
  assert P.random_problems("random", P.RANDOM_SEED, P.RANDOM_COUNT) == dev


def test_suites_are_named_and_nonempty():
  assert set(S.ALL_SUITES) == {"square", "llm", "skinny", "unaligned", "backward", "random",
                               "random-holdout", "tiny", "training", "moe", "moe-fine", "moe-tiny",
                               "epilogue", "epilogue-tiny", "fp8", "fp8-tiny", "fp8-moe",
                               "fp8-moe-tiny", "sharded", "heldout", "heldout-tiny", "models"}
  for name, probs in P.SUITES.items():
    assert probs, name
    assert all(p.suite == name for p in probs)
    assert len({p.name for p in probs}) == len(probs), f"duplicate names in {name}"
    assert any(p.default for p in probs), f"{name} has no default problems"
  for s in S.GPU_DEFAULT_SUITES:
    assert s in S.ALL_SUITES
  # every suite measures one registered op
  assert set(S.SUITE_OP) == set(S.ALL_SUITES)
  assert set(S.SUITE_OP.values()) <= set(jaxgemm.registry.ops())
  # the default GPU run has ladder problems, and --quick has some of every suite
  assert any(p.ladder and p.default for s in S.GPU_DEFAULT_SUITES if s in P.SUITES
             for p in P.SUITES[s])
  for s in ("square", "llm", "skinny", "unaligned", "backward"):
    assert S.select(s, default_only=True, quick=True), s


@pytest.mark.parametrize("bp", ALL_PROBLEMS, ids=lambda p: f"{p.suite}-{p.name}")
def test_problem_shapes_match_dot_general(bp):
  """Stored operand shapes, dimension numbers and output agree, as lax sees them."""
  assert min(bp.m, bp.k, bp.n, bp.batch) >= 1
  a = jax.ShapeDtypeStruct(bp.a_shape(), jnp.bfloat16)
  b = jax.ShapeDtypeStruct(bp.b_shape(), jnp.bfloat16)
  out = jax.eval_shape(lambda a, b: lax.dot_general(a, b, bp.dimension_numbers()), a, b)
  assert out.shape == bp.out_shape()
  gp = runner.gemm_problem(bp, "bf16")
  assert gp.flops == bp.flops
  assert gp.min_bytes == bp.min_bytes("bf16")
  assert (gp.trans_a, gp.trans_b) == (bp.trans_a, bp.trans_b)


def test_suites_hold_what_they_say():
  sq = P.SUITES["square"]
  assert all(p.m == p.k == p.n for p in sq)
  sizes = {p.m for p in sq}
  assert {256, 16384} <= sizes and any(s & (s - 1) for s in sizes)   # some non-powers of two
  assert all(any(x % 16 for x in (p.m, p.k, p.n)) for p in P.SUITES["unaligned"])
  assert any((p.m, p.k, p.n) == (4095, 4097, 4093) for p in P.SUITES["unaligned"])
  assert all(p.m <= 256 and p.k >= 4096 and p.n >= 4096 for p in P.SUITES["skinny"])
  tokens = {p.m for p in P.SUITES["llm"]}
  assert min(tokens) == 1 and max(tokens) == 16384
  assert {p.k for p in P.SUITES["llm"]} >= {4096, 8192, 14336, 28672}


def test_backward_suite_is_forward_and_both_gradients():
  probs = {p.name: p for p in P.SUITES["backward"]}
  fwds = [p for n, p in probs.items() if n.endswith(".fwd")]
  assert fwds
  for f in fwds:
    stem = f.name[: -len(".fwd")]
    dgrad, wgrad = probs[stem + ".dgrad"], probs[stem + ".wgrad"]
    t, d_in, d_out = f.m, f.k, f.n
    assert f.layout == "NN"
    assert (dgrad.m, dgrad.k, dgrad.n, dgrad.layout) == (t, d_out, d_in, "NT")
    assert (wgrad.m, wgrad.k, wgrad.n, wgrad.layout) == (d_in, t, d_out, "TN")


def test_rotation_covers_twice_l2_for_small_problems():
  l2 = 60 * 2**20
  assert timing.rotation(10 * 2**30, l2, 32) == 1          # large: one set
  assert timing.rotation(2 * l2, l2, 32) == 1
  assert timing.rotation(40 * 2**20, l2, 32) == 3           # 3 x 40 MB >= 120 MB
  assert timing.rotation(1000, l2, 32) == 32                # capped


# ---------------------------------------------------------------- timing helpers

def test_summarize_and_cupti_result_shapes():
  s = timing.summarize(list(range(1, 101)))
  assert s["median_ms"] == pytest.approx(50.5) and s["n"] == 100
  assert s["p10_ms"] < s["median_ms"] < s["p90_ms"] and s["min_ms"] == 1
  assert timing._as_list(1.5, 1) == [1.5]
  assert timing._as_list([1.0, 2.0], 2) == [1.0, 2.0]
  assert timing._as_list([[("k1", 1.0), ("k2", 0.5)]], 1) == [1.5]   # aggregate=False form
  with pytest.raises(RuntimeError):
    timing._as_list(None, 3)
  t = timing.Timer("cpu")
  assert not t.is_device_timer and t.label.startswith("wallclock")
  assert len(t.time(jax.jit(lambda x: x + 1), (jnp.ones(4),), 3)) == 3


def test_cupti_path_with_a_fake_profiler():
  """The GPU timer's plumbing, with measure() faked: both signatures, and the fallback."""
  calls = []

  def measure(f, *, aggregate=True, iterations=1):
    def wrapper(*args):
      calls.append(iterations)
      out = f(*args)
      return out, (0.5 if iterations == 1 else [0.5 + i for i in range(iterations)])
    return wrapper

  f = jax.jit(lambda x: x * 2)
  x = jnp.ones(8)
  t = timing.Timer("cpu")
  t._measure, t._takes_iterations = measure, True
  assert t.label == "cupti" and t.is_device_timer
  assert t.time(f, (x,), 20) == [0.5 + i for i in range(20)] and calls == [20]
  t._takes_iterations = False                     # an older measure(f) without iterations
  assert t.time(f, (x,), 3) == [0.5, 0.5, 0.5]

  def unusable(f, **kw):
    def wrapper(*args):
      raise RuntimeError("CUPTI profiling is not supported on this platform")
    return wrapper

  t._measure = unusable
  assert len(t.time(f, (x,), 4)) == 4             # fell back to the wall clock...
  assert t.label.startswith("wallclock (CUPTI failed")   # ...and says so

  def inconsistent(f, **kw):
    def wrapper(*args):
      raise RuntimeError("Kernel names are not consistent across iterations")
    return wrapper

  t = timing.Timer("cpu")
  t._measure, t._takes_iterations, t._worked = inconsistent, True, True
  with pytest.raises(RuntimeError):               # a problem of this function: its row errs
    t.time(f, (x,), 20)
  assert t.label == "cupti"


# ---------------------------------------------------------------- correctness gate


def _fake_factory(bp, dtype_name, backend, variant):
  """Real kernels for real backends; deliberately broken ones for backend 'fake'."""
  if backend != "fake":
    return runner.kernel_fn(bp, dtype_name, backend, variant)
  ref = runner.ref_fn(bp, dtype_name)
  if variant == "scaled":          # 5% off everywhere
    return lambda a, b: (ref(a, b).astype(jnp.float32) * 1.05).astype(ref(a, b).dtype)
  if variant == "drops_last_k":    # forgets one column of K (a classic tail bug)
    def f(a, b):
      return ref(a.at[..., -1].set(0), b)
    return f
  if variant == "nan":
    return lambda a, b: ref(a, b) * jnp.nan
  if variant == "unsupported":
    def f(a, b):
      raise NotImplementedError("fake: this dtype is not supported")
    return f
  if variant == "crash":
    def f(a, b):
      raise RuntimeError("fake: kernel exploded")
    return f
  raise AssertionError(variant)


def test_wrong_results_are_failures_never_times():
  bp = P.BenchProblem("tiny", "gate", 48, 96, 40)
  rows = []
  kernels = [("xla", "dot_general", ""), ("fake", "scaled", ""), ("fake", "drops_last_k", ""),
             ("fake", "nan", ""), ("fake", "unsupported", ""), ("fake", "crash", "")]
  out = runner.run_problem(cpu_context(rows), bp, kernels, make_fn=_fake_factory)
  assert out == rows
  by = {(r["backend"], r["variant"]): r for r in rows}
  ref = by[(runner.REF, runner.REF_VARIANT)]
  assert ref["status"] == "ok" and ref["time_ms_median"] > 0
  good = by[("xla", "dot_general")]
  assert good["status"] == "ok" and good["error"] <= runner.TOLERANCE["bf16"]
  assert good["time_ms_median"] > 0 and good["speedup_vs_xla"] > 0
  for v in ("scaled", "drops_last_k", "nan"):
    r = by[("fake", v)]
    assert r["status"] == "fail", (v, r)
    assert "time_ms_median" not in r and "tflops" not in r
    assert "wrong result" in r["note"]
  assert by[("fake", "scaled")]["error"] == pytest.approx(0.05, rel=0.2)
  assert by[("fake", "unsupported")]["status"] == "unsupported"
  assert by[("fake", "crash")]["status"] == "error"
  assert "exploded" in by[("fake", "crash")]["note"]


def test_transposed_layouts_go_through_dot_general():
  rows = []
  for bp in P.SUITES["tiny"]:
    if bp.layout != "NN" or bp.batch > 1:
      runner.run_problem(cpu_context(rows), bp, [("xla", "dot_general", "")])
  assert rows and all(r["status"] == "ok" for r in rows), rows


def test_exclude_patterns():
  assert runner.excluded(("pallas/clusters",), "pallas", "clusters", "sq64")
  assert runner.excluded(("pallas",), "pallas", "basic", "sq64")
  assert runner.excluded(("triton/*@sq1*",), "triton", "naive", "sq16384")
  assert not runner.excluded(("triton/*@sq1*",), "triton", "naive", "u100")
  assert not runner.excluded((), "xla", "dot_general", "x")


# ---------------------------------------------------------------- jaxgemm's default (auto)

def test_auto_is_one_kernel_on_every_problem_under_every_policy():
  bp = next(p for p in P.SUITES["tiny"] if p.ladder)
  for policy in ("ladder", "best", "all", ["dot_general"]):
    ks = runner.choose_kernels(bp, [runner.AUTO, "xla"], policy, "bf16")
    assert ks[0] == (runner.AUTO, runner.AUTO_VARIANT, ""), policy
    assert ("xla", "dot_general", "") in ks and len(ks) == 2, policy
  assert runner.choose_kernels(bp, ["xla"], "best", "bf16") == [("xla", "dot_general", "")]


def test_auto_row_records_what_dispatch_chose():
  """Without tuned records the default is XLA's dot through jaxgemm ("fallback")."""
  bp = P.BenchProblem("tiny", "auto", 48, 96, 40)
  rows = []
  runner.run_problem(cpu_context(rows), bp, [(runner.AUTO, runner.AUTO_VARIANT, "")])
  ref, auto = rows
  assert ref["backend"] == runner.REF and ref["status"] == "ok"
  assert (auto["backend"], auto["variant"], auto["status"]) == ("auto", "default", "ok")
  assert auto["chosen"] == "xla/dot_general (fallback)"
  assert json.loads(auto["config"]) == {"backend": "xla"}
  assert auto["speedup_vs_xla"] > 0 and auto["error"] <= runner.TOLERANCE["bf16"]


@pytest.mark.skipif("triton" not in jaxgemm.backends(), reason="needs the triton backend")
def test_tuned_table_decides_the_default_and_the_recorded_kernel(monkeypatch):
  """A (fake) shipped-table record: auto runs it, and the rows say so, config included."""
  bp = P.BenchProblem("tiny", "tuned", 32, 32, 32)
  gp = runner.gemm_problem(bp, "bf16")
  triton = registry.get_backend("triton")
  heuristic = runner.choice(bp, "bf16", "triton")
  variant = next(v for v in triton.variants if v != heuristic.variant and v != "naive")
  config = dataclasses.replace(triton.default_config(gp, variant), num_warps=2)
  triton.check(gp, variant, config)
  record = tuning_cache.Tuned("triton", variant, config.to_dict(), time_ms=1.0, xla_time_ms=2.0,
                              shape="1x32x32x32", source="table")
  monkeypatch.setattr(tuning_cache, "lookup",
                      lambda problem, kind, backend=None, **kw:
                      [record] if backend in (None, "triton") else [])
  assert runner.default_variant("triton", bp, "bf16") == variant
  rows = []
  runner.run_problem(cpu_context(rows), bp, [(runner.AUTO, runner.AUTO_VARIANT, ""),
                                       ("triton", variant, "")])
  by = {r["backend"]: r for r in rows}
  assert by["auto"]["chosen"] == f"triton/{variant} (table)"
  assert by["auto"]["config"] == by["triton"]["config"] == config.to_json()
  assert "chosen" not in by["triton"]   # a named kernel's row is as before
  # it ran and was checked (an interpreted call may be too slow to time: "skipped")
  assert by["auto"]["status"] in ("ok", "skipped"), by["auto"]
  assert by["auto"]["error"] <= runner.TOLERANCE["bf16"]


# ---------------------------------------------------------------- training

SMALL = T.ModelConfig(batch=1, seq=8, d_model=32, n_heads=2, d_ff=64, n_layers=1, vocab=32,
                      steps=3)


def test_training_detects_a_wrong_gemm():
  """A model whose GEMMs are 20% off trains to a different loss: a failure row."""
  def mm_factory(backend, variant):
    if backend == runner.REF:
      return lambda x, w: jnp.matmul(x, w)
    return lambda x, w: (jnp.matmul(x, w).astype(jnp.float32) * 1.2).astype(x.dtype)

  rows = []
  out = T.run_training(cpu_context(rows), ["xla"], ["dot_general"], cfg=SMALL, mm_factory=mm_factory)
  assert out == rows
  steps = {r["backend"]: r for r in out if r["kind"] == "train_step"}
  assert steps[runner.REF]["status"] == "ok"
  assert steps["xla"]["status"] == "fail" and steps["xla"]["agree"] == 0
  assert "time_ms_median" not in steps["xla"]
  losses = [r for r in out if r["kind"] == "train_loss"]
  assert len(losses) == 2 * SMALL.steps


def test_kernels_are_timed_interleaved_with_xla():
  """XLA's dot is timed in blocks around the kernel's (reference, kernel,
  kernel, reference), after one untimed call that sizes the blocks: a clock
  that slows during the problem must not favour whichever is timed first."""
  timer = DriftingTimer()
  kernel_ms, ref_ms = timing.time_paired(timer, "kernel", "xla", (), 20)
  # 1 ms calls: blocks of 10 (iters / 2, the cap) fill PAIR_BLOCK_MS.
  assert timer.calls == [("xla", 1), ("xla", 10), ("kernel", 10), ("kernel", 10), ("xla", 10)]
  assert len(kernel_ms) == len(ref_ms) == 20
  # The same function under the same drift measures the same (timed one after
  # the other it would read 10% apart).
  ratio = runner.summarize(ref_ms)["median_ms"] / runner.summarize(kernel_ms)["median_ms"]
  assert ratio == pytest.approx(1.0, abs=0.01)
  assert len(timing.time_paired(DriftingTimer(), "k", "x", (), 3)[0]) == 3   # the CPU's 3 iters


class TwoSpeedTimer:
  """A power-capped GPU: 5 ms calls that run at full clocks for 8 calls, then 15%
  slower for 8, and so on, counting every call of either function."""
  label = "fake"

  def __init__(self):
    self.clock = 0
    self.calls = []

  def time(self, f, args, iters, chunk=None):
    self.calls.append((f, iters))
    out = [5.0 * (1.15 if (self.clock + i) // 8 % 2 else 1.0) for i in range(iters)]
    self.clock += iters
    return out


def test_long_calls_alternate_every_few_calls():
  """Calls of 5 ms alternate in blocks of two (about PAIR_BLOCK_MS), so a
  function compared with itself reads 1x on a GPU whose clocks change every
  few calls; blocks of ten (the old iters / 2) read it 13% off."""
  timer = TwoSpeedTimer()
  kernel_ms, ref_ms = timing.time_paired(timer, "kernel", "xla", (), 20)
  assert timer.calls[0] == ("xla", 1)
  assert {n for _, n in timer.calls[1:]} == {2}
  assert len(kernel_ms) == len(ref_ms) == 20
  assert np.median(ref_ms) / np.median(kernel_ms) == pytest.approx(1.0, abs=1e-9)
  old = timing.time_paired(TwoSpeedTimer(), "kernel", "xla", (), 20, block_ms=1e9)
  assert abs(np.median(old[1]) / np.median(old[0]) - 1) > 0.1


def test_training_step_is_timed_interleaved_with_xla():
  """The same model on XLA twice under a drifting clock: paired timing reads ~1x
  (the old sequential timing read 0.91x: XLA's step timed in the first block)."""
  rows = []
  ctx = cpu_context(rows)
  ctx.timer, ctx.iters = DriftingTimer(), 4
  mm_factory = lambda backend, variant: (lambda x, w: jnp.matmul(x, w))
  T.run_training(ctx, ["xla"], ["dot_general"], cfg=SMALL, mm_factory=mm_factory)
  steps = {r["backend"]: r for r in rows if r["kind"] == "train_step"}
  ref, paired = steps[runner.REF], steps["xla"]
  assert ref["time_ms_median"] == 1.0 and paired["status"] == "ok"
  assert paired["xla_time_ms"] != ref["time_ms_median"]
  assert paired["speedup_vs_xla"] == pytest.approx(1.0, abs=0.01)


# ---------------------------------------------------------------- a CPU run, its CSV and report

@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  rc = cli.main(["--suite", "tiny,training", "--quick", "--backends", "auto,xla", "--iters", "3",
                 "--training-steps", "3", "--out", str(out), "--run-name", "cpu-test"])
  assert rc == 0
  return out / "cpu-test"


def test_cpu_run_writes_csv_with_provenance(cpu_run):
  rows = csvio.read_csv(cpu_run / "results.csv")
  with open(cpu_run / "results.csv", newline="") as f:
    assert next(csv.reader(f)) == csvio.COLUMNS
  kinds = {r["kind"] for r in rows}
  assert {"copy_bw", "gemm", "train_step", "train_loss"} <= kinds
  for r in rows:
    for field in ("device", "jax", "jaxlib", "triton", "git_commit", "date", "timer",
                  "input_dist", "platform"):
      assert r[field], (field, r)
    assert r["timer"].startswith("wallclock")
    assert r["platform"] == "cpu"
  gemm = [r for r in rows if r["kind"] == "gemm"]
  names = {r["problem"] for r in gemm}
  assert names == {p.name for p in S.select("tiny", default_only=True, quick=True)}
  assert all(r["status"] == "ok" for r in gemm), [r for r in gemm if r["status"] != "ok"]
  for r in gemm:
    assert float(r["time_ms_median"]) > 0 and int(r["iters"]) == 3
    assert float(r["time_ms_p10"]) <= float(r["time_ms_median"]) <= float(r["time_ms_p90"])
    if r["backend"] == "xla":
      assert float(r["error"]) <= runner.TOLERANCE["bf16"]
      assert float(r["speedup_vs_xla"]) > 0
  # jaxgemm's default has a row on every problem, saying what it ran
  auto = {r["problem"]: r for r in gemm if r["backend"] == "auto"}
  assert set(auto) == names
  for r in auto.values():
    assert r["variant"] == "default" and r["chosen"] == "xla/dot_general (fallback)"
    assert json.loads(r["config"]) == {"backend": "xla"}
  assert not any(r["chosen"] for r in gemm if r["backend"] != "auto")
  train = {r["backend"]: r for r in rows if r["kind"] == "train_step"}
  for b in ("xla", "auto"):
    assert train[b]["agree"] == "1" and train[b]["status"] == "ok", train[b]
    assert float(train[b]["tokens_per_s"]) > 0 and float(train[b]["speedup_vs_xla"]) > 0
  assert train["auto"]["variant"] == "default"


def test_cpu_report_says_not_gpu_and_has_plots(cpu_run):
  report = (cpu_run / "REPORT.md").read_text()
  head = report[:600]
  assert "NOT GPU TIMINGS" in head and "no GPU was found" in head
  assert "## Headline" in report and "## Kernel ladders" in report
  assert "## Training step" in report and "| auto/default | ok |" in report
  # the default: headline columns, its own section with a row per problem, no ladder
  head = report[report.index("## Headline"):report.index("## Defaults")]
  assert "default (auto) vs XLA (geomean)" in head
  defaults = report[report.index("## Defaults (backend='auto') vs XLA"):
                    report.index("## Kernel ladders")]
  for p in S.select("tiny", default_only=True, quick=True):
    assert f"| tiny | {p.name} |" in defaults
  assert "xla/dot_general (fallback)" in defaults and "- training step" in defaults
  assert "#### Ladder: backend `auto`" not in report
  # the targets are GPU numbers: a CPU run neither meets nor misses them
  assert "target n/a (not a GPU run)" in defaults and "NOT met" not in report
  # a training step's ratio shows the two times it is made of (XLA's timed beside it)
  step = {r["backend"]: r for r in csvio.read_csv(cpu_run / "results.csv")
          if r["kind"] == "train_step"}["auto"]
  times = f"(XLA {float(step['xla_time_ms']):.3f} / {float(step['time_ms_median']):.3f} ms)"
  assert times in next(x for x in report.splitlines() if x.startswith("| auto/default | ok |"))
  tables = (cpu_run / "README_TABLES.md").read_text()
  assert "NOT GPU TIMINGS" in tables and "#### Defaults (backend='auto') vs XLA" in tables
  # the README's block is for users: the ladders are in docs/ladders.md
  assert "#### Ladder:" not in tables and "plots/ladder.png" not in tables
  for name in ("tflops_vs_size.png", "ladder.png", "training_loss.png"):
    png = cpu_run / "plots" / name
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert f"plots/{name}" in report


def test_report_subcommand_regenerates_from_csv(cpu_run, tmp_path):
  assert cli.main(["report", str(cpu_run / "results.csv"), "--out", str(tmp_path),
                   "--no-docs"]) == 0
  regenerated = (tmp_path / "REPORT.md").read_text()
  original = (cpu_run / "REPORT.md").read_text()
  section = slice(original.index("## Headline"), original.index("## Plots"))
  assert regenerated[regenerated.index("## Headline"):regenerated.index("## Plots")] == \
      original[section]
  assert (tmp_path / "plots" / "ladder.png").exists()
  assert (tmp_path / "README_TABLES.md").exists()
  # several CSVs merge into one run
  merged = tmp_path / "merged"
  assert cli.main(["report", str(cpu_run / "results.csv"), str(cpu_run / "results.csv"),
                   "--out", str(merged), "--no-docs"]) == 0
  n = len(csvio.read_csv(cpu_run / "results.csv"))
  assert len(csvio.read_csv(merged / "results.csv")) == 2 * n


# ---------------------------------------------------------------- a synthetic GPU CSV

# The default's speedup in the synthetic run: above target but for one llm problem,
# and far ahead of every backend on skinny (where `best` must still not count it).
AUTO_SPEEDUP = {"square": 1.05, "llm": 1.05, "skinny": 2.5}
AUTO_SLOW = P.SUITES["llm"][0].name   # 0.95x: below the 0.97x floor


def _synthetic_gpu_csv(path):
  """Rows as an H200 run would write them, for two fake backends and the default
  (backend="auto") (no GPU needed)."""
  prov = {"platform": "gpu", "device": "NVIDIA H200", "driver": "580.0", "jax": "0.11.2",
          "jaxlib": "0.11.2", "triton": "3.6.0", "git_commit": "abc", "date": "2026-11-22",
          "timer": "cupti", "input_dist": runner.INPUT_DIST, "run_id": "h200-test",
          "dtype": "bf16"}
  rows = [{**prov, "suite": "copy", "kind": "copy_bw", "backend": "xla", "variant": "negate",
           "status": "ok", "gbps": 4300}]
  ladders = {"tri": ["naive", "tiled", "best"], "pal": ["basic", "best"]}
  probs = ([p for p in P.SUITES["square"] if p.default] + P.SUITES["llm"][:6]
           + P.SUITES["skinny"][:3])
  for bp in probs:
    xla_t = bp.flops / 700e12 * 1e3
    base = {**prov, "suite": bp.suite, "kind": "gemm", "problem": bp.name, "m": bp.m,
            "k": bp.k, "n": bp.n, "batch": 1, "layout": bp.layout, "ladder": int(bp.ladder),
            "flops": bp.flops, "iters": 20}
    rows.append({**base, "backend": runner.REF, "variant": runner.REF_VARIANT, "status": "ok",
                 "time_ms_median": xla_t, "tflops": 700, "gbps": 1000,
                 "memory_bound": int(bp.suite == "skinny")})
    s = 0.95 if bp.name == AUTO_SLOW else AUTO_SPEEDUP[bp.suite]
    rows.append({**base, "backend": runner.AUTO, "variant": runner.AUTO_VARIANT, "status": "ok",
                 "time_ms_median": xla_t / s, "tflops": 700 * s, "speedup_vs_xla": s,
                 "gbps": 1000 * s, "chosen": "tri/best (table)"})
    for b, vs in ladders.items():
      for rank, v in enumerate(vs):
        if not bp.ladder and v != "best":
          continue
        s = (0.5 + 0.3 * rank) if b == "tri" else (0.8 + 0.4 * rank)
        status = "fail" if (b, v) == ("tri", "tiled") else "ok"
        r = {**base, "backend": b, "variant": v, "variant_rank": rank, "status": status}
        if status == "ok":
          r.update(time_ms_median=xla_t / s, tflops=700 * s, speedup_vs_xla=s, gbps=1000 * s)
        else:
          r.update(error=0.3, note="wrong result")
        rows.append(r)
  for b, v, t in ((runner.REF, runner.REF_VARIANT, 10), ("tri", T.DEFAULT_VARIANT, 10),
                  (runner.AUTO, runner.AUTO_VARIANT, 9.5)):
    rows.append({**prov, "suite": "training", "kind": "train_step", "backend": b, "variant": v,
                 "status": "ok", "time_ms_median": t, "tokens_per_s": 8e5, "loss_first": 9,
                 "loss_last": 3, "agree": "" if b == runner.REF else 1,
                 "problem": "transformer", "problem_note": "a model",
                 **({} if b == runner.REF else {"xla_time_ms": 10, "speedup_vs_xla": 10 / t})})
    for i in range(5):
      rows.append({**prov, "suite": "training", "kind": "train_loss", "backend": b,
                   "variant": v, "status": "ok", "step": i, "loss": 9 - i})
  w = csvio.CsvWriter(path)
  for r in rows:
    w(r)
  w.close()


def test_report_of_a_gpu_run(tmp_path):
  csv_path = tmp_path / "results.csv"
  _synthetic_gpu_csv(csv_path)
  made = generate(csv_path)
  report = made["report"].read_text()
  assert "NOT GPU TIMINGS" not in report
  assert set(made["plots"]) == set(plots.PLOTS)     # every plot has data here
  # headline: best own kernel per suite (pal's best is 1.2x, tri's 1.1x)
  head = report[report.index("## Headline"):report.index("## Kernel ladders")]
  assert "| square |" in head and "| llm |" in head and "| skinny |" in head
  assert "1.20x" in head
  # the ladder tables list variants in ladder order, a failure as such
  lad = report[report.index("#### Ladder: backend `tri`"):]
  assert lad.index("| naive |") < lad.index("| tiled |") < lad.index("| best |")
  assert "| tiled | fail" in lad
  assert "(default)" not in report[report.index("## Kernel ladders"):report.index("## Suite")]


def test_report_shows_the_default_apart_from_the_backends(tmp_path):
  csv_path = tmp_path / "results.csv"
  _synthetic_gpu_csv(csv_path)
  report = generate(csv_path)["report"].read_text()
  # headline: the default's own columns; `best` is among the backends only
  head = report[report.index("## Headline"):report.index("## Defaults")]
  assert "default (auto) vs XLA (geomean)" in head and "auto vs XLA" not in head
  skinny = next(line for line in head.splitlines() if line.startswith("| skinny |"))
  assert "2.50x" in skinny and "auto/" not in skinny
  assert "| 1.20x |" in skinny   # pal's best, not the default's 2.5x
  llm = next(line for line in head.splitlines() if line.startswith("| llm |"))
  assert f"0.95x ({AUTO_SLOW})" in llm and "| 1/6 |" in llm
  # the defaults section: square + llm against the target, and the training step
  sec = report[report.index("## Defaults (backend='auto') vs XLA"):
               report.index("## Kernel ladders")]
  n_sq = sum(1 for p in P.SUITES["square"] if p.default)
  n = n_sq + 6
  g = math.exp(((n - 1) * math.log(1.05) + math.log(0.95)) / n)
  assert (f"- square + llm (bf16): geomean {g:.2f}x over {n} problems, min 0.95x "
          f"({AUTO_SLOW}), 1 below 0.97x: target NOT met.") in sec
  assert "XLA's 10.000 ms timed beside it (1.05x): target met." in sec
  assert f"| llm | {AUTO_SLOW} |" in sec and "**700 (0.95x)**" not in sec
  assert "**665.0 (0.95x)**" in sec and "tri/best (table)" in sec
  assert "| skinny |" not in sec   # per-problem rows: the target's suites only
  # no ladder or per-backend column of its own; a column in the suite tables
  assert "#### Ladder: backend `auto`" not in report
  assert "auto vs XLA" not in report and "auto best" not in report
  suite = report[report.index("## Suite `llm`"):]
  assert "default (auto) (vs XLA), chose" in suite.splitlines()[2]


def test_report_fills_readme_and_ladder_guide_between_their_markers(tmp_path):
  """`python -m bench report CSV` puts the generated blocks between each document's
  markers and leaves the prose around them; a file or backend without markers is
  left alone, and a second run changes nothing."""
  csv_path = tmp_path / "run" / "results.csv"
  _synthetic_gpu_csv(csv_path)
  readme = tmp_path / "README.md"
  readme.write_text(f"# Title\n\nprose before\n{tables.README_BEGIN}\nold tables\n"
                    f"{tables.README_END}\nprose after\n")
  tri_begin, tri_end = tables.ladder_markers("tri")
  assert tri_begin == "<!-- ladder:tri:begin -->" and tri_end == "<!-- ladder:tri:end -->"
  pal_begin, pal_end = tables.ladder_markers("pal")
  guide = tmp_path / "ladders.md"
  guide.write_text(f"# Ladders\n\nThe tri rungs:\n\n{tri_begin}\nstale\n{tri_end}\n\n"
                   f"The pal rungs:\n{pal_begin}{pal_end}\nThe end.\n")
  args = ["report", str(csv_path), "--readme", str(readme), "--ladders", str(guide)]
  assert cli.main(args) == 0
  text = readme.read_text()
  assert text.startswith("# Title\n\nprose before\n") and text.endswith("\nprose after\n")
  assert "old tables" not in text and "| square |" in text
  assert text == (f"# Title\n\nprose before\n{tables.README_BEGIN}\n"
                  f"{(csv_path.parent / 'README_TABLES.md').read_text().strip()}\n"
                  f"{tables.README_END}\nprose after\n")
  doc = guide.read_text()
  assert doc.startswith("# Ladders\n\nThe tri rungs:\n\n") and doc.endswith("\nThe end.\n")
  assert "stale" not in doc
  tri = doc[doc.index(tri_begin):doc.index(tri_end)]
  pal = doc[doc.index(pal_begin):doc.index(pal_end)]
  # each rung on each ladder problem: TFLOP/s (speedup vs XLA), in ladder order, and XLA
  assert tri.index("| naive | 350.0 (0.50x)") < tri.index("| tiled | fail") \
      < tri.index("| best | 770.0 (1.10x)") < tri.index("| XLA dot | 700.0")
  assert "| basic | 560.0 (0.80x)" in pal and "| best | 840.0 (1.20x)" in pal
  assert "naive" not in pal and "basic" not in tri
  assert "h200-test" in tri and "NVIDIA H200" in tri and "NOT GPU" not in tri
  n_ladder = sum(1 for p in [*P.SUITES["square"], *P.SUITES["llm"][:6], *P.SUITES["skinny"][:3]]
                 if p.ladder and (p.suite != "square" or p.default))
  assert tri.splitlines()[-4].count("|") == n_ladder + 2     # a column per ladder problem
  assert cli.main(args) == 0                                 # idempotent
  assert guide.read_text() == doc and readme.read_text() == text
  # no markers, or no file: left alone, silently
  plain = tmp_path / "plain.md"
  plain.write_text("no markers here\n")
  missing = tmp_path / "docs" / "ladders.md"
  assert cli.main(["report", str(csv_path), "--readme", str(plain), "--ladders",
                   str(missing)]) == 0
  assert plain.read_text() == "no markers here\n" and not missing.exists()
  assert not tables.replace_block(missing, tri_begin, tri_end, "x")


# ---------------------------------------------------------------- the CLI

def test_cli_list_runs_as_a_module():
  res = subprocess.run([sys.executable, "-m", "bench", "--list", "--suite", "square,llm"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert res.returncode == 0, res.stderr
  for word in ("square", "llm", "skinny", "training", "xla: dot_general", "sq16384",
               "llama3-70b.down.t16384", "  auto: default  (jaxgemm's default"):
    assert word in res.stdout, word
  for b in jaxgemm.backends():
    assert f"  matmul {b}: " in res.stdout


def test_cli_rejects_bad_arguments(tmp_path):
  with pytest.raises(SystemExit):
    cli.main(["--suite", "nope", "--out", str(tmp_path)])
  with pytest.raises(SystemExit):
    cli.main(["--backends", "nope", "--out", str(tmp_path)])
  with pytest.raises(SystemExit):
    cli.main(["--dtype", "int8", "--out", str(tmp_path)])



def test_targets_table_reads_each_target_off_the_run():
  def row(backend, variant, s, status="ok"):
    return {"kind": "gemm", "suite": "square", "problem": "sq8192", "dtype": "bf16",
            "m": 8192, "k": 8192, "n": 8192, "backend": backend, "variant": variant,
            "status": status, "speedup_vs_xla": s, "tflops": 800 * s,
            "platform": "gpu"}     # the targets are GPU numbers (a CPU run's are n/a)
  run = view.Run([row(runner.REF, runner.REF_VARIANT, ""), row("triton", "persistent", 0.98),
               row("triton", "tensorcore", 0.91), row("pallas", "clusters", 0.99),
               row("pallas", "pipelined", 1.5, status="fail")])
  table = "\n".join(MM.targets_table(run))
  assert "| sq8192 (8192x8192x8192, bf16) | triton | >= 0.92x | persistent" in table
  triton, pallas = [line for line in table.splitlines() if "sq8192" in line and "bf16" in line]
  assert triton.endswith("| met |") and "(0.98x)" in triton
  # A failed (wrong) kernel never counts toward a target, however fast.
  assert pallas.endswith("| **missed** |") and "clusters" in pallas and "(0.99x)" in pallas
  assert "sq4096" not in table      # not in the run: no row
  only_xla = view.Run([row(runner.REF, runner.REF_VARIANT, "")])
  assert "not measured" in "\n".join(MM.targets_table(only_xla))


# ---------------------------------------------------------------- the runs' history

def _history_csv(path, run_id, date, ms):
  """A tiny results.csv of one run: copy bandwidth, XLA and a kernel on one problem,
  a training step and its losses."""
  prov = {"run_id": run_id, "date": date, "git_commit": "0123456789abcdef" * 2,
          "device": "NVIDIA H200", "platform": "gpu", "dtype": "bf16"}
  gemm = {**prov, "suite": "square", "kind": "gemm", "problem": "sq4096", "m": 4096,
          "k": 4096, "n": 4096, "layout": "NN", "status": "ok", "iters": 20}
  w = csvio.CsvWriter(path)
  w({**prov, "suite": "copy", "kind": "copy_bw", "backend": "xla", "variant": "negate",
     "status": "ok", "gbps": 4300})
  w({**gemm, "backend": runner.REF, "variant": runner.REF_VARIANT, "time_ms_median": 0.2,
     "tflops": 687.2})
  w({**gemm, "backend": "tri", "variant": "best", "time_ms_median": ms, "tflops": 137.4 / ms,
     "xla_time_ms": 0.2, "speedup_vs_xla": 0.2 / ms, "error": 1e-3})
  w({**prov, "suite": "training", "kind": "train_step", "problem": "transformer",
     "backend": runner.AUTO, "variant": runner.AUTO_VARIANT, "status": "ok",
     "time_ms_median": 8.0, "step_wall_ms": 9.1, "xla_time_ms": 8.1, "speedup_vs_xla": 1.01,
     "chosen": ""})
  for i in range(3):
    w({**prov, "suite": "training", "kind": "train_loss", "backend": runner.AUTO,
       "variant": runner.AUTO_VARIANT, "status": "ok", "step": i, "loss": 9 - i})
  w.close()
  return path


def test_history_keeps_headline_rows_and_merges_by_run_id(tmp_path):
  hist = tmp_path / "history.csv"
  a = _history_csv(tmp_path / "a.csv", "run-b", "2026-11-24T08:00:00Z", 0.25)
  assert cli.main(["history", str(a), "--out", str(hist)]) == 0
  with open(hist, newline="") as f:
    assert next(csv.reader(f)) == H.HISTORY_COLUMNS
  rows = csvio.read_csv(hist)
  # kernels, XLA and the training step; no losses, no copy bandwidth
  assert [(r["kind"], r["backend"]) for r in rows] == [
      ("gemm", runner.REF), ("gemm", "tri"), ("train_step", runner.AUTO)]
  kernel, step = rows[1], rows[2]
  assert (kernel["problem"], kernel["m"], kernel["layout"], kernel["dtype"]) == \
      ("sq4096", "4096", "NN", "bf16")
  assert float(kernel["speedup_vs_xla"]) == pytest.approx(0.8)
  assert kernel["git_commit"] == "0123456789" and kernel["device"] == "NVIDIA H200"
  assert (step["time_ms_median"], step["step_wall_ms"], step["xla_time_ms"]) == \
      ("8", "9.1", "8.1")
  # an earlier run and run-b measured again: one copy of each run, in date order
  b = _history_csv(tmp_path / "b.csv", "run-b", "2026-11-24T08:00:00Z", 0.4)
  c = _history_csv(tmp_path / "c.csv", "run-a", "2026-11-22T08:00:00Z", 0.3)
  assert cli.main(["history", str(b), str(c), "--out", str(hist)]) == 0
  rows = csvio.read_csv(hist)
  assert [r["run_id"] for r in rows] == ["run-a"] * 3 + ["run-b"] * 3
  assert float(rows[4]["time_ms_median"]) == pytest.approx(0.4)   # run-b's new rows
  # a run not in the CSVs stays as it was
  assert cli.main(["history", str(a), "--out", str(hist)]) == 0
  rows = csvio.read_csv(hist)
  assert [r["run_id"] for r in rows] == ["run-a"] * 3 + ["run-b"] * 3
  assert float(rows[1]["time_ms_median"]) == pytest.approx(0.3)
  assert float(rows[4]["time_ms_median"]) == pytest.approx(0.25)


def test_timer_measures_large_outputs_a_few_calls_at_a_time():
  """CUPTI's measure keeps every call's outputs alive until it returns: a training step's
  (parameters and optimizer state) are measured `chunk` calls at a time, and time_paired's
  blocks keep to the chunk too."""
  calls = []

  class Recording(timing.Timer):
    def __init__(self):
      super().__init__("cpu")
      self._measure, self._takes_iterations = self._fake, True

    def _fake(self, f, iterations):
      calls.append(iterations)
      return lambda *a: (None, [1.0] * iterations)

  t = Recording()
  assert t.time(lambda: None, (), 20, chunk=3) == [1.0] * 20
  assert calls == [3, 3, 3, 3, 3, 3, 2]
  calls.clear()
  timing.time_paired(t, lambda: None, lambda: None, (), 10, block_ms=1e9, chunk=2)
  assert calls and max(calls) <= 2


def test_sharded_rows_render_as_their_own_table_without_a_headline():
  """A sharded-only run (bench/sharded.py): one table per problem, XLA's row last, the
  step's many local problems as a count, the shown rows' timer in the run line and no empty
  GEMM headline."""
  base = {"run_id": "r", "suite": "sharded", "status": "ok", "device": "NVIDIA H200",
          "device_count": "4", "timer": "wallclock (back-to-back)", "platform": "gpu",
          "mesh": "data=2 x model=2", "problem_note": "a step", "collectives": "all-reduce 2 ops 1.00 MB"}
  rows = [{**base, "kind": "copy_bw", "backend": "xla", "variant": "negate", "problem": "copy",
           "timer": "cupti"},
          {**base, "kind": "sharded_step", "problem": "sharded.step", "backend": "triton",
           "variant": "(default)", "time_ms_median": "25.5", "speedup_vs_xla": "1.0",
           "same_collectives": "1", "mem_per_device_gb": "7.7", "custom_calls": "triton_kernel_call x45",
           "local_problems": "; ".join(f"p{i}" for i in range(15))},
          {**base, "kind": "sharded_step", "problem": "sharded.step", "backend": runner.REF,
           "variant": "jnp.matmul", "time_ms_median": "25.6", "mem_per_device_gb": "8.2"}]
  run = view.Run(rows)
  table = "\n".join(SH.sharded_table(run))
  lines = [l for l in table.splitlines() if l.startswith("| ")]
  assert lines[0].startswith("| GEMMs | status |")
  assert lines[1].startswith("| triton/(default) | ok | 25.500 | 1.00x")
  assert "| same |" in lines[1] and "15 (in the CSV)" in lines[1] and "triton_kernel_call x45" in lines[1]
  assert lines[2].startswith("| XLA (jnp) | ok | 25.600 |")
  block = tables.readme_tables(run, "plots", {})
  assert "NVIDIA H200 x 4" in block and "timer wallclock (back-to-back)" in block
  assert "| suite | problems |" not in block and "#### Sharded: 4 x NVIDIA H200" in block
