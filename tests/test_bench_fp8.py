"""CPU tests of the benchmark's fp8 suites (FP8 GEMMs with scales, issue 28): bench/fp8.py.

The problem table (issue 28's shapes with per-tensor and block scales, a layer's dgrad and
wgrad), the inputs (quantized as scaled_matmul takes them), XLA's reference forms and the
exact product they are checked against (against float64 formulas here), the correctness
gate (a wrong scale fails), an `fp8-tiny` run end to end (rows, XLA's other programs, the
FP8 training step, the report), the FP8 step's own agreement check (a wrong GEMM fails),
and the report's fp8 tables and issue-28 targets from a synthetic GPU CSV. Only the xla
backend and the default run end to end here; each other registered scaled_matmul backend
runs two tiny problems in its interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math

import jax.numpy as jnp
import numpy as np
import pytest

from bench_testing import cpu_context
import jaxgemm
from jaxgemm import timing
from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import fp8 as F
from jaxgemm.bench import runner
from jaxgemm.bench import suites as S
from jaxgemm.bench import training as T
from jaxgemm.bench.ops import matmul as MM
from jaxgemm.bench.ops import scaled_matmul as SM
from jaxgemm.bench.report import csvio, tables
from jaxgemm.bench.report.make import generate
from jaxgemm.bench.report.view import Run as View
from conftest import SLOW_INTERPRETERS

FP8 = SM.FP8_SUITES["fp8"]
TINY = SM.FP8_SUITES["fp8-tiny"]
ISSUE_SHAPES = {"sq8192": (8192, 8192, 8192), "m8192.k4096.n14336": (8192, 4096, 14336),
                "sq4096": (4096, 4096, 4096), "m128.k4096.n14336": (128, 4096, 14336)}



def _tiny(name):
  return next(p for p in TINY if p.name == name)


def _f64(x):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _dequantized(q, s, block):
  """float64 q * scale, the scale expanded over its block with numpy (not fp8.dequantize)."""
  q, s = _f64(q), _f64(s)
  if block is None:
    return q * s
  full = np.repeat(np.repeat(s, block[0], axis=0), block[1], axis=1)
  return q * full[: q.shape[0], : q.shape[1]]


def _exact(p, a8, b8, sa, sb):
  a, b = _dequantized(a8, sa, p.a_block()), _dequantized(b8, sb, p.b_block())
  return (a.T if p.trans_a else a) @ (b.T if p.trans_b else b)


def _rel(x, y):
  x, y = _f64(x), np.asarray(y, np.float64)
  return np.linalg.norm(x - y) / np.linalg.norm(y)


# ---------------------------------------------------------------- the problem table

def test_fp8_suite_is_the_issues_table():
  assert S.SUITE_OP["fp8"] == S.SUITE_OP["fp8-tiny"] == "scaled_matmul"
  assert "fp8-tiny" in S.CPU_DEFAULT_SUITES and "fp8" not in S.GPU_DEFAULT_SUITES
  by = {p.name: p for p in FP8}
  assert len(by) == len(FP8) and len({p.name for p in TINY}) == len(TINY)
  for layer, (m, k, n) in ISSUE_SHAPES.items():
    for scaling in ("tensor", "block"):
      p = by[f"{layer}.{scaling}"]
      assert (p.m, p.k, p.n, p.layout, p.mode, p.scaling) == (m, k, n, "NN", "fwd", scaling)
      assert (p.a_dtype, p.b_dtype, p.dtype) == ("float8_e4m3fn", "float8_e4m3fn", "bf16")
  # the backward's layouts at one LLM shape (8192 tokens through Llama-3-8B's up projection),
  # with each recipe's gradient dtype (jaxgemm.Fp8Recipe.named)
  for scaling, grad in (("tensor", "float8_e5m2"), ("block", "float8_e4m3fn")):
    assert jaxgemm.Fp8Recipe.named(scaling).grad_dtype == grad
    d, w = by[f"m8192.k4096.n14336.dgrad.{scaling}"], by[f"m8192.k4096.n14336.wgrad.{scaling}"]
    assert (d.m, d.k, d.n, d.layout, d.a_dtype, d.b_dtype) == (
        8192, 14336, 4096, "NT", grad, "float8_e4m3fn")
    assert (w.m, w.k, w.n, w.layout, w.a_dtype, w.b_dtype) == (
        4096, 8192, 14336, "TN", "float8_e4m3fn", grad)
    assert d.a_shape() == (8192, 14336) and d.b_shape() == (4096, 14336)   # dY, W as stored
    assert w.a_shape() == (8192, 4096) and w.b_shape() == (8192, 14336)    # X, dY as stored
  assert len(FP8) == 12 and all(p.default for p in FP8)
  assert all(p.suite == "fp8-tiny" and p.default for p in TINY)
  # block scales as quantize makes them for each operand as stored
  assert by["sq4096.block"].a_block() == (1, 128) and by["sq4096.block"].b_block() == (128, 128)
  assert by["m8192.k4096.n14336.wgrad.block"].a_block() == (128, 1)
  assert by["sq4096.tensor"].a_block() is None


def test_problem_bytes_flops_and_columns():
  p = next(p for p in FP8 if p.name == "m128.k4096.n14336.block")
  m, k, n = 128, 4096, 14336
  assert p.flops == 2 * m * k * n
  # fp8 operands, float32 scales (a: M x K/128, b: K/128 x N/128), bf16 output
  assert p.min_bytes("bf16") == m * k + k * n + 4 * (m * 32 + 32 * 112) + 2 * m * n
  f = p.csv_fields("bf16")
  assert (f["scaling"], f["fp8_dtypes"], f["xla_ref"], f["layout"], f["layer"]) == (
      "block", "e4m3xe4m3", SM.REF_BLOCK, "NN", "m128.k4096.n14336")
  tensor = SM.Fp8Problem("s", "x", "x", "tensor", 4, 8, 16)
  assert tensor.csv_fields("bf16")["xla_ref"] == SM.REF_TENSOR
  prob = F.scaled_problem(p)
  assert (prob.m, prob.k, prob.n, prob.scale_kind, prob.out_dtype) == (m, k, n, "block",
                                                                       jnp.dtype(jnp.bfloat16))


@pytest.mark.parametrize("name", ["m40.k200.n72.block", "m64.k256.n128.wgrad.block",
                                  "m64.k256.n128.dgrad.tensor"])
def test_inputs_forms_and_their_exact_product(name):
  """The inputs are quantize's (a8, b8, scales) and their dequantized bf16 values; XLA's
  scaled form, the kernels' call and the check function compute the scaled product."""
  p = _tiny(name)
  a8, b8, sa, sb, a16, b16, b8_other, sb_other = args = F.make_inputs(p, 1, 0)
  assert a8.shape == p.a_shape() and b8.shape == p.b_shape()
  assert (a8.dtype, b8.dtype) == (jnp.dtype(p.a_dtype), jnp.dtype(p.b_dtype))
  assert a16.dtype == b16.dtype == jnp.bfloat16
  # b stored the other way: the same fp8 values and scales, transposed
  assert b8_other.shape == p.b_shape(not p.trans_b) and b8_other.dtype == b8.dtype
  np.testing.assert_array_equal(_f64(b8_other), _f64(b8).T)
  np.testing.assert_array_equal(_f64(sb_other), _f64(sb).T)
  np.testing.assert_array_equal(_f64(a16), _f64(jnp.asarray(_dequantized(a8, sa, p.a_block()),
                                                            jnp.bfloat16)))
  want = _exact(p, a8, b8, sa, sb)
  assert _rel(F.exact_fn(p)(a8, b8, sa, sb), want) < 1e-6
  q = (_f64(a8).T if p.trans_a else _f64(a8)) @ (_f64(b8).T if p.trans_b else _f64(b8))
  assert _rel(F.exact_fn(p, scaled=False)(a8, b8, sa, sb), q) < 1e-6
  for fn in (F.ref_fn(p), F.ref_fn(p, other_b=True), F.peer_fn(p, F.SCALED_OTHER_B),
             F.kernel_fn(p, "xla", None), F.kernel_fn(p, runner.AUTO, None)):
    out = fn(*args)
    assert out.dtype == jnp.bfloat16 and out.shape == p.out_shape()
    assert 0 < _rel(out, want) <= F.TOLERANCE / 2          # bf16's rounding, no more
  # the dequantized operands' bf16 rounding too (jaxgemm's xla backend runs the same
  # program as its dequantize_bf16 variant)
  for fn in (F.peer_fn(p, F.BF16_DOT), F.peer_fn(p, F.DEQUANT_BF16),
             F.kernel_fn(p, "xla", "dequantize_bf16")):
    assert _rel(fn(*args), want) <= F.TOLERANCE
  np.testing.assert_array_equal(_f64(F.peer_fn(p, F.DEQUANT_BF16)(*args)),
                                _f64(F.peer_fn(p, F.BF16_DOT)(*args)))
  assert _rel(F.peer_fn(p, F.FP8_DOT)(*args), q) <= F.TOLERANCE
  assert SM.baselines(p) == ((SM.SCALED_OTHER_B,) if p.scaling == "tensor"
                             else (SM.SCALED_OTHER_B, SM.DEQUANT_BF16))


