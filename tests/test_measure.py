"""`backend="auto"` measures (`jaxgemm.measure`), driven by a fake timer on the CPU.

The measuring path runs as on a GPU: the problem is found at lowering, XLA and the
first candidates of each backend are compiled and checked against XLA's result (in
the interpreters), and a fake timer says how fast each program is (by what it runs:
`jaxgemm.tuning.program_of`). The GPU tier (tests/test_gpu_measure.py) measures for real.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import assert_gemm_close, matmul_reference, random_array, tolerance
from jaxgemm import dispatch, measure, tuning, tuning_cache

F32 = np.dtype(np.float32)
KIND = dispatch.device_kind()          # "cpu" here
pytestmark = pytest.mark.skipif("triton" not in jaxgemm.backends(),
                                reason="the triton backend (its interpreter) is not installed")


class FakeTimer:
  """Each program takes the ms its backend is given (XLA's "xla"), and costs
  `clock_s` seconds of the tuner's clock per timed call."""
  label = "fake"

  def __init__(self, ms: dict[str, float], clock=None, clock_s: float = 0.0):
    self.ms, self.clock, self.clock_s = ms, clock, clock_s
    self.problems = []   # the problem of every program timed, in order

  def time(self, f, args, iters, chunk=None):
    program = tuning.program_of(f)
    assert program is not None, "only the tuner's programs are timed"
    self.problems.append(program.problem)
    if self.clock is not None:
      self.clock.now += self.clock_s * iters
    return [self.ms[program.backend]] * iters


@pytest.fixture
def clock(monkeypatch):
  """The tuner's clock, standing still unless a test's timer moves it (`now`, seconds)."""
  class Clock:
    now = 0.0

    def perf_counter(self):
      return self.now

  fake = Clock()
  monkeypatch.setattr(tuning, "time", fake)
  return fake


def measuring(timer, **kw):
  """Measures on the CPU (the interpreters), with `timer`, the triton backend only
  (the Mosaic GPU interpreter takes seconds a kernel), and no log. The budget is the real
  clock's, so by default far above what the interpreters take on a loaded machine (the
  default 2.5 s once cut a candidate under pytest-xdist); the budget's own tests set it
  and drive a fake clock."""
  return measure.override(**{"timer": timer, "platforms": ("cpu",), "backends": ("triton",),
                             "log": False, "budget_s": 600.0, **kw})


def operands(rng, m=48, n=40, k=32):
  return random_array(rng, (m, k), F32), random_array(rng, (k, n), F32)


def matmul_program():
  """jnp-like a @ b under a jit of its own: lowered afresh (jit caches by function)."""
  return jax.jit(lambda a, b: jaxgemm.matmul(a, b))


def lowered_choice(a, b):
  """The kernel auto runs for a @ b, as the lowering resolves it."""
  problem = jaxgemm.GemmProblem(1, a.shape[0], b.shape[1], a.shape[1], F32, F32, F32)
  return dispatch.choose(problem, "auto")


@pytest.mark.parametrize("kernel_ms, picked", [(0.5, "triton"), (2.0, "xla")])
def test_auto_runs_what_measured_fastest(fresh_measurement, rng, kernel_ms, picked):
  a, b = operands(rng)
  timer = FakeTimer({"xla": 1.0, "triton": kernel_ms})
  with measuring(timer):
    out = matmul_program()(a, b)
  assert timer.problems, "nothing was measured"
  ref, bound = matmul_reference(a, b)
  assert_gemm_close(out, ref, bound, tolerance(F32), "measured auto")
  assert lowered_choice(a, b).backend == picked
  # XLA's record says what was measured, under which libraries.
  key = tuning_cache.entry_key(KIND, "xla", "dot_general",
                               jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32))
  xla, = json.loads(fresh_measurement.read_text())["entries"][key].values()
  assert xla["measured"] == ["triton"] and xla["finished"]
  assert xla["libs"] == tuning_cache.library_versions()


def test_a_measurement_is_reused_in_the_process_and_by_the_next(fresh_measurement, rng):
  a, b = operands(rng)
  timer = FakeTimer({"xla": 1.0, "triton": 0.5})
  with measuring(timer):
    matmul_program()(a, b)
    first = len(timer.problems)
    jax.jit(lambda a, b: jaxgemm.matmul(a, b) * 2)(a, b)   # a new program, the same GEMM
    assert len(timer.problems) == first
    tuning_cache.forget()                                  # a new process: the cache file
    jax.jit(lambda a, b: jaxgemm.matmul(a, b) + 1)(a, b)
    assert len(timer.problems) == first
  assert lowered_choice(a, b).backend == "triton"


