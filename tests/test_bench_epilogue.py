"""CPU tests of the benchmark's epilogue suites (GEMM epilogues, issue 27): bench/epilogue.py.

The problem table (issue 27's expressions at its shapes and the llm suite's MLP
shapes, forward and forward + backward), XLA's reference expressions against
float64 formulas, the forward + backward wrapper against jax.grad, the
correctness gate on every output array (a wrong gradient alone fails), an
`epilogue-tiny` run end to end (rows, the SwiGLU training step, the report),
and the report's tables and issue-27 targets from a synthetic GPU CSV. Only the
xla backend and the default run end to end here; each other registered
fused_matmul backend runs one tiny problem in its interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench_testing import cpu_context
import jaxgemm
from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import epilogue as E
from jaxgemm.bench import runner
from jaxgemm.bench import suites as S
from jaxgemm.bench import training as T
from jaxgemm.bench import tune
from jaxgemm.bench.ops import fused_matmul as FM
from jaxgemm.bench.ops import matmul as MM
from jaxgemm.bench.report import csvio
from jaxgemm.bench.report.make import generate
from conftest import SLOW_INTERPRETERS

EPI = FM.EPILOGUE_SUITES["epilogue"]
TINY = FM.EPILOGUE_SUITES["epilogue-tiny"]
ISSUE_SHAPES = {"m8192.k4096.n14336": (8192, 4096, 14336), "sq4096": (4096, 4096, 4096),
                "m128.k4096.n14336": (128, 4096, 14336)}



def _tiny(name):
  return next(p for p in TINY if p.name == name)


# ---------------------------------------------------------------- the problem table

def test_epilogue_suite_is_the_issues_table():
  assert S.SUITE_OP["epilogue"] == S.SUITE_OP["epilogue-tiny"] == "fused_matmul"
  assert "epilogue-tiny" in S.CPU_DEFAULT_SUITES and "epilogue" not in S.GPU_DEFAULT_SUITES
  by = {p.name: p for p in EPI}
  assert len(by) == len(EPI) and len({p.name for p in TINY}) == len(TINY)
  for layer, (m, k, n) in ISSUE_SHAPES.items():
    for expr in FM.EXPRESSIONS:
      for mode in FM.EPILOGUE_MODES:
        p = by[f"{layer}.{expr}" + ("" if mode == "fwd" else ".fwd+bwd")]
        assert (p.m, p.k, p.n, p.expr, p.mode, p.layer) == (m, k, n, expr, mode, layer)
  # the default set is the issue's table: every expression forward at the three shapes
  # (SwiGLU not at 4096^3), the GELU layer's and SwiGLU's forward + backward
  default = {(p.layer, p.expr, p.mode) for p in EPI if p.default}
  want = {(layer, e, "fwd") for layer in ISSUE_SHAPES for e in FM.EXPRESSIONS} - {
      ("sq4096", "swiglu", "fwd")}
  want |= {(layer, "bias.gelu", "fwd+bwd") for layer in ISSUE_SHAPES}
  want |= {(layer, "swiglu", "fwd+bwd") for layer in ("m8192.k4096.n14336", "m128.k4096.n14336")}
  assert default == want
  # the llm suite's MLP shapes: gate/up with an activation or as SwiGLU, down with a residual
  llm = {(p.layer, p.expr, p.m, p.k, p.n) for p in EPI if p.layer.startswith("llama") and p.mode == "fwd"}
  assert ("llama3-8b.up.t2048", "swiglu", 2048, 4096, 14336) in llm
  assert ("llama3-70b.up.t4096", "bias.gelu", 4096, 8192, 28672) in llm
  assert {(m, k, n) for layer, e, m, k, n in llm if e == "bias.residual"} == {
      (128, 14336, 4096), (2048, 14336, 4096), (8192, 14336, 4096), (4096, 28672, 8192)}
  assert all(p.dtype is None and p.layout == "NN" for p in EPI + TINY)
  assert set(FM.EPILOGUE_OPS) == {"fused_matmul", "glu"}


def test_problem_operands_flops_and_bytes():
  p = next(p for p in EPI if p.name == "m8192.k4096.n14336.bias.residual.fwd+bwd")
  m, k, n = 8192, 4096, 14336
  assert p.input_shapes() == [(m, k), (k, n), (n,), (m, n), (m, n)]    # x w b residual dy
  assert p.grad_argnums() == (0, 1, 2) and p.gemms == 3 and p.flops == 6 * m * k * n
  # read x w b residual dy, write y dx dw db
  assert p.min_bytes("bf16") == 2 * (m * k + k * n + n + m * n + m * n + m * n + m * k + k * n + n)
  glu = next(p for p in EPI if p.name == "m128.k4096.n14336.swiglu")
  assert glu.input_shapes() == [(128, 4096), (4096, 14336), (4096, 14336)]
  assert glu.gemms == 2 and glu.op == "glu" and glu.flops == 4 * 128 * 4096 * 14336
  glu_b = next(p for p in EPI if p.name == "m128.k4096.n14336.swiglu.fwd+bwd")
  assert glu_b.grad_argnums() == (0, 1, 2) and glu_b.gemms == 6
  assert {p.op for p in EPI} == {"matmul", "fused_matmul", "glu"}
  fields = p.csv_fields("bf16")
  assert (fields["expr"], fields["mode"], fields["layer"]) == (
      "bias.residual", "fwd+bwd", "m8192.k4096.n14336")
  assert E.input_scales(p) == [1.0, 1 / 64, 1.0, 1.0, 1.0]
  assert E.input_scales(glu) == [1.0, 1 / 64, 1 / 64]


def _np_gelu(z):
  return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def _np_silu(z):
  return z / (1 + np.exp(-z))


def test_xla_expressions_are_the_issues():
  rng = np.random.default_rng(0)
  x, w, wu = (rng.standard_normal(s) for s in ((5, 7), (7, 6), (7, 6)))
  b, r = rng.standard_normal(6), rng.standard_normal((5, 6))
  want = {"dot": x @ w, "bias": x @ w + b, "bias.gelu": _np_gelu(x @ w + b),
          "silu": _np_silu(x @ w), "bias.residual": x @ w + b + r,
          "swiglu": _np_silu(x @ w) * (x @ wu)}
  args = {"dot": (x, w), "bias": (x, w, b), "bias.gelu": (x, w, b), "silu": (x, w),
          "bias.residual": (x, w, b, r), "swiglu": (x, w, wu)}
  for name, e in FM.EXPRESSIONS.items():
    got = E.xla_expression(e)(*(jnp.asarray(a, jnp.float32) for a in args[name]))
    np.testing.assert_allclose(np.asarray(got), want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert FM._expr_text({"expr": name, "mode": "fwd+bwd"}) == f"{e.text} (fwd+bwd)"


def test_forward_backward_is_the_vjp():
  p = _tiny("m40.k24.n72.bias.gelu.fwd+bwd")
  ops = [jnp.asarray(a, jnp.float32) for a in E.EPILOGUE.inputs(p, "fp32", 1, 0)]
  assert [o.shape for o in ops] == p.input_shapes()
  y, dx, dw, db = jax.jit(E.ref_fn(p, "fp32-highest"))(*ops)
  x, w, b, dy = ops
  f = E.xla_expression(p.expression, jax.lax.Precision.HIGHEST)
  gx, gw, gb = jax.grad(lambda *a: jnp.sum(f(*a) * dy), argnums=(0, 1, 2))(x, w, b)
  np.testing.assert_allclose(y, f(x, w, b), rtol=1e-5, atol=1e-6)
  for got, want in ((dx, gx), (dw, gw), (db, gb)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # the weights are scaled 1/sqrt(K): the pre-activation is O(1)
  assert 0.3 < float(jnp.std(x @ w)) < 3


# ---------------------------------------------------------------- the correctness gate

def _fake(bp, dtype_name, backend, variant):
  """The xla reference, but with the weight gradient 20% off, or raising."""
  ref = E.ref_fn(bp, dtype_name)
  if variant == "wrong_dw":
    def f(*a):
      y, dx, dw, *rest = ref(*a)
      return (y, dx, (dw.astype(jnp.float32) * 1.2).astype(dw.dtype), *rest)
    return f
  if variant == "right":
    return ref
  raise AssertionError(variant)


def test_a_wrong_gradient_alone_fails_and_unregistered_backends_are_unsupported():
  p = _tiny("m64.k32.n128.bias.gelu.fwd+bwd")
  kernels = E.EPILOGUE.kernels(p, [runner.AUTO, "nope"], "ladder", "bf16")
  assert kernels[0] == (runner.AUTO, runner.AUTO_VARIANT, "")
  assert kernels[1][0] == "nope" and kernels[1][2].startswith(runner.UNSUPPORTED_PREFIX)
  kernels = [kernels[1], ("fake", "right", ""), ("fake", "wrong_dw", "")]
  rows = []
  runner.run_problem(cpu_context(rows), p, kernels, make_fn=_fake, ops=E.EPILOGUE)
  by = {(r["backend"], r["variant"]): r for r in rows}
  ref = by[(runner.REF, "jnp+vjp")]
  assert ref["status"] == "ok" and ref["expr"] == "bias.gelu" and ref["mode"] == "fwd+bwd"
  assert by[("nope", "-")]["status"] == "unsupported"
  # Checked against the expression in fp32 (`check_fn`), not XLA's bf16 program: XLA's
  # own result is off it by bf16 rounding only.
  right = by[("fake", "right")]
  assert right["status"] == "ok" and 0 < right["error"] <= runner.TOLERANCE["bf16"]
  bad = by[("fake", "wrong_dw")]
  assert bad["status"] == "fail" and bad["error"] == pytest.approx(0.2, rel=0.05)


def test_named_variants_and_the_default_label():
  p = _tiny("m64.k32.n128.bias.gelu")
  op = p.op
  for b in jaxgemm.backends(op):
    assert E.EPILOGUE.kernels(p, [b], "best", "bf16") == [(b, runner.DEFAULT_VARIANT, "")]
    every = E.EPILOGUE.kernels(p, [b], "all", "bf16")
    assert [v for _, v, _ in every] == list(jaxgemm.variants(b, op))
    none = E.EPILOGUE.kernels(p, [b], ["no-such-variant"], "bf16")
    assert none[0][:2] == (b, runner.DEFAULT_VARIANT) and "its default" in none[0][2]


# Each kernel backend of fused_matmul; those whose interpreter is slow only in `slow`.
OTHER_BACKENDS = [pytest.param(b, marks=[pytest.mark.slow] if b in SLOW_INTERPRETERS else [])
                  for b in jaxgemm.backends("fused_matmul") if b != "xla"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS or [pytest.param("none", marks=pytest.mark.skip(
    reason="no fused_matmul backend but xla is registered (yet)"))])
def test_each_registered_backend_runs_a_tiny_problem(backend):
  """Each kernel backend, interpreted, through the benchmark's path on the ragged shape's
  GELU layer and SwiGLU, forward: checked against XLA (`ok`, or correct but too slow
  to time, `skipped`; `unsupported` where the backend has no glu kernels)."""
  rows = []
  for name in ("m40.k24.n72.bias.gelu", "m40.k24.n72.swiglu"):
    p = _tiny(name)
    runner.run_problem(cpu_context(rows, cpu_call_budget_s=5.0), p,
                       E.EPILOGUE.kernels(p, [backend], "best", "bf16"), ops=E.EPILOGUE)
  ours = [r for r in rows if r["backend"] == backend]
  assert len(ours) == 2
  for r in ours:
    assert r["status"] in ("ok", "skipped", "unsupported"), r
    if r["status"] != "unsupported":
      assert r["error"] <= runner.TOLERANCE["bf16"], r


# ---------------------------------------------------------------- the SwiGLU model

def test_swiglu_model_is_llama_style_with_biases():
  cfg = T.GPU_SWIGLU_MODEL
  assert cfg.swiglu and cfg.op == "fused_matmul" and not T.GPU_MODEL.swiglu
  assert cfg.d_ff % 256 == 0 and cfg.d_ff >= 8 * cfg.d_model / 3
  assert T.swiglu_model(False) is T.CPU_SWIGLU_MODEL and T.swiglu_model(True) is cfg
  assert cfg.name.startswith("swiglu.") and "SwiGLU" in cfg.describe()
  c = T.CPU_SWIGLU_MODEL
  lp = T.init_params(c, 0)["layers"][0]
  d, ff = c.d_model, c.d_ff
  assert {k: v.shape for k, v in lp.items()} == {
      "qkv": (d, 3 * d), "qkv_b": (3 * d,), "o": (d, d), "o_b": (d,), "gate": (d, ff),
      "gate_b": (ff,), "up": (d, ff), "up_b": (ff,), "down": (ff, d), "down_b": (d,)}
  assert all(float(jnp.abs(lp[k]).max()) > 0 for k in lp if k.endswith("_b"))
  assert c.dense_flops == 6 * c.tokens * (c.n_layers * (4 * d * d + 3 * d * ff) + d * c.vocab)


def test_swiglu_block_is_the_jnp_layer():
  """swiglu_block on XLA's epilogues against the layer written out in float64."""
  c = dataclasses.replace(T.CPU_SWIGLU_MODEL, batch=1, seq=3)
  lp = T.init_params(c, 1)["layers"][0]
  h = jax.random.normal(jax.random.key(2), (1, 3, c.d_model), jnp.float32)
  ep = T.make_epilogues(runner.REF, runner.REF_VARIANT, "fp32-highest")
  ident = lambda qkv: qkv[..., : c.d_model]                 # noqa: E731 (attention: q)
  got = T.swiglu_block(h, lp, cfg=c, ep=ep, dtype=jnp.float32, attention=ident)
  p = {k: np.asarray(v, np.float64) for k, v in lp.items()}
  x = np.asarray(h, np.float64)[0]

  def norm(v):
    return v / np.sqrt(np.mean(v * v, -1, keepdims=True) + 1e-6)

  q = (norm(x) @ p["qkv"] + p["qkv_b"])[:, : c.d_model]
  x = x + q @ p["o"] + p["o_b"]
  n = norm(x)
  x = x + (_np_silu(n @ p["gate"] + p["gate_b"]) * (n @ p["up"] + p["up_b"])) @ p["down"] \
      + p["down_b"]
  np.testing.assert_allclose(np.asarray(got)[0], x, rtol=2e-4, atol=2e-4)