def test_per_tensor_reference_is_the_issues_scaled_form():
  p = _tiny("m64.k256.n128.tensor")
  a8, b8, sa, sb, *_ = F.make_inputs(p, 1, 3)
  assert sa.shape == sb.shape == ()
  want = (jnp.dot(a8, b8, preferred_element_type=jnp.float32) * (sa * sb)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(_f64(F.ref_fn(p)(a8, b8, sa, sb)), _f64(want))


# ---------------------------------------------------------------- the correctness gate

def _fake(bp, dtype_name, backend, variant):
  """The xla backend, 2% off, or applying one scale where there are blocks."""
  right = F.kernel_fn(bp, "xla", None)
  if variant == "right":
    return right
  if variant == "two_percent_off":
    return lambda *a: (right(*a).astype(jnp.float32) * 1.02).astype(jnp.bfloat16)
  if variant == "one_scale":
    def one_scale(a8, b8, sa, sb, *_):
      return jaxgemm.scaled_matmul(a8, b8, jnp.max(sa), jnp.max(sb), out_dtype=jnp.bfloat16,
                                   trans_a=bp.trans_a, trans_b=bp.trans_b, backend="xla")
    return one_scale
  raise AssertionError(variant)


def test_a_wrong_result_fails_and_the_peers_are_checked():
  p = _tiny("m64.k256.n128.block")
  kernels = F.SCALED_MATMUL.kernels(p, [runner.AUTO, "nope"], "ladder", "bf16")
  assert kernels[0] == (runner.AUTO, runner.AUTO_VARIANT, "")
  assert kernels[1][0] == "nope" and kernels[1][2].startswith(runner.UNSUPPORTED_PREFIX)
  kernels = [kernels[1], ("fake", "right", ""), ("fake", "two_percent_off", ""),
             ("fake", "one_scale", "")]
  rows = []
  runner.run_problem(cpu_context(rows), p, kernels, make_fn=_fake, ops=F.SCALED_MATMUL)
  by = {(r["backend"], r["variant"]): r for r in rows}
  ref = by[(runner.REF, SM.REF_BLOCK)]
  # XLA's reference is measured against the exact product too: bf16's rounding
  assert ref["status"] == "ok" and 0 < ref["error"] <= F.TOLERANCE / 2
  assert ref["xla_ref"] == SM.REF_BLOCK and all(r["scaling"] == "block" for r in rows)
  assert [v for b, v in by if b == F.PEER] == list(F.PEERS)
  for v in F.PEERS:
    peer = by[(F.PEER, v)]
    assert peer["status"] == "ok" and peer["error"] <= F.TOLERANCE and peer["speedup_vs_xla"] > 0
  assert by[(F.PEER, F.SCALED_OTHER_B)]["layout"] == "NT"   # b as that row stores it
  # Every later row's ratio is against the strongest baseline, through the reference.
  paired = [dict(by[(F.PEER, v)], speedup_vs_xla=by[(F.PEER, v)]["speedup_vs_paired"])
            for v in SM.baselines(p)]
  best, factor = F.strongest_of(p, paired)
  assert best in (SM.REF_BLOCK, *SM.baselines(p)) and factor >= 1
  for r in rows[1:]:   # (an unsupported backend's row, never run, keeps the reference's)
    assert r["xla_ref"] == (best if r["status"] != "unsupported" else SM.REF_BLOCK), r
    if r.get("speedup_vs_paired"):
      assert r["speedup_vs_xla"] == pytest.approx(r["speedup_vs_paired"] / factor)
      assert r["xla_time_ms"] == pytest.approx(r["time_ms_median"] * r["speedup_vs_xla"])
  assert all(by[(F.PEER, v)]["speedup_vs_xla"] <= 1 + 1e-9 for v in SM.baselines(p))
  assert by[("nope", "-")]["status"] == "unsupported"
  right = by[("fake", "right")]
  assert right["status"] == "ok" and right["tolerance"] == F.TOLERANCE
  assert 0 < right["error"] <= F.TOLERANCE
  off = by[("fake", "two_percent_off")]
  assert off["status"] == "fail" and off["error"] == pytest.approx(0.02, rel=0.1)
  assert "against the reference" in off["note"] and "time_ms_median" not in off
  assert by[("fake", "one_scale")]["status"] == "fail"


# Each kernel backend of scaled_matmul; those whose interpreter is slow only in `slow`.
OTHER_BACKENDS = [pytest.param(b, marks=[pytest.mark.slow] if b in SLOW_INTERPRETERS else [])
                  for b in jaxgemm.backends("scaled_matmul") if b != "xla"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS or [pytest.param("none", marks=pytest.mark.skip(
    reason="no scaled_matmul backend but xla is registered (yet)"))])
def test_each_registered_backend_runs_a_tiny_problem(backend):
  """Each kernel backend, interpreted, through the benchmark's path on the ragged shape with
  each scaling: checked against the exact product (`ok`, or correct but too slow to time,
  `skipped`; `unsupported` where the backend says so)."""
  rows = []
  for name in ("m40.k200.n72.tensor", "m40.k200.n72.block"):
    p = _tiny(name)
    runner.run_problem(cpu_context(rows, cpu_call_budget_s=5.0), p,
                       F.SCALED_MATMUL.kernels(p, [backend], "best", "bf16"), ops=F.SCALED_MATMUL)
  ours = [r for r in rows if r["backend"] == backend]
  assert len(ours) == 2
  for r in ours:
    assert r["status"] in ("ok", "skipped", "unsupported"), r
    if r["status"] != "unsupported":
      assert r["error"] <= F.TOLERANCE, r


# ---------------------------------------------------------------- the FP8 model

def test_fp8_model_is_the_dense_model_in_fp8():
  cfg = T.GPU_FP8_MODEL
  assert cfg.fp8 and cfg.op == "scaled_matmul" and not cfg.moe and not cfg.swiglu
  assert (cfg.d_model, cfg.d_ff, cfg.tokens, cfg.steps) == (4096, 14336, 8192, 100)
  assert cfg.attention == "flash" and "flash attention" in cfg.describe()
  assert T.fp8_model(False) is T.CPU_FP8_MODEL and T.fp8_model(True) is cfg
  assert cfg.name.startswith("fp8.transformer.") and "FP8" in cfg.describe()
  assert T.CPU_FP8_MODEL.name.startswith("fp8.") and T.CPU_FP8_MODEL.fp8
  mm = T.make_mm("xla", "fp8=block", "bf16")
  x = jnp.ones((4, 256), jnp.bfloat16)
  w = jnp.full((256, 8), 0.5, jnp.bfloat16)
  assert float(mm(x, w)[0, 0]) == 128.0


def test_fp8_options_are_recipes_the_gpu_suite_adds_for_auto():
  """The extra recipes (FP8_OPTIONS: the named ones as they were, float32 scales and
  XLA's quantizer) train through make_mm like the named ones; only a GPU run adds them,
  and only for `auto`."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal((70, 256)), jnp.bfloat16)
  w = jnp.asarray(np.random.default_rng(1).standard_normal((256, 136)) / 16, jnp.bfloat16)
  block = T.make_mm("xla", "fp8=block", "bf16")(x, w)
  option = T.make_mm("xla", "fp8=block+xla-quantize", "bf16")(x, w)
  np.testing.assert_array_equal(np.asarray(option, np.float32), np.asarray(block, np.float32))
  named = jaxgemm.Fp8Recipe.named("tensor")
  assert T.FP8_OPTIONS["tensor+f32-scales"] == dataclasses.replace(
      named, scale_dtype="float32", quantize_backend="xla")
  for on_gpu, backend, extra in ((True, runner.AUTO, True), (True, "xla", False),
                                 (False, runner.AUTO, False)):
    ctx = dataclasses.replace(cpu_context([]), platform="gpu" if on_gpu else "cpu")
    variants = [v for _, v, _ in T._fp8_runs(ctx, backend, "scaled_matmul")]
    want = [f"fp8={r}" for r in T.FP8_RECIPES + (tuple(T.FP8_OPTIONS) if extra else ())]
    assert variants == want, (on_gpu, backend)


def test_fp8_trajectory_gate_takes_the_running_mean():
  """The FP8 rows' trajectory check: a loss that oscillates around XLA's (this model's
  steps 26-38) passes, a sustained 12% offset or a NaN fails."""
  ref = [5.0 + 0.01 * i for i in range(40)]
  gate = lambda losses: T._max_rel_diff(*(T._running_mean(x, T.FP8_TRAJECTORY_WINDOW)
                                          for x in (losses, ref)))
  wobble = [r * (1 + 0.11 * (-1) ** i) for i, r in enumerate(ref)]
  assert T._max_rel_diff(wobble, ref) > T.FP8_TOLERANCES["trajectory"] > gate(wobble)
  drift = [r * (1.12 if i >= 20 else 1) for i, r in enumerate(ref)]
  assert gate(drift) > T.FP8_TOLERANCES["trajectory"]
  assert math.isnan(gate(ref[:10] + [float("nan")] + ref[11:]))
  assert T._running_mean([1.0, 2.0, 3.0], 10) == [2.0]


# 17 s of CI's CPU (at 7c98e04): in the GPU tier, where the training check it guards runs.
@pytest.mark.slow
def test_fp8_training_detects_a_wrong_gemm():
  """An FP8 GEMM that contracts the wrong rows of W trains to different gradients: a failure
  row; the right one agrees (FP8's own bounds) and reports its last-step loss difference."""
  def factory(backend, variant):
    if backend == runner.REF:
      return T.make_mm(runner.REF, runner.REF_VARIANT, "bf16")
    right = T.make_mm("xla", variant, "bf16")
    return right if variant == "fp8=tensor" else (lambda x, w: right(x, w[::-1]))

  rows = []
  cfg = dataclasses.replace(T.CPU_FP8_MODEL, steps=2)
  # On the platform it runs on (the GPU tier runs it too): a CPU context on a GPU stops
  # after the first step, whose wall time holds the GPU's warm-up, and skips the row.
  platform = timing.platform_of()
  ctx = cpu_context(rows, platform=platform, device_kind=platform, timer=timing.Timer(platform))
  T.run_training(ctx, ["xla"], "ladder", cfg=cfg, mm_factory=factory, suite="fp8-tiny")
  steps = {(r["backend"], r["variant"]): r for r in rows if r["kind"] == "train_step"}
  assert steps[(runner.REF, runner.REF_VARIANT)]["status"] == "ok"
  good, bad = steps[("xla", "fp8=tensor")], steps[("xla", "fp8=block")]
  assert good["status"] == "ok" and good["agree"] == 1 and good["tolerance"] == 0.10
  rows = []   # a --variants list picks the FP8 recipes to train
  T.run_training(cpu_context(rows), ["xla"], ["fp8=tensor"], cfg=cfg, mm_factory=factory,
                 suite="fp8-tiny")
  assert {r["variant"] for r in rows if r["kind"] == "train_step"} == {
      runner.REF_VARIANT, "fp8=tensor"}
  assert 0 < good["grad_rel_err"] <= T.FP8_TOLERANCES["grad"]
  assert good["loss_last_rel_diff"] == pytest.approx(
      abs(good["loss_last"] - steps[(runner.REF, runner.REF_VARIANT)]["loss_last"])
      / steps[(runner.REF, runner.REF_VARIANT)]["loss_last"])
  assert bad["status"] == "fail" and bad["agree"] == 0 and "disagrees" in bad["note"]


# ---------------------------------------------------------------- the tiny suite, end to end

@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench-fp8")
  rc = cli.main(["--suite", "fp8-tiny", "--backends", "auto,xla", "--iters", "3",
                 "--training-steps", "3", "--out", str(out), "--run-name", "cpu-fp8"])
  assert rc == 0
  return out / "cpu-fp8"


def test_fp8_tiny_run_writes_its_rows(fp8_run):
  rows = csvio.read_csv(fp8_run / "results.csv")
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert {r["problem"] for r in gemm} == {p.name for p in TINY}
  refs = {r["problem"]: r for r in gemm if r["backend"] == runner.REF}
  for p in TINY:
    r = refs[p.name]
    assert r["status"] == "ok" and r["suite"] == "fp8-tiny", r
    assert (r["scaling"], r["mode"], r["layer"], r["layout"], r["fp8_dtypes"]) == (
        p.scaling, p.mode, p.layer, p.layout, p.fp8_dtypes)
    assert r["variant"] == r["xla_ref"] == F.ref_variant(p)
    assert int(r["flops"]) == p.flops and int(r["min_bytes"]) == p.min_bytes("bf16")
    assert 0 < float(r["error"]) <= F.TOLERANCE
    peers = {x["variant"]: x for x in gemm if x["problem"] == p.name and x["backend"] == F.PEER}
    assert set(peers) == {F.FP8_DOT, F.BF16_DOT, *SM.baselines(p)}
    strongest = {x["xla_ref"] for x in gemm if x["problem"] == p.name and x is not r}
    assert len(strongest) == 1 and strongest <= {F.ref_variant(p), *SM.baselines(p)}
    assert all(x["status"] == "ok" and x["speedup_vs_paired"] for x in peers.values())
  kernels = [r for r in gemm if r["backend"] in ("xla", runner.AUTO)]
  assert len(kernels) == 2 * len(TINY)
  for r in kernels:
    assert r["status"] == "ok", r
    assert float(r["error"]) <= F.TOLERANCE and float(r["speedup_vs_xla"]) > 0
    assert float(r["speedup_vs_paired"]) > 0
  steps = {(r["backend"], r["variant"]): r for r in rows if r["kind"] == "train_step"}
  assert set(steps) == {(runner.REF, runner.REF_VARIANT)} | {
      (b, f"fp8={s}") for b in ("xla", runner.AUTO) for s in T.FP8_RECIPES}
  for (b, v), r in steps.items():
    assert r["status"] == "ok" and r["problem"] == T.CPU_FP8_MODEL.name, r
    if b != runner.REF:
      assert r["agree"] == "1" and float(r["loss_last_rel_diff"]) < T.FP8_TOLERANCES["trajectory"]
  assert len([r for r in rows if r["kind"] == "train_loss"]) == 5 * 3


def test_fp8_tiny_report(fp8_run):
  report = (fp8_run / "REPORT.md").read_text()
  assert "NOT GPU TIMINGS" in report[:600]
  suite = report[report.index("## Suite `fp8-tiny` (FP8 GEMMs)"):]
  header = next(x for x in suite.splitlines() if x.startswith("| problem |"))
  assert ("| XLA fp8 dot (no scales) | XLA scaled form, b (K, N) | XLA scaled form, b (N, K) | "
          "dequantize + XLA bf16 dot | XLA bf16 dot (dequantized beforehand) | strongest XLA "
          "baseline | default (auto), chose |") in header
  line = next(x for x in suite.splitlines() if x.startswith("| m64.k256.n128.wgrad.block |"))
  assert "| block | TN | 256x64x128 | e4m3xe4m3 |" in line and "`scaled_matmul[xla]`" in line
  issue44 = report[report.index("## FP8 against XLA's strongest baseline (issue 44)"):]
  issue44 = issue44[:issue44.index("\n## ", 5)]
  assert "| m4.k128.n256.block | NN | 4x128x256 |" in issue44     # block, <= 256 rows
  assert "Worst, tensor scales:" in issue44 and "n/a (not a GPU run)" in issue44
  assert "| XLA dot (bf16) | ok |" in report and "last-step loss rel diff vs XLA" in report
  targets = report[report.index("## FP8 GEMM targets (issue 28)"):]
  step = next(x for x in targets.splitlines() if x.startswith("| FP8 training step (fp8."))
  # a CPU run's step: the target (a GPU number, after 100 steps) does not apply
  assert "fp8=tensor" in step and step.endswith("| n/a (not a GPU run) |")
  assert "sq8192" not in targets.split("## Kernel ladders")[0]
  assert "#### FP8 GEMMs: suite `fp8-tiny`" in (fp8_run / "README_TABLES.md").read_text()


def test_cli_lists_the_fp8_suites():
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(["--list", "--suite", "fp8"]) == 0
  text = out.getvalue()
  assert "[scaled_matmul]" in text and "fp8-tiny" in text
  assert "m8192.k4096.n14336.wgrad.block" in text and "then an FP8 training step" in text


def test_time_budget_leaves_the_rest_skipped():
  rows = []
  ctx = cpu_context(rows, time_budget_s=1e-9)
  F.run_fp8_suite(ctx, "fp8-tiny", TINY[:2], ["xla"], "ladder", training_cfg=T.CPU_FP8_MODEL)
  assert ctx.time_budget_s == 1e-9
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert [r["problem"] for r in gemm] == [p.name for p in TINY[:2]]
  assert all(r["status"] == "skipped" and "time-budget" in r["note"] for r in gemm)
  steps = [r for r in rows if r["kind"] == "train_step"]
  assert len(steps) == 1 and steps[0]["status"] == "skipped"


# ---------------------------------------------------------------- a synthetic GPU run's report

# TFLOP/s of XLA's scaled form (the problem's layout, (K, N)), its fp8 dot, its bf16 dot, the
# scaled form with b (N, K), dequantize + bf16 dot (block scales), then the xla backend,
# triton, pallas and auto
_TF = {
    "sq8192.tensor": (1180, 1200, 700, 1300, None, 1180, 1400, 1380, 1400),   # (N, K) faster
    "m8192.k4096.n14336.tensor": (1150, 1170, 690, 1210, None, 1150, 1250, 1290, 1290),
    "m128.k4096.n14336.tensor": (300, 320, 250, 280, None, 300, 610, 590, 610),   # (K, N) faster
    "m128.k4096.n14336.block": (100, 320, 240, 105, 400, 100, 170, 175, 175),   # dequantized
    "sq4096.block": (150, 1000, 650, 160, 700, 150, 1010, 990, 1010),
}
_STEP_MS = {(runner.REF, runner.REF_VARIANT): (100.0, 0.0),
            (runner.AUTO, "fp8=tensor"): (78.0, 0.004), ("triton", "fp8=tensor"): (78.0, 0.004),
            (runner.AUTO, "fp8=block"): (82.0, 0.031), ("triton", "fp8=block"): (82.0, 0.031),
            ("xla", "fp8=tensor"): (85.0, 0.004), ("xla", "fp8=block"): (400.0, 0.03)}


def _synthetic_fp8_csv(path):
  """A GPU run's rows as bench/fp8.py writes them: each ratio against the strongest
  baseline, through the reference (`speedup_vs_paired`)."""
  prov = {"platform": "gpu", "device": "NVIDIA H100 80GB HBM3", "jax": "0.11.2",
          "git_commit": "abc", "date": "2026-11-26", "timer": "cupti", "run_id": "h100-fp8-test",
          "dtype": "bf16"}
  by = {p.name: p for p in FP8}
  rows = []
  for name, tfs in _TF.items():
    p = by[name]
    base = {**prov, **p.csv_fields("bf16"), "suite": "fp8", "kind": "gemm", "problem": name,
            "iters": 20}
    who = ((runner.REF, F.ref_variant(p)), (F.PEER, F.FP8_DOT), (F.PEER, F.BF16_DOT),
           (F.PEER, F.SCALED_OTHER_B), (F.PEER, F.DEQUANT_BF16), ("xla", "dot_general"),
           ("triton", "persistent"), ("pallas", "warp_specialized"),
           (runner.AUTO, runner.AUTO_VARIANT))
    ref_ms = p.flops / (tfs[0] * 1e12) * 1e3
    peers = [{"variant": v, "status": "ok", "speedup_vs_xla": tf / tfs[0]}
             for (_, v), tf in zip(who[3:5], tfs[3:5]) if tf is not None]
    best, factor = F.strongest_of(p, peers)
    for (b, v), tf in zip(who, tfs):
      if tf is None:
        continue
      ms = p.flops / (tf * 1e12) * 1e3
      row = {**base, "backend": b, "variant": v, "status": "ok", "time_ms_median": ms,
             "tflops": tf, "xla_time_ms": ref_ms, "speedup_vs_xla": ref_ms / ms,
             "chosen": "triton/persistent (table)" if b == runner.AUTO else ""}
      if b != runner.REF:
        F._against(best, factor)(row)
      rows.append(row)
  cfg = T.GPU_FP8_MODEL
  for (b, v), (ms, d) in _STEP_MS.items():
    rows.append({**prov, "suite": "fp8", "kind": "train_step", "backend": b, "variant": v,
                 "status": "ok", "time_ms_median": ms, "problem": cfg.name, "steps": cfg.steps,
                 "problem_note": cfg.describe(), "loss_first": 9, "loss_last": 5,
                 **({} if b == runner.REF else {"xla_time_ms": 100.0, "speedup_vs_xla": 100 / ms,
                                                "agree": 1, "loss_last_rel_diff": d})})
  w = csvio.CsvWriter(path)
  for r in rows:
    w(r)
  w.close()


def test_report_renders_the_issue_28_targets(tmp_path):
  """Every ratio against the strongest XLA baseline: the scaled form with b (N, K) where it
  is faster than (K, N), the dequantized bf16 dot where that is; issue 44's targets for
  the default beside issue 28's."""
  csv_path = tmp_path / "results.csv"
  _synthetic_fp8_csv(csv_path)
  made = generate(csv_path)
  run = made["run"]
  assert S.entry_of("fp8") is SM.ENTRY     # the report shows it with scaled_matmul's tables
  assert list(run.backend_variants) == ["xla", "triton", "pallas"]     # no xla_peer
  table = "\n".join(SM.fp8_targets_table(run))
  lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
  assert table.splitlines()[0] == (
      "| problem | target | XLA scaled form, b (K, N) | XLA scaled form, b (N, K) | dequantize "
      "+ XLA bf16 dot | xla (best variant) | triton (best variant) | pallas (best variant) | "
      "default (auto) |  |")
  big = lines["sq8192.tensor (8192x8192x8192, tensor scales)"]   # (N, K) the faster
  assert "| >= 1,350 TFLOP/s | 1,180.0 (0.91x) `dot_f32*scales` | 1,300.0 (1.00x) | - |" in big
  assert "| 1,400.0 (1.08x) persistent |" in big and big.endswith("| met |")
  assert lines["m8192.k4096.n14336.tensor (8192x4096x14336, tensor scales)"].endswith(
      "| **missed** |")
  small = lines["m128.k4096.n14336.tensor (128x4096x14336, tensor scales)"]   # (K, N) faster
  assert "| >= 2x XLA's strongest | 300.0 (1.00x) `dot_f32*scales` | 280.0 (0.93x) |" in small
  assert "| 610.0 (2.03x) persistent |" in small and small.endswith("| met |")
  decode = lines["m128.k4096.n14336.block (128x4096x14336, block scales)"]   # dequantized
  assert "| 100.0 (0.25x) `scaled_matmul[xla]` | 105.0 (0.26x) | 400.0 (1.00x) |" in decode
  assert "| 175.0 (0.44x) warp_specialized |" in decode and decode.endswith("| **missed** |")
  assert lines["sq4096.block (4096x4096x4096, block scales)"].endswith("| met |")
  assert not any(k.startswith("sq8192.block") for k in lines)              # not in this run
  tensor = lines[f"FP8 training step ({T.GPU_FP8_MODEL.name}), fp8=tensor"]
  assert "| 100.00 ms (bf16 step) |" in tensor and "| 1.28x (XLA 100.00 / 78.00 ms), loss 0.40% off |" in tensor
  assert tensor.endswith("| met |")
  block = lines[f"FP8 training step ({T.GPU_FP8_MODEL.name}), fp8=block"]
  assert block.endswith("| **missed** |")                     # 1.22x, and 3.1% off
  report = made["report"].read_text()
  assert "## FP8 GEMM targets (issue 28)" in report
  suite = report[report.index("## Suite `fp8` (FP8 GEMMs)"):]
  row = next(x for x in suite.splitlines() if x.startswith("| m128.k4096.n14336.block |"))
  assert ("| 320.0 (0.80x) | 100.0 (0.25x) `scaled_matmul[xla]` | 105.0 (0.26x) | 400.0 "
          "(1.00x) | 240.0 (0.60x) | dequantize + XLA bf16 dot | 175.0 (0.44x) "
          "triton/persistent (table) |") in row
  row = next(x for x in suite.splitlines() if x.startswith("| sq8192.tensor |"))
  assert "| 1,300.0 (1.00x) | - | 700.0 (0.54x) | scaled form, b (N, K) |" in row
  # issue 44's targets: the default against the strongest baseline
  issue44 = "\n".join(SM.fp8_baselines_table(run))
  assert ("| sq8192.tensor | NN | 8192x8192x8192 | scaled form, b (N, K): 1,300.0 | "
          "1,400.0 (1.08x) triton/persistent (table) | >= 0.98x | met |") in issue44
  assert ("| m128.k4096.n14336.block | NN | 128x4096x14336 | dequantize + XLA bf16 dot: 400.0 | "
          "175.0 (0.44x) triton/persistent (table) | >= 1.00x | **missed** |") in issue44
  assert "sq4096.block" not in issue44                     # above 256 rows: no target
  assert ("Worst, tensor scales: 1.07x (m8192.k4096.n14336.tensor), target >= 0.98x: met."
          in issue44)
  assert ("Worst, block scales: 0.44x (m128.k4096.n14336.block), target >= 1.00x: **missed**."
          in issue44)
  assert "## FP8 against XLA's strongest baseline (issue 44)" in report
  readme = made["readme_tables"].read_text()
  assert "#### FP8 GEMM targets (issue 28)" in readme and "#### FP8 GEMMs: suite `fp8`" in readme
  assert "#### FP8 against XLA's strongest baseline (issue 44)" in readme
  # the FP8 step is not the dense model's default target (issue 6's "<= XLA's step")
  assert not any("fp8." in line for line in MM.defaults_summary(run))
  assert "| XLA dot (bf16) | ok |" in report


def test_an_older_run_keeps_its_reference():
  """A CSV from before the baselines (no other layout, no speedup_vs_paired): ratios read
  as written, against the reference, and issue 44's targets not measured."""
  p = next(p for p in FP8 if p.name == "m128.k4096.n14336.tensor")
  ref = {**p.csv_fields("bf16"), "suite": "fp8", "kind": "gemm", "problem": p.name,
         "backend": runner.REF, "variant": F.ref_variant(p), "status": "ok", "tflops": 300,
         "platform": "gpu", "batch": 1, "dtype": "bf16"}
  auto = {**ref, "backend": runner.AUTO, "variant": runner.AUTO_VARIANT, "tflops": 600,
          "speedup_vs_xla": 2.0}
  run = View([ref, auto])
  assert SM.strongest(run, "fp8", ref) == (F.ref_variant(p), None)
  line = SM.fp8_baselines_table(run)[2]
  assert line.endswith("| >= 0.98x | not measured (no baselines) |") and "300.0 `" not in line


def test_a_step_run_alone_merges_with_the_gemm_run(tmp_path):
  """The GEMM table from one command (its step skipped by the budget) and the step from
  another (`--only 'fp8.*'`): the merged report has the measured step rows only."""
  _synthetic_fp8_csv(tmp_path / "full.csv")
  rows = csvio.read_csv(tmp_path / "full.csv")
  gemm_run = [dict(r, status="skipped", time_ms_median="", speedup_vs_xla="")
              if r["kind"] == "train_step" else r for r in rows]
  step_run = [dict(r, run_id="h100-fp8-step") for r in rows if r["kind"] == "train_step"]
  for name, part in (("a.csv", gemm_run), ("b.csv", step_run)):
    w = csvio.CsvWriter(tmp_path / name)
    for r in part:
      w(r)
    w.close()
  merged = csvio.merge_csvs([tmp_path / "a.csv", tmp_path / "b.csv"], tmp_path / "m" / "results.csv")
  run = generate(merged)["run"]
  steps = [r for r in run.rows if r["kind"] == "train_step"]
  assert len(steps) == len(_STEP_MS) and all(r["status"] == "ok" for r in steps)
  table = "\n".join(SM.fp8_targets_table(run))
  assert f"FP8 training step ({T.GPU_FP8_MODEL.name}), fp8=tensor" in table
  assert "skipped" not in "\n".join(tables.training_table(run))


def test_flash_attention_is_the_same_model():
  """attention="flash" (jax.nn.dot_product_attention) computes the loss the materialized
  attention does: same parameters, same batch, fp32, to fp32 rounding (without the
  causal mask the loss moves by 2%, 2000x the bound)."""
  base = dataclasses.replace(T.CPU_FP8_MODEL, fp8=False, attention="xla")
  params = T.init_params(base, 0)
  tokens, targets = next(T.batches(base, 0))
  mm = T.make_mm(T.REF, "", "fp32")
  losses = {}
  for attention in ("xla", "flash"):
    cfg = dataclasses.replace(base, attention=attention)
    losses[attention] = float(T.forward_loss(params, tokens, targets, cfg=cfg, mm=mm,
                                             dtype=jnp.float32))
  assert abs(losses["flash"] - losses["xla"]) <= 1e-5 * abs(losses["xla"]), losses


def test_model_attention_is_named():
  with pytest.raises(ValueError, match=r"attention='cudnn' must be one of \('xla', 'flash'\)"):
    dataclasses.replace(T.CPU_FP8_MODEL, attention="cudnn")
