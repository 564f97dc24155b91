"""CPU tests of the benchmark's moe suites (grouped GEMM, issue 26): bench/moe.py.

The problem table (the issue's problems and backward GEMMs, their shapes as lax
sees them, FLOPs and the bytes of the experts that have tokens), the group
sizes (a fixed Dirichlet(2) split), the correctness gate on a grouped kernel,
a `moe-tiny` run end to end (CSV columns, rows, the MoE training step, the
report), and the report's tables and issue-26 targets from a synthetic GPU CSV.
Only the xla backend and the default run end to end here; each other
registered ragged_dot backend runs one tiny problem in its interpreter.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from bench_testing import cpu_context
import jaxgemm
from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import moe
from jaxgemm.bench import runner
from jaxgemm.bench import suites as S
from jaxgemm.bench import training as T
from jaxgemm.bench.ops import matmul as MM
from jaxgemm.bench.ops import ragged_dot as RD
from jaxgemm.bench.report import csvio, tables
from jaxgemm.bench.report.make import generate
from jaxgemm.ops.ragged_dot.primitive import example_group_sizes
from conftest import SLOW_INTERPRETERS

MOE = RD.MOE_SUITES["moe"]
TINY = RD.MOE_SUITES["moe-tiny"]



# ---------------------------------------------------------------- the problem table

def test_moe_suite_is_the_issues_problems():
  assert S.SUITE_OP["moe"] == S.SUITE_OP["moe-tiny"] == "ragged_dot"
  assert "moe-tiny" in S.CPU_DEFAULT_SUITES and "moe" not in S.GPU_DEFAULT_SUITES
  fwd = {(p.groups, p.m, p.k, p.n) for p in MOE if p.mode == "fwd"}
  assert fwd == {(8, 16384, 4096, 14336), (64, 16384, 2048, 1408), (128, 8192, 7168, 2048),
                 (8, 128, 4096, 14336)}
  by = {p.name: p for p in MOE}
  for layer in ("g8.m16384.k4096.n14336", "g64.m16384.k2048.n1408"):
    f, d, w = by[layer], by[layer + ".dgrad"], by[layer + ".wgrad"]
    assert (f.mode, d.mode, w.mode) == ("fwd", "dgrad", "wgrad")
    assert (f.layout, d.layout, w.layout) == ("NN", "NT", "TN")
    assert f.flops == d.flops == w.flops == 2 * f.m * f.k * f.n
  assert {p.layer for p in MOE if p.mode != "fwd"} == {"g8.m16384.k4096.n14336",
                                                       "g64.m16384.k2048.n1408"}
  # the memory-bound ones: 3.76 GB and 0.94 GB of weights
  g128, decode = by["g128.m8192.k7168.n2048"], by["g8.m128.k4096.n14336"]
  assert 128 * 7168 * 2048 * 2 == pytest.approx(3.76e9, rel=1e-3)
  assert g128.min_bytes("bf16") > 3.76e9 and decode.min_bytes("bf16") > 0.939e9
  assert all(p.default for p in MOE) and any(p.quick for p in MOE)
  for suite in RD.MOE_SUITES.values():
    assert len({p.name for p in suite}) == len(suite)


@pytest.mark.parametrize("mp", MOE + TINY, ids=lambda p: f"{p.suite}-{p.name}")
def test_moe_shapes_match_lax(mp):
  """Operand shapes, dimension numbers and output agree as lax and jaxgemm see them."""
  lhs = jax.ShapeDtypeStruct(mp.lhs_shape(), jnp.bfloat16)
  rhs = jax.ShapeDtypeStruct(mp.rhs_shape(), jnp.bfloat16)
  gs = jax.ShapeDtypeStruct((mp.groups,), jnp.int32)
  out = jax.eval_shape(moe.ref_fn(mp, "bf16"), lhs, rhs, gs)
  assert out.shape == mp.out_shape()
  assert jax.eval_shape(lambda l, r, g: lax.ragged_dot_general(
      l, r, g, mp.dimension_numbers()), lhs, rhs, gs).shape == mp.out_shape()
  rp = moe.ragged_problem(mp, "bf16")
  assert rp.flops == mp.flops and rp.groups == mp.groups
  assert rp.min_bytes == mp.min_bytes("bf16")          # every expert has tokens
  assert (rp.trans_rhs, rp.ragged_contracting) == (mp.mode == "dgrad", mp.mode == "wgrad")


def test_min_bytes_count_only_experts_with_tokens():
  mp = next(p for p in TINY if p.name == "g8.m48.k32.n64.edges")
  sized = moe.RAGGED_DOT.prepare(cpu_context([]), mp, "bf16")
  assert sized.active_groups == 5 and sized.group_sizes == mp.group_sizes
  item = 2
  assert sized.min_bytes("bf16") == item * (48 * 32 + 5 * 32 * 64 + 48 * 64)
  assert mp.min_bytes("bf16") == item * (48 * 32 + 8 * 32 * 64 + 48 * 64)
  fields = sized.csv_fields("bf16")
  assert (fields["groups"], fields["active_groups"], fields["mode"]) == (8, 5, "fwd")
  assert fields["group_sizes"] == "10 0 1 20 0 9 8 0"
  wgrad = dataclasses.replace(sized, mode="wgrad")      # every group's block is written
  assert wgrad.min_bytes("bf16") == item * (48 * 32 + 48 * 64 + 8 * 32 * 64)


def test_group_sizes_are_a_fixed_dirichlet_split():
  mp = next(p for p in MOE if p.name == "g64.m16384.k2048.n1408")
  sizes = moe.group_sizes(mp, 0)
  assert sizes.shape == (64,) and sizes.sum() == 16384 and (sizes >= 0).all()
  assert len(set(sizes.tolist())) > 10                       # uneven
  assert (moe.group_sizes(mp, 0) == sizes).all()             # the same every time
  assert (moe.group_sizes(dataclasses.replace(mp, mode="wgrad"), 0) == sizes).all()
  problem = jaxgemm.RaggedDotProblem(1, 64, 16384, 2048, 1408, np.dtype("float32"),
                                     np.dtype("float32"), np.dtype("float32"))
  with jax.default_device(jax.devices("cpu")[0]):
    ref = np.asarray(example_group_sizes(problem, jax.random.key(0)))[0]
  assert (sizes == ref).all()


def test_example_configs_divide_the_problem():
  by = {p.name: p for p in MOE}
  for name, p in by.items():
    for bm, bn, bk, steps, gbn in moe.example_configs(p):
      assert p.k % bk == 0 and p.n % (bn * gbn) == 0
  assert len(moe.example_configs(by["g8.m16384.k4096.n14336"])) == len(moe.EXAMPLE_CONFIGS)
  assert 2 <= len(moe.example_configs(by["g64.m16384.k2048.n1408"])) < len(moe.EXAMPLE_CONFIGS)


# ---------------------------------------------------------------- the correctness gate

def _fake_grouped(mp, dtype_name, backend, variant):
  if backend != "fake":
    return moe.kernel_fn(mp, dtype_name, backend, variant)
  ref = moe.ref_fn(mp, dtype_name)
  if variant == "ignores_groups":      # every row multiplied by group 0's weights
    return lambda l, r, g: ref(l, r, jnp.zeros_like(g).at[0].set(l.shape[0]))
  if variant == "crash":
    def f(l, r, g):
      raise RuntimeError("fake: grouped kernel exploded")
    return f
  raise AssertionError(variant)


def test_wrong_grouped_kernels_fail_and_unregistered_backends_are_unsupported():
  mp = next(p for p in TINY if p.name == "g4.m64.k64.n128")
  rows = []
  kernels = runner.choose_kernels(mp, [runner.AUTO, "xla", "nope"], "best", "bf16",
                                  ops=moe.RAGGED_DOT)
  assert kernels[0] == (runner.AUTO, runner.AUTO_VARIANT, "")
  assert kernels[1] == ("xla", "ragged_dot_general", "")
  assert kernels[2][0] == "nope" and kernels[2][2].startswith(runner.UNSUPPORTED_PREFIX)
  kernels += [("fake", "ignores_groups", ""), ("fake", "crash", "")]
  runner.run_problem(cpu_context(rows), mp, kernels, make_fn=_fake_grouped, ops=moe.RAGGED_DOT)
  by = {(r["backend"], r["variant"]): r for r in rows}
  ref = by[(runner.REF, "lax.ragged_dot")]
  assert ref["status"] == "ok" and ref["group_sizes"] and ref["active_groups"] == 4
  ex = by[(moe.EXAMPLE, moe.EXAMPLE_VARIANT)]
  assert ex["status"] == "skipped" and "GPU only" in ex["note"]
  assert by[("xla", "ragged_dot_general")]["status"] == "ok"
  assert by[(runner.AUTO, runner.AUTO_VARIANT)]["chosen"] == \
      "xla/ragged_dot_general (fallback)"
  assert by[("nope", "-")]["status"] == "unsupported"
  assert "no ragged_dot kernels" in by[("nope", "-")]["note"]
  bad = by[("fake", "ignores_groups")]
  assert bad["status"] == "fail" and "time_ms_median" not in bad
  assert by[("fake", "crash")]["status"] == "error"


# Each kernel backend of ragged_dot; those whose interpreter is slow (conftest's
# SLOW_INTERPRETERS: Mosaic GPU's took 29 s here) only in the `slow` tier.
OTHER_BACKENDS = [pytest.param(b, marks=[pytest.mark.slow] if b in SLOW_INTERPRETERS else [])
                  for b in jaxgemm.backends("ragged_dot") if b != "xla"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS or [pytest.param("none", marks=pytest.mark.skip(
    reason="no ragged_dot backend but xla is registered"))])
def test_each_registered_backend_runs_a_tiny_problem(backend):
  """Each kernel backend of ragged_dot, interpreted, through the benchmark's path on the
  edge-case problem (empty groups, a group of one row): checked against XLA (`ok`, or
  correct but too slow to time, `skipped`), in its forward and both backward forms."""
  rows = []
  for mp in (p for p in TINY if p.layer == "g8.m48.k32.n64.edges"):
    kernels = runner.choose_kernels(mp, [backend], "best", "bf16", ops=moe.RAGGED_DOT)
    runner.run_problem(cpu_context(rows, cpu_call_budget_s=5.0), mp, kernels, ops=moe.RAGGED_DOT)
  ours = [r for r in rows if r["backend"] == backend]
  assert len(ours) == 3
  for r in ours:
    assert r["status"] in ("ok", "skipped", "unsupported"), r
    if r["status"] != "unsupported":
      assert r["error"] <= runner.TOLERANCE["bf16"], r


# ---------------------------------------------------------------- the tiny suite, end to end

@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench-moe")
  rc = cli.main(["--suite", "moe-tiny", "--backends", "auto,xla", "--iters", "3",
                 "--training-steps", "3", "--out", str(out), "--run-name", "cpu-moe"])
  assert rc == 0
  return out / "cpu-moe"


def test_moe_tiny_run_writes_its_rows(moe_run):
  rows = csvio.read_csv(moe_run / "results.csv")
  with open(moe_run / "results.csv", newline="") as f:
    header = next(csv.reader(f))
  assert header == csvio.COLUMNS
  for col in ("groups", "active_groups", "mode", "layer", "group_sizes", "example_time_ms",
              "speedup_vs_example"):
    assert col in header
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert {r["problem"] for r in gemm} == {p.name for p in TINY}
  refs = {r["problem"]: r for r in gemm if r["backend"] == runner.REF}
  for p in TINY:
    r = refs[p.name]
    assert r["status"] == "ok" and r["suite"] == "moe-tiny" and r["mode"] == p.mode
    assert r["variant"] == ("lax.ragged_dot" if p.mode == "fwd" else "lax.ragged_dot_general")
    assert int(r["flops"]) == 2 * p.m * p.k * p.n and int(r["groups"]) == p.groups
    sizes = [int(x) for x in r["group_sizes"].split()]
    assert len(sizes) == p.groups and int(r["active_groups"]) == sum(s > 0 for s in sizes)
    assert int(r["min_bytes"]) == dataclasses.replace(
        p, active_groups=int(r["active_groups"])).min_bytes("bf16")
  # the example: forward problems only, skipped on a CPU
  ex = [r for r in gemm if r["backend"] == moe.EXAMPLE]
  assert {r["problem"] for r in ex} == {p.name for p in TINY if p.mode == "fwd"}
  assert all(r["status"] == "skipped" for r in ex)
  kernels = [r for r in gemm if r["backend"] in ("xla", runner.AUTO)]
  assert len(kernels) == 2 * len(TINY)
  for r in kernels:
    assert r["status"] == "ok", r
    assert float(r["error"]) <= runner.TOLERANCE["bf16"] and float(r["speedup_vs_xla"]) > 0
  steps = {r["backend"]: r for r in rows if r["kind"] == "train_step"}
  assert set(steps) == {runner.REF, "xla", runner.AUTO}
  for b in ("xla", runner.AUTO):
    assert steps[b]["status"] == "ok" and steps[b]["agree"] == "1", steps[b]
    assert steps[b]["suite"] == "moe-tiny" and steps[b]["problem"].startswith("moe.")
  assert len([r for r in rows if r["kind"] == "train_loss"]) == 3 * 3


def test_moe_tiny_report(moe_run):
  report = (moe_run / "REPORT.md").read_text()
  assert "NOT GPU TIMINGS" in report[:600]
  suite = report[report.index("## Suite `moe-tiny` (grouped GEMM)"):]
  assert "| g8.m48.k32.n64.edges | 8 (5) | 48x32x64 | fwd |" in suite
  assert "XLA lax.ragged_dot TFLOP/s" in suite and "jax example" in suite
  assert "| XLA lax.ragged_dot | ok |" in report          # the MoE step's reference
  targets = report[report.index("## Grouped GEMM targets (issue 26)"):]
  assert "MoE training step (moe." in targets
  assert "g8.m16384" not in targets                         # not in a CPU run
  assert "#### Grouped GEMM: suite `moe-tiny`" in (moe_run / "README_TABLES.md").read_text()


def test_moe_training_detects_a_wrong_grouped_gemm():
  """A grouped GEMM 20% off trains to a different loss: a failure row."""
  def gmm_factory(backend, variant):
    if backend == runner.REF:
      return lambda x, w, gs: lax.ragged_dot(x, w, gs)
    return lambda x, w, gs: (lax.ragged_dot(x, w, gs).astype(jnp.float32) * 1.2).astype(x.dtype)

  rows = []
  cfg = dataclasses.replace(T.CPU_MOE_MODEL, steps=2)
  T.run_training(cpu_context(rows), ["xla"], ["ragged_dot_general"], cfg=cfg, mm_factory=gmm_factory,
                 suite="moe-tiny")
  steps = {r["backend"]: r for r in rows if r["kind"] == "train_step"}
  assert steps[runner.REF]["status"] == "ok"
  assert steps["xla"]["status"] == "fail" and steps["xla"]["agree"] == 0


def test_moe_model_is_what_the_issue_asks():
  cfg = T.GPU_MOE_MODEL
  assert (cfg.n_experts, cfg.top_k, cfg.d_model, cfg.d_ff, cfg.tokens, cfg.n_layers) == \
      (8, 2, 1024, 2048, 8192, 2)
  assert cfg.op == "ragged_dot" and T.GPU_MODEL.op == "matmul"
  assert T.moe_model(False) is T.CPU_MOE_MODEL
  params = T.init_params(T.CPU_MOE_MODEL, 0)
  lp = params["layers"][0]
  e, d, ff = T.CPU_MOE_MODEL.n_experts, T.CPU_MOE_MODEL.d_model, T.CPU_MOE_MODEL.d_ff
  assert lp["gate"].shape == lp["up"].shape == (e, d, ff) and lp["down"].shape == (e, ff, d)
  assert lp["router"].shape == (d, e)
  # the dense model's parameters are as before
  assert set(T.init_params(T.CPU_MODEL, 0)["layers"][0]) == {"qkv", "o", "up", "down"}


def test_moe_mlp_routes_each_token_to_its_top_k_experts():
  """moe_mlp against a per-token loop over its top-k experts, in float32."""
  cfg = dataclasses.replace(T.CPU_MOE_MODEL, d_model=8, d_ff=16, n_experts=4)
  rng = np.random.default_rng(3)
  lp = {"router": rng.standard_normal((8, 4)), "gate": rng.standard_normal((4, 8, 16)) / 3,
        "up": rng.standard_normal((4, 8, 16)) / 3, "down": rng.standard_normal((4, 16, 8)) / 4}
  lp = {k: jnp.asarray(v, jnp.float32) for k, v in lp.items()}
  x = jnp.asarray(rng.standard_normal((10, 8)), jnp.float32)
  y = jax.jit(lambda x, lp: T.moe_mlp(x, lp, cfg=cfg, gmm=lax.ragged_dot,
                                      dtype=jnp.float32))(x, lp)
  x, lp = np.asarray(x, np.float64), {k: np.asarray(v, np.float64) for k, v in lp.items()}
  logits = x @ lp["router"]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  want = np.zeros((10, 8))
  for t in range(10):
    top = np.argsort(-probs[t], kind="stable")[:2]
    for e in top:
      g, u = x[t] @ lp["gate"][e], x[t] @ lp["up"][e]
      want[t] += probs[t, e] / probs[t, top].sum() * ((g / (1 + np.exp(-g)) * u) @ lp["down"][e])
  np.testing.assert_allclose(np.asarray(y), want, rtol=2e-4, atol=2e-5)


def test_cli_lists_the_moe_suites():
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(["--list", "--suite", "moe"]) == 0
  text = out.getvalue()
  assert "[ragged_dot]" in text and "moe-tiny" in text
  assert "g128.m8192.k7168.n2048" in text and "g8.m16384.k4096.n14336.wgrad" in text
  assert "then an MoE training step" in text and "  ragged_dot xla: ragged_dot_general" in text


# ---------------------------------------------------------------- a synthetic GPU run's report

# TFLOP/s of each kernel on the issue's problems: (triton, pallas, auto, example, XLA).
_TFLOPS = {
    "g8.m16384.k4096.n14336": (700, 750, 750, 640, 97),
    "g64.m16384.k2048.n1408": (500, 540, 540, 312, 10),
    "g8.m16384.k4096.n14336.dgrad": (600, 700, 700, None, 90),
    "g8.m16384.k4096.n14336.wgrad": (650, 600, 650, None, 80),
    "g64.m16384.k2048.n1408.dgrad": (400, 420, 420, None, 9),
    "g64.m16384.k2048.n1408.wgrad": (300, 350, 350, None, 8),
}
# times (us) of the memory-bound ones
_US = {"g128.m8192.k7168.n2048": (1100, 950, 950, 1193, 41000),
       "g8.m128.k4096.n14336": (250, 240, 240, 220, 238)}
COPY_BW = 4300.0


def _synthetic_moe_csv(path):
  prov = {"platform": "gpu", "device": "NVIDIA H200", "jax": "0.11.2", "git_commit": "abc",
          "date": "2026-11-25", "timer": "cupti", "run_id": "h200-moe-test", "dtype": "bf16"}
  rows = [{**prov, "suite": "copy", "kind": "copy_bw", "backend": "xla", "variant": "negate",
           "status": "ok", "gbps": COPY_BW}]
  for mp in MOE:
    mp = dataclasses.replace(mp, active_groups=mp.groups)
    base = {**prov, **mp.csv_fields("bf16"), "suite": "moe", "kind": "gemm",
            "problem": mp.name, "iters": 20}
    who = (("triton", "grouped"), ("pallas", "persistent"), (runner.AUTO, runner.AUTO_VARIANT),
           (moe.EXAMPLE, moe.EXAMPLE_VARIANT), (runner.REF, "lax.ragged_dot"))
    for i, (b, v) in enumerate(who):
      if mp.name in _TFLOPS:
        t = _TFLOPS[mp.name][i]
        if t is None:
          continue
        ms = mp.flops / (t * 1e12) * 1e3
      else:
        ms = _US[mp.name][i] * 1e-3
        t = mp.flops / (ms * 1e-3) / 1e12
      gbps = mp.min_bytes("bf16") / (ms * 1e-3) / 1e9
      rows.append({**base, "backend": b, "variant": v, "status": "ok", "time_ms_median": ms,
                   "tflops": t, "gbps": gbps, "pct_copy_bw": 100 * gbps / COPY_BW,
                   "memory_bound": int(mp.name in _US), "speedup_vs_xla": 1.0,
                   "chosen": "pallas/persistent (table)" if b == runner.AUTO else ""})
  for b, v, ms in ((runner.REF, "lax.ragged_dot", 30.0), ("triton", T.DEFAULT_VARIANT, 12.0),
                   ("pallas", T.DEFAULT_VARIANT, 8.0), (runner.AUTO, runner.AUTO_VARIANT, 8.5)):
    rows.append({**prov, "suite": "moe", "kind": "train_step", "backend": b, "variant": v,
                 "status": "ok", "time_ms_median": ms, "problem": T.GPU_MOE_MODEL.name,
                 "problem_note": T.GPU_MOE_MODEL.describe(), "loss_first": 9, "loss_last": 5,
                 **({} if b == runner.REF else {"xla_time_ms": 30.0,
                                                 "speedup_vs_xla": 30.0 / ms, "agree": 1})})
  ex = {r["problem"]: r["time_ms_median"] for r in rows if r.get("backend") == moe.EXAMPLE}
  for r in rows:
    if r.get("problem") in ex and r["backend"] not in (moe.EXAMPLE, runner.REF):
      r["speedup_vs_example"] = ex[r["problem"]] / r["time_ms_median"]
  w = csvio.CsvWriter(path)
  for r in rows:
    w(r)
  w.close()


def test_report_renders_the_issue_26_targets(tmp_path):
  csv_path = tmp_path / "results.csv"
  _synthetic_moe_csv(csv_path)
  made = generate(csv_path)
  run = made["run"]
  assert S.entry_of("moe") is RD.ENTRY and "jax_example" not in run.backend_variants
  table = "\n".join(RD.moe_targets_table(run))
  lines = {line.split(" (")[0].strip("| "): line for line in table.splitlines()[2:]}
  assert table.splitlines()[0] == ("| problem | target | XLA | jax example | triton (best "
                                   "variant) | pallas (best variant) | default (auto) |  |")
  g8 = lines["g8.m16384.k4096.n14336"]
  assert ">= 720 TFLOP/s" in g8 and "| 750.0 TFLOP/s |" in g8 and "| 640.0 TFLOP/s |" in g8
  assert g8.endswith("| met |")
  assert lines["g64.m16384.k2048.n1408"].endswith("| **missed** |")    # 540 < 550
  g128 = lines["g128.m8192.k7168.n2048"]
  assert "| 950 us (" in g128 and "| 41,000 us (" in g128 and g128.endswith("| met |")
  decode = lines["g8.m128.k4096.n14336"]
  mp = next(p for p in MOE if p.name == "g8.m128.k4096.n14336")
  rf = mp.min_bytes("bf16") / 240e-6 / 1e9 / COPY_BW
  assert f"| {rf:.2f}x (240 us) |" in decode
  assert decode.endswith("| met |" if rf >= 0.93 else "| **missed** |")
  dgrad = lines["g8.m16384.k4096.n14336.dgrad"]
  assert "| 700.0 TFLOP/s (0.93x fwd) |" in dgrad and dgrad.endswith("| met |")
  wgrad = lines["g8.m16384.k4096.n14336.wgrad"]      # triton's 650 / its own fwd 700
  assert "| 650.0 TFLOP/s (0.93x fwd) |" in wgrad and wgrad.endswith("| met |")
  assert lines["g64.m16384.k2048.n1408.wgrad"].endswith("| **missed** |")   # 0.65x
  train = lines["MoE training step"]
  assert "| 30.00 ms | - |" in train and "| 3.75x (XLA 30.00 / 8.00 ms) |" in train
  assert train.endswith("| met |")
  report = made["report"].read_text()
  assert "## Grouped GEMM targets (issue 26)" in report
  suite = report[report.index("## Suite `moe` (grouped GEMM)"):]
  row = next(line for line in suite.splitlines() if line.startswith("| g8.m16384.k4096.n14336 |"))
  assert "| 8 (8) | 16384x4096x14336 | fwd | 97.0 | 640.0 |" in row
  assert "| 750.0 (1.00x; 1.17x ex.) persistent |" in row      # pallas: vs XLA; vs the example
  mem = next(line for line in suite.splitlines() if line.startswith("| g128.m8192"))
  assert "pallas 950 us" in mem and "example 1,193 us" in mem
  readme = made["readme_tables"].read_text()
  assert "#### Grouped GEMM targets (issue 26)" in readme
  assert "#### Grouped GEMM: suite `moe`" in readme
  # the MoE step is not the dense model's default target (issue 6's "<= XLA's step")
  assert not any("moe." in line for line in MM.defaults_summary(run))
  assert "| XLA lax.ragged_dot | ok |" in report
  head = tables.headline_table(run)
  assert any(line.startswith("| moe |") for line in head)
  assert moe.EXAMPLE in S.PEERS     # the example's rows are a peer's, not jaxgemm kernel rows


def test_time_budget_leaves_the_rest_skipped():
  """Out of time: the problems and the training step are recorded as skipped, unrun;
  the problems' budget keeps time back for the training step."""
  rows = []
  ctx = cpu_context(rows, time_budget_s=1e-9)
  moe.run_moe_suite(ctx, "moe-tiny", TINY[:2], ["xla"], "best", training_cfg=T.CPU_MOE_MODEL)
  assert ctx.time_budget_s == 1e-9                            # restored
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert [r["problem"] for r in gemm] == [p.name for p in TINY[:2]]
  assert all(r["status"] == "skipped" and "time-budget" in r["note"] for r in gemm)
  steps = [r for r in rows if r["kind"] == "train_step"]
  assert len(steps) == 1 and steps[0]["status"] == "skipped"