def test_swiglu_training_detects_a_wrong_glu():
  """A glu 20% off trains to a different loss: a failure row."""
  def factory(backend, variant):
    ep = T.make_epilogues(runner.REF, runner.REF_VARIANT, "bf16")
    if backend == runner.REF:
      return ep
    return T.Epilogues(ep.linear, lambda *a: (ep.glu(*a).astype(jnp.float32) * 1.2).astype(
        a[0].dtype))

  rows = []
  cfg = dataclasses.replace(T.CPU_SWIGLU_MODEL, steps=2)
  T.run_training(cpu_context(rows), ["xla"], "ladder", cfg=cfg, mm_factory=factory,
                 suite="epilogue-tiny")
  steps = {r["backend"]: r for r in rows if r["kind"] == "train_step"}
  assert steps[runner.REF]["status"] == "ok"
  if "xla" in jaxgemm.backends("fused_matmul"):
    assert steps["xla"]["status"] == "fail" and steps["xla"]["agree"] == 0
  else:
    assert steps["xla"]["status"] == "unsupported"


# ---------------------------------------------------------------- the tiny suite, end to end

API = pytest.mark.skipif("fused_matmul" not in jaxgemm.registry.ops(),
                         reason="jaxgemm.matmul(bias=, activation=) and jaxgemm.glu not here yet")