def test_without_a_cache_file_the_process_keeps_what_it_measured(fresh_measurement, rng, monkeypatch):
  monkeypatch.setenv(tuning_cache.CACHE_ENV, "off")
  a, b = operands(rng)
  timer = FakeTimer({"xla": 1.0, "triton": 0.5})
  with measuring(timer):
    matmul_program()(a, b)
    first = len(timer.problems)
    jax.jit(lambda a, b: jaxgemm.matmul(a, b) * 2)(a, b)
  assert len(timer.problems) == first > 0
  assert lowered_choice(a, b).backend == "triton"


def test_each_gemm_of_a_gradient_is_measured(fresh_measurement, rng):
  a, b = operands(rng)
  timer = FakeTimer({"xla": 1.0, "triton": 0.5})
  with measuring(timer):
    jax.jit(jax.grad(lambda a, b: (jaxgemm.matmul(a, b) ** 2).sum(), argnums=(0, 1)))(a, b)
  shapes = {(p.m, p.n, p.k) for p in timer.problems}
  assert shapes == {(48, 40, 32), (48, 32, 40), (32, 40, 48)}   # forward, dA, dB


def test_the_budget_stops_new_candidates(fresh_measurement, rng, clock):
  """Each timed call costs 1 s of the tuner's clock. XLA's reference is timed outside
  the 0.5 s budget (the user's program compiles it anyway); the first candidate spends
  the budget, no second starts, and the measurement stands (not repeated)."""
  timer = FakeTimer({"xla": 1.0, "triton": 0.5}, clock=clock, clock_s=1.0)
  a, b = operands(rng)
  with measuring(timer, budget_s=0.5, iters=2):
    matmul_program()(a, b)
    timed = list(timer.problems)
    jax.jit(lambda a, b: jaxgemm.matmul(a, b) * 2)(a, b)
  assert len(timer.problems) == len(timed) and timed
  p = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  entries = json.loads(fresh_measurement.read_text())["entries"]
  kernels = [k for k in entries if "|triton/" in k]
  assert len(kernels) == 1                     # one candidate of the two timed
  assert lowered_choice(a, b).backend == "triton"
  key = tuning_cache.entry_key(KIND, "xla", "dot_general", p)
  assert not next(iter(entries[key].values()))["finished"]


def test_a_slow_reference_does_not_spend_the_budget(fresh_measurement, rng, clock):
  """Each timed call costs its program's time on the tuner's clock, and XLA's takes 1 s
  (its block-scaled FP8 dot took 21-49 ms a call on an H100, its ragged_dot 36 ms). Its
  calls timed beside each candidate are not counted: both candidates of the 0.5 s budget
  are timed, where counting them would have stopped after the first."""
  class ClockedTimer(FakeTimer):
    def time(self, f, args, iters, chunk=None):
      times = super().time(f, args, iters, chunk)
      self.clock.now += sum(times) / 1e3
      return times

  timer = ClockedTimer({"xla": 1000.0, "triton": 0.5}, clock=clock)
  with measuring(timer, budget_s=0.5, iters=2, candidates=2):
    report = measure.measure(jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32))
  assert len([t for t in report.trials if t.status == "ok"]) == 2
  assert not report.out_of_time


def test_the_budget_leaves_every_backend_its_first_candidate(fresh_measurement, clock):
  """Each timed call costs 1 s of the tuner's clock and the budget is 0.5 s. XLA's
  dequantize + bf16 dot (its candidate beside the reference) spends it; Triton's first
  kernel is still timed, and no backend's second. On an H100 the budget once ran out
  before Pallas's block-scaled kernel, the fastest in the fp8 suite, was ever timed."""
  timer = FakeTimer({"xla": 1.0, "triton": 0.5}, clock=clock, clock_s=1.0)
  e4m3 = np.dtype(jnp.float8_e4m3fn)
  problem = jaxgemm.ScaledMatmulProblem(1, 32, 32, 128, e4m3, np.dtype(jnp.bfloat16), F32,
                                        scale_kind="block")
  with measuring(timer, budget_s=0.5, iters=2, candidates=2, backends=("xla", "triton")):
    report = measure.measure(problem)
  timed = [(t.backend, t.variant) for t in report.trials if t.status == "ok"]
  assert [b for b, _ in timed] == ["xla", "triton"], timed
  assert timed[0][1] == "dequantize_bf16"
  assert report.out_of_time == [problem]        # the second candidates did not start


@pytest.mark.parametrize("error, picked", [
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 32.02GiB", "triton"),
    ("INTERNAL: something else", "xla")])