def test_a_slow_reference_is_not_paired():
  """Where XLA's reference is slower than pair_max_ref_ms, kernels are timed alone and
  compared with its median (saying so)."""
  ops = moe.RaggedDotMeasured()
  ops.pair_max_ref_ms = 0.0
  mp = next(p for p in TINY if p.name == "g4.m8.k128.n256")
  rows = []
  runner.run_problem(cpu_context(rows), mp, [("xla", "ragged_dot_general", "")], ops=ops)
  ref, _, kernel = rows
  assert kernel["status"] == "ok" and "timed alone" in kernel["note"]
  assert kernel["xla_time_ms"] == ref["time_ms_median"]


def test_example_sweep_keeps_the_fastest_correct_config(monkeypatch):
  """On a GPU (faked here: the example's kernel replaced), each config of the sweep is
  checked and timed; the fastest correct one is the row, the others in its note, and
  every kernel row gets its ratio to it."""
  mp = next(p for p in TINY if p.name == "g4.m64.k64.n128")
  configs = moe.example_configs(mp)
  assert len(configs) >= 3

  def fake_example(config):
    if config == configs[0]:
      return lambda l, r, g: lax.ragged_dot(l, r, g) * 1.5       # wrong
    if config == configs[1]:
      raise ValueError("Mosaic GPU kernel exceeds available shared memory")
    return lambda l, r, g: lax.ragged_dot(l, r, g)

  monkeypatch.setattr(moe, "example_fn", fake_example)
  rows = []
  ctx = cpu_context(rows, max_rotate=1)
  ctx.platform = "gpu"
  runner.run_problem(ctx, mp, [("xla", "ragged_dot_general", "")], ops=moe.RAGGED_DOT)
  by = {r["backend"]: r for r in rows}
  ex = by[moe.EXAMPLE]
  assert ex["status"] == "ok" and ex["note"].startswith(f"best of {len(configs)} configs: ")
  assert "fail" in ex["note"] and "shared memory" in ex["note"]
  assert moe.json.loads(ex["config"])["block_m"] in {c[0] for c in configs[2:]}
  kernel = by["xla"]
  assert kernel["example_time_ms"] == ex["time_ms_median"]
  assert kernel["speedup_vs_example"] == pytest.approx(
      ex["time_ms_median"] / kernel["time_ms_median"])