@pytest.fixture(scope="module")
def epi_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench-epilogue")
  rc = cli.main(["--suite", "epilogue-tiny", "--backends", "auto,xla", "--iters", "3",
                 "--training-steps", "3", "--out", str(out), "--run-name", "cpu-epilogue"])
  assert rc == 0
  return out / "cpu-epilogue"


@API
def test_epilogue_tiny_run_writes_its_rows(epi_run):
  rows = csvio.read_csv(epi_run / "results.csv")
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert {r["problem"] for r in gemm} == {p.name for p in TINY}
  refs = {r["problem"]: r for r in gemm if r["backend"] == runner.REF}
  for p in TINY:
    r = refs[p.name]
    assert r["status"] == "ok" and r["suite"] == "epilogue-tiny", r
    assert (r["expr"], r["mode"], r["layer"]) == (p.expr, p.mode, p.layer)
    assert r["variant"] == ("jnp+vjp" if p.backward else "jnp")
    assert int(r["flops"]) == p.flops and int(r["min_bytes"]) == p.min_bytes("bf16")
  kernels = [r for r in gemm if r["backend"] in ("xla", runner.AUTO)]
  assert len(kernels) == 2 * len(TINY)
  for r in kernels:
    assert r["status"] == "ok", r
    assert float(r["error"]) <= runner.TOLERANCE["bf16"] and float(r["speedup_vs_xla"]) > 0
    assert r["variant"] == (runner.AUTO_VARIANT if r["backend"] == runner.AUTO
                            else runner.DEFAULT_VARIANT)
  steps = {r["backend"]: r for r in rows if r["kind"] == "train_step"}
  assert set(steps) == {runner.REF, "xla", runner.AUTO}
  for b in ("xla", runner.AUTO):
    assert steps[b]["status"] == "ok" and steps[b]["agree"] == "1", steps[b]
    assert steps[b]["suite"] == "epilogue-tiny" and steps[b]["problem"].startswith("swiglu.")
  assert len([r for r in rows if r["kind"] == "train_loss"]) == 3 * 3