def test_where_xlas_program_does_not_fit_a_kernel_runs(fresh_measurement, rng, error, picked,
                                                       capfd):
  """XLA's program out of device memory (its ragged_dot's dense products, on an H100 at
  65536 routed rows): a kernel runs, said in one line, and the program's result is right.
  Any other failure leaves the no-measure path (XLA here, with no records)."""
  class FailingXla(FakeTimer):
    def time(self, f, args, iters, chunk=None):
      if tuning.program_of(f).backend == "xla":
        raise RuntimeError(error)
      return super().time(f, args, iters, chunk)

  a, b = operands(rng)
  with measuring(FailingXla({"triton": 0.5}), log=True):
    out = matmul_program()(a, b)
  ref, bound = matmul_reference(a, b)
  assert_gemm_close(out, ref, bound, tolerance(F32), "auto without XLA")
  said = capfd.readouterr().err
  if picked == "triton":
    assert "does not fit in device memory; running triton/" in said, said
  else:
    assert "failed (ReferenceFailed" in said, said
  # Decided once: the same kernel at the next lowering, not measured again.
  problem = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  timer = FailingXla({"triton": 0.5})
  with measuring(timer):
    again = measure.decide(problem, dict(backend="auto", variant=None, config=None), "cpu")
  assert again.backend == picked and not timer.problems


def test_at_most_the_candidates_setting_per_backend(fresh_measurement, rng):
  a, b = operands(rng, 64, 64, 64)
  report = None
  with measuring(FakeTimer({"xla": 1.0, "triton": 0.5}), candidates=1):
    report = measure.measure(jaxgemm.GemmProblem(1, 64, 64, 64, F32, F32, F32))
  assert len([t for t in report.trials if t.status != "unsupported"]) == 1


def test_a_named_backend_with_no_variant_measures_its_own_candidates(fresh_measurement, rng):
  a, b = operands(rng)
  timer = FakeTimer({"xla": 1.0, "triton": 3.0})
  with measuring(timer):
    out = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="triton"))(a, b)
  assert {p.op for p in timer.problems} == {"matmul"}
  p = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  assert dispatch.choose(p, "triton").source == "measured"   # slower than XLA, but named
  ref, bound = matmul_reference(a, b)
  assert_gemm_close(out, ref, bound, tolerance(F32), "triton, measured")


@pytest.mark.parametrize("setting, why", [
    ({"enabled": False}, "JAXGEMM_AUTOTUNE=off"),
    ({"platforms": ("cuda",)}, "not a measured platform"),
])
def test_nothing_is_measured_where_it_cannot_or_must_not_be(fresh_measurement, setting, why):
  p = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  with measuring(FakeTimer({}), **setting) as s:
    assert why in measure.why_not_measured(p, "auto", "cpu", 1, s)
  with measuring(FakeTimer({})) as s:
    assert "partitioned over 8 devices" in measure.why_not_measured(p, "auto", "cpu", 8, s)
    assert measure.why_not_measured(p, "auto", "cpu", 1, s) is None


@pytest.mark.parametrize("name, value", [
    (measure.ENABLED_ENV, "maybe"), (measure.BUDGET_ENV, "-1"), (measure.BUDGET_ENV, "soon"),
    (measure.CANDIDATES_ENV, "0"), (measure.LOG_ENV, "loud")])
def test_a_bad_knob_names_the_variable(monkeypatch, name, value):
  monkeypatch.setenv(name, value)
  with pytest.raises(ValueError, match=name):
    measure.settings()


def test_a_failed_measurement_leaves_the_no_measure_path_once(fresh_measurement, rng, capsys):
  class Broken:
    label = "broken"
    calls = 0

    def time(self, f, args, iters, chunk=None):
      Broken.calls += 1
      raise RuntimeError("the profiler is gone")

  a, b = operands(rng)
  with measure.override(timer=Broken(), platforms=("cpu",), backends=("triton",)):
    out = matmul_program()(a, b)
    jax.jit(lambda a, b: jaxgemm.matmul(a, b) * 2)(a, b)
  assert Broken.calls == 1
  assert "measuring 1x(48x32 @ 32x40)" in capsys.readouterr().err
  ref, bound = matmul_reference(a, b)
  assert_gemm_close(out, ref, bound, tolerance(F32), "auto after a failed measurement")


def test_every_process_runs_process_0s_choice(fresh_measurement, rng, monkeypatch):
  """Process 1 neither measures nor decides: it takes process 0's broadcast choice,
  even where its own records would pick another kernel."""
  from jax.experimental import multihost_utils
  p = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  triton = jaxgemm.registry.get_backend("triton")
  ours = dispatch.Choice("triton", "tensorcore", triton.default_config(p, "tensorcore"), "x")
  sent = []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  monkeypatch.setattr(multihost_utils, "broadcast_one_to_all",
                      lambda x: sent.append(x) or measure.encode_choice(ours))
  timer = FakeTimer({"xla": 1.0, "triton": 0.5})
  with measuring(timer) as s:
    assert "not process 0" in measure.why_not_measured(p, "auto", "cpu", 1, s)
    params = {"backend": "auto", "variant": None, "config": None}
    got = measure.decide(p, params, "cpu")
  assert not timer.problems and len(sent) == 1
  assert (got.backend, got.variant, got.config, got.source) == (
      "triton", "tensorcore", ours.config, "process 0")