@API
def test_epilogue_tiny_report(epi_run):
  report = (epi_run / "REPORT.md").read_text()
  assert "NOT GPU TIMINGS" in report[:600]
  suite = report[report.index("## Suite `epilogue-tiny` (GEMM epilogues)"):]
  line = next(x for x in suite.splitlines() if x.startswith("| m64.k32.n128.bias.gelu |"))
  assert "| gelu(x @ w + b) | 64x32x128 |" in line
  assert "| XLA (jnp) | ok |" in report                     # the SwiGLU step's reference
  targets = report[report.index("## GEMM epilogue targets (issue 27)"):]
  assert "SwiGLU training step (swiglu." in targets and "m8192" not in targets
  assert "#### GEMM epilogues: suite `epilogue-tiny`" in (epi_run / "README_TABLES.md").read_text()


def test_tune_collects_every_gemm_of_the_suite_and_its_step():
  """`python -m bench tune --suite epilogue-tiny`'s problems: each default problem's fused
  forward, glu, and the gated backward GEMMs, then the SwiGLU step's."""
  found = tune.epilogue_problems("bf16", "epilogue-tiny")
  assert len(found) == len(set(found))
  by_op = {}
  for p in found:
    by_op.setdefault(p.op, []).append(p)
  assert set(by_op) == {"matmul", "fused_matmul", "glu"}
  fused = by_op["fused_matmul"]
  assert any(p.activation == "gelu" and p.bias == "shared" and (p.m, p.k, p.n) == (64, 32, 128)
             for p in fused)
  assert any(p.gate == "lhs" for p in fused) and any(p.gate == "rhs" for p in fused)
  assert any(p.residual and (p.m, p.k, p.n) == (4, 64, 96) for p in fused)
  c = T.CPU_SWIGLU_MODEL                       # the step's glu: tokens x d_model -> d_ff
  assert any((p.m, p.k, p.n) == (c.tokens, c.d_model, c.d_ff) and p.bias for p in by_op["glu"])


def test_cli_lists_the_epilogue_suites():
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(["--list", "--suite", "epilogue"]) == 0
  text = out.getvalue()
  assert "[fused_matmul]" in text and "epilogue-tiny" in text
  assert "m8192.k4096.n14336.bias.gelu.fwd+bwd" in text and "llama3-70b.down.t4096" in text
  assert "then a SwiGLU training step" in text


# ---------------------------------------------------------------- a synthetic GPU run's report

# us of XLA's program and of each backend's kernel (xla backend, triton, pallas, auto)
_US = {
    "m8192.k4096.n14336.dot": (1192, 1190, 1200, 1195, 1192),
    "m8192.k4096.n14336.bias.gelu": (1388, 1380, 1250, 1240, 1240),        # 1.12x: met
    "m128.k4096.n14336.bias.gelu": (38.3, 38.0, 35.0, 33.0, 33.0),         # 1.16x: met
    "m128.k4096.n14336.swiglu": (72.1, 72.0, 70.0, 69.0, 69.0),            # 1.04x: missed
    "m8192.k4096.n14336.bias.gelu.fwd+bwd": (3720, 3700, 3650, 3600, 3600),  # 1.03x: met
}
_STEP_MS = {runner.REF: 10.0, "xla": 10.1, "triton": 9.6, "pallas": 9.8, runner.AUTO: 9.65}


def _synthetic_epilogue_csv(path):
  prov = {"platform": "gpu", "device": "NVIDIA H200", "jax": "0.11.2", "git_commit": "abc",
          "date": "2026-11-26", "timer": "cupti", "run_id": "h200-epilogue-test",
          "dtype": "bf16"}
  by = {p.name: p for p in EPI}
  rows = []
  for name, times in _US.items():
    p = by[name]
    base = {**prov, **p.csv_fields("bf16"), "suite": "epilogue", "kind": "gemm",
            "problem": name, "iters": 20}
    who = ((runner.REF, "jnp"), ("xla", "(default)"), ("triton", "(default)"),
           ("pallas", "persistent"), (runner.AUTO, runner.AUTO_VARIANT))
    for (b, v), us in zip(who, times):
      ms = us * 1e-3
      rows.append({**base, "backend": b, "variant": v, "status": "ok", "time_ms_median": ms,
                   "tflops": p.flops / (ms * 1e-3) / 1e12, "speedup_vs_xla": times[0] / us,
                   "xla_time_ms": times[0] * 1e-3,
                   "chosen": "triton/persistent (table)" if b == runner.AUTO else ""})
  cfg = T.GPU_SWIGLU_MODEL
  for b, ms in _STEP_MS.items():
    v = runner.REF_VARIANT if b == runner.REF else (
        runner.AUTO_VARIANT if b == runner.AUTO else runner.DEFAULT_VARIANT)
    rows.append({**prov, "suite": "epilogue", "kind": "train_step", "backend": b, "variant": v,
                 "status": "ok", "time_ms_median": ms, "problem": cfg.name,
                 "problem_note": cfg.describe(), "loss_first": 9, "loss_last": 5,
                 **({} if b == runner.REF else {"xla_time_ms": 10.0, "speedup_vs_xla": 10.0 / ms,
                                                "agree": 1})})
  w = csvio.CsvWriter(path)
  for r in rows:
    w(r)
  w.close()