def test_a_cache_record_of_other_libraries_is_stale(fresh_measurement, rng):
  a, b = operands(rng)
  with measuring(FakeTimer({"xla": 1.0, "triton": 0.5})):
    matmul_program()(a, b)
  data = json.loads(fresh_measurement.read_text())
  for shapes in data["entries"].values():
    for r in shapes.values():
      r["libs"] = {**r["libs"], "jaxlib": "0.0.1"}
  fresh_measurement.write_text(json.dumps(data))
  tuning_cache.forget()
  p = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  assert tuning_cache.measured_backends(p, KIND, "dot_general") is None
  assert lowered_choice(a, b).backend == "xla"


def test_auto_may_run_xlas_dequantize_program_where_it_measured_fastest(fresh_measurement, rng):
  """Block-scaled FP8 at few rows: XLA's dequantize-then-bf16 program is a candidate
  (issue 44: 0.39-0.51x of it on a GPU), and auto runs it where it measured fastest."""
  x = jnp.asarray(rng.standard_normal((32, 256)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
  (xq, xs), (wq, ws) = jaxgemm.quantize(x, block=(1, 128)), jaxgemm.quantize(w, block=(128, 128))
  timer = FakeTimer({"xla": 1.0, "triton": 2.0})
  ms = lambda f, args, iters, chunk=None: (
      [0.5] * iters if tuning.program_of(f).variant == "dequantize_bf16"
      else FakeTimer.time(timer, f, args, iters))
  timer.time = ms
  with measuring(timer, backends=("xla", "triton")):
    out = jax.jit(lambda *a: jaxgemm.scaled_matmul(*a))(xq, wq, xs, ws)   # bf16 out
  measured, = {p for p in timer.problems}
  c = dispatch.choose(measured, "auto")
  assert (c.backend, c.variant) == ("xla", "dequantize_bf16")
  ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  # fp8 e4m3 keeps 3 mantissa bits: each operand within 2^-4 of itself, so the product
  # of norms within ~2 * 2^-4 / sqrt(3) (uniform rounding) of the exact one; the bf16
  # dequantization and output add 2^-8 each.
  out = np.asarray(out, np.float64)
  assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.08


def test_two_processes_run_process_0s_kernel(tmp_path):
  """Two real processes (jax.distributed on the CPU, gloo): each cache names another
  kernel for the problem, and both run process 0's, agreed by a broadcast inside the
  lowering (`measure.agree`)."""
  import socket
  import subprocess
  import sys
  from pathlib import Path

  p = jaxgemm.GemmProblem(1, 48, 40, 32, F32, F32, F32)
  triton = jaxgemm.registry.get_backend("triton")
  config = {k: v for k, v in triton.default_config(p, "tensorcore").to_dict().items()
            if k != "backend"}

  def cache(kernel_ms):
    version = lambda b, v: tuning_cache.kernel_version(b, "matmul", variant=v)
    entries = {
        tuning_cache.entry_key(KIND, "xla", "dot_general", p): {p.shape_key(): {
            "config": {}, "time_ms": 1.0, "xla_time_ms": 1.0,
            "version": version("xla", "dot_general")}},
        tuning_cache.entry_key(KIND, "triton", "tensorcore", p): {p.shape_key(): {
            "config": config, "time_ms": kernel_ms, "xla_time_ms": 1.0,
            "version": version("triton", "tensorcore")}}}
    return {"format": tuning_cache.FORMAT, "entries": entries}

  files = []
  for i, kernel_ms in enumerate((0.5, 2.0)):   # process 0: triton wins; process 1: XLA
    files.append(tmp_path / f"cache{i}.json")
    files[-1].write_text(json.dumps(cache(kernel_ms)))
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  script = Path(__file__).with_name("measure_two_processes.py")
  procs = [subprocess.Popen([sys.executable, str(script), str(port), str(i), str(files[i])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [proc.communicate(timeout=300) for proc in procs]
  for proc, (out, err) in zip(procs, outs):
    assert proc.returncode == 0, err[-3000:]
  lines = [[l for l in out.splitlines() if l.startswith(("CHOICE", "SUM"))] for out, _ in outs]
  assert lines[0] == lines[1]
  assert lines[0][0] == "CHOICE triton/tensorcore"