def test_report_renders_the_issue_27_targets(tmp_path):
  csv_path = tmp_path / "results.csv"
  _synthetic_epilogue_csv(csv_path)
  made = generate(csv_path)
  run = made["run"]
  assert S.entry_of("epilogue") is FM.ENTRY     # the report shows it with fused_matmul's tables
  table = "\n".join(FM.epilogue_targets_table(run))
  lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
  assert table.splitlines()[0] == ("| expression at MxKxN | target vs XLA | XLA | xla (best "
                                   "variant) | triton (best variant) | pallas (best variant) | "
                                   "default (auto) |  |")
  gelu = lines["gelu(x @ w + b) at 8192x4096x14336"]
  assert "| >= 1.10x | 1,388 us |" in gelu and "| 1,240 us (1.12x) persistent |" in gelu
  assert gelu.endswith("| met |")
  small = lines["gelu(x @ w + b) at 128x4096x14336"]                        # 1.16x >= 1.12x
  assert "| 38.3 us |" in small and "| 33.0 us (1.16x) persistent |" in small
  assert small.endswith("| met |")
  assert lines["silu(x @ wg) * (x @ wu) at 128x4096x14336"].endswith("| **missed** |")
  assert lines["gelu(x @ w + b) (fwd+bwd) at 8192x4096x14336"].endswith("| met |")
  assert not any(k.startswith("silu(x @ w) at") for k in lines)           # not in this run
  step = lines[f"SwiGLU training step ({T.GPU_SWIGLU_MODEL.name}), default"]
  assert "| 10.00 ms |" in step and "| 1.04x (XLA 10.00 / 9.65 ms) |" in step
  assert step.endswith("| met |")
  report = made["report"].read_text()
  assert "## GEMM epilogue targets (issue 27)" in report
  suite = report[report.index("## Suite `epilogue` (GEMM epilogues)"):]
  row = next(x for x in suite.splitlines() if x.startswith("| m8192.k4096.n14336.bias.gelu |"))
  # XLA's program against its bare dot at the shape: 1388 / 1192
  assert "| gelu(x @ w + b) | 8192x4096x14336 | 1,388 us (1.164x) |" in row
  assert "| 1,240 us (1.12x) triton/persistent (table) |" in row
  bwd = next(x for x in suite.splitlines() if x.startswith("| m8192.k4096.n14336.bias.gelu.fwd+bwd"))
  assert f"| 3,720 us ({3720 / (3 * 1192):.3f}x) |" in bwd
  readme = made["readme_tables"].read_text()
  assert "#### GEMM epilogue targets (issue 27)" in readme
  assert "#### GEMM epilogues: suite `epilogue`" in readme
  # the SwiGLU step is not the dense model's default target (issue 6's "<= XLA's step")
  assert not any("swiglu." in line for line in MM.defaults_summary(run))
  assert "| XLA (jnp) | ok |" in report


def test_time_budget_leaves_the_rest_skipped():
  """Out of time: the problems and the training step are recorded as skipped, unrun."""
  rows = []
  ctx = cpu_context(rows, time_budget_s=1e-9)
  E.run_epilogue_suite(ctx, "epilogue-tiny", TINY[:2], ["xla"], "ladder",
                       training_cfg=T.CPU_SWIGLU_MODEL)
  assert ctx.time_budget_s == 1e-9
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert [r["problem"] for r in gemm] == [p.name for p in TINY[:2]]
  assert all(r["status"] == "skipped" and "time-budget" in r["note"] for r in gemm)
  steps = [r for r in rows if r["kind"] == "train_step"]
  assert len(steps) == 1 and steps[0]["status"] == "skipped"
