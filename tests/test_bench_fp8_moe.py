"""CPU tests of the benchmark's fp8-moe suites (FP8 grouped GEMMs, issue 45): bench/fp8_moe.py.

The problem table (the issue's shapes and targets, FLOPs and the bytes of the experts
that have tokens; the weight gradient's (ragged-K) problems), the inputs and the exact
product the rows are checked against, the correctness gate on a wrong kernel, the Triton
kernel (interpreted) on the tiny weight gradient's edge cases, an `fp8-moe-tiny` run end to
end through the CLI (rows, ratios, the FP8 MoE training step, the report), and the
issue-45 targets table from a synthetic GPU CSV. Only the xla backend and the default run
the suite here.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import jaxgemm
from bench_testing import cpu_context
from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import fp8 as F
from jaxgemm.bench import fp8_moe as FM
from jaxgemm.bench import runner
from jaxgemm.bench import suites as S
from jaxgemm.bench import training as T
from jaxgemm.bench.ops import scaled_ragged_dot as SRD
from jaxgemm.bench.report import csvio
from jaxgemm.bench.report.make import generate

GPU = SRD.FP8_MOE_SUITES["fp8-moe"]
TINY = SRD.FP8_MOE_SUITES["fp8-moe-tiny"]



def _tiny(name):
  return next(p for p in TINY if p.name == name)


# ---------------------------------------------------------------- the problem table

def test_fp8_moe_suite_is_the_issues_problems():
  assert S.SUITE_OP["fp8-moe"] == S.SUITE_OP["fp8-moe-tiny"] == "scaled_ragged_dot"
  assert "fp8-moe" not in S.GPU_DEFAULT_SUITES and "fp8-moe-tiny" in S.CPU_DEFAULT_SUITES
  shapes = {(p.groups, p.m, p.k, p.n, p.scaling, p.mode) for p in GPU}
  for g, m, k, n in ((4, 4 * 8192, 7168, 4096), (8, 8 * 4096, 4096, 7168),
                     (128, 16384, 2048, 768), (32, 16384, 7168, 4096), (64, 256, 2048, 1408)):
    assert (g, m, k, n, "block", "fwd") in shapes
  # the k-grouped weight gradient at the contiguous shapes and Qwen3-MoE's
  for g, m, k, n in ((4, 4 * 8192, 7168, 4096), (8, 8 * 4096, 4096, 7168),
                     (128, 16384, 2048, 768)):
    assert (g, m, k, n, "block", "wgrad") in shapes
  assert len(GPU) <= 12 and {p.scaling for p in GPU} == {"block", "tensor"}
  # forward block rows first (a run stopped by its budget has measured the forward
  # targets), then the weight gradient's block rows, then per tensor
  for suite in SRD.FP8_MOE_SUITES.values():
    order = [(p.scaling, p.mode) for p in suite]
    assert order == sorted(order, key=SRD.ORDER.index)
  # every GEMM target names a problem of the suite, with block scales
  names = {p.name: p for p in GPU}
  for problem, kind, _, _ in SRD.FP8_MOE_TARGETS:
    assert kind == "train" or names[problem].scaling == "block"
  wgrad_targets = {p: t for p, kind, t, _ in SRD.FP8_MOE_TARGETS if ".wgrad." in p}
  assert wgrad_targets == {"g4.m32768.k7168.n4096.wgrad.block": 900.0,
                           "g8.m32768.k4096.n7168.wgrad.block": 900.0}
  for suite in SRD.FP8_MOE_SUITES.values():
    assert len({p.name for p in suite}) == len(suite) and any(p.quick for p in suite)
  # the tiny suite's edge cases: empty groups, a one-row group, rows past the groups
  edges, tail = _tiny("g8.m48.k256.n64.edges.block"), _tiny("g4.m40.k200.n72.tail.block")
  assert 0 in edges.group_sizes and 1 in edges.group_sizes
  assert sum(tail.group_sizes) < tail.m
  # the weight gradient's: an empty group, groups not multiples of 128 rows, two sharing a
  # 128-row scale block and one across a block boundary, rows past the groups
  wgrad = _tiny("g5.m320.k192.n80.edges.wgrad.block")
  sizes, ends = wgrad.group_sizes, np.cumsum(wgrad.group_sizes)
  assert wgrad.mode == "wgrad" and 0 in sizes and any(s % 128 for s in sizes)
  assert ends[0] < 128 < ends[2] and ends[2] < 256 < ends[3] < wgrad.m
  assert {p.scaling for p in TINY if p.mode == "wgrad"} == {"block", "tensor"}


def test_flops_and_min_bytes():
  """2 M K N; bytes: fp8 lhs, the fp8 weights and fp32 scales of the experts with tokens,
  the fp32 scales of lhs, the bf16 output."""
  p = SRD.Fp8MoeProblem("s", "p", "p", "block", 8, 48, 256, 200, active_groups=5)
  assert p.flops == 2 * 48 * 256 * 200
  kb, nb = 2, 2                                  # ceil(256 / 128), ceil(200 / 128)
  assert p.min_bytes() == 48 * 256 + 5 * 256 * 200 + 4 * (48 * kb + 5 * kb * nb) + 2 * 48 * 200
  t = dataclasses.replace(p, scaling="tensor", active_groups=None)   # all 8 experts
  assert t.min_bytes() == 48 * 256 + 8 * 256 * 200 + 4 * 2 + 2 * 48 * 200
  f = p.csv_fields("bf16")
  assert (f["groups"], f["active_groups"], f["scaling"], f["fp8_dtypes"]) == (8, 5, "block",
                                                                             "e4m3xe4m3")
  assert f["min_bytes"] == p.min_bytes() and f["xla_ref"] == p.ref_variant
  assert (f["mode"], f["layout"], p.ref_variant) == ("fwd", "NN",
                                                     "lax.ragged_dot[bf16 dequantized]")
  # decode: 64 experts' fp8 weights dominate the bytes
  decode = next(x for x in GPU if x.name == "g64.m256.k2048.n1408.block")
  assert decode.min_bytes() == pytest.approx(64 * 2048 * 1408, rel=0.02)
  assert decode.flops / decode.min_bytes() < 1979e12 / 3.35e12      # under the ridge


def test_wgrad_problem_fields():
  """The weight gradient (ragged-K): x (M, K) and dY (M, N) with 128x1 block scales along
  M, out (G, K, N); 2 M K N FLOPs; bytes: both fp8 operands, their scales, every group's
  bf16 (K, N) block; the canonical problem is scaled_ragged_dot's ragged-K form."""
  p = next(x for x in GPU if x.name == "g4.m32768.k7168.n4096.wgrad.block")
  assert (p.mode, p.layer, p.groups, p.m, p.k, p.n) == ("wgrad", "g4.m32768.k7168.n4096", 4,
                                                        32768, 7168, 4096)
  assert (p.lhs_shape(), p.rhs_shape(), p.out_shape()) == ((32768, 7168), (32768, 4096),
                                                           (4, 7168, 4096))
  assert p.a_block() == p.b_block() == (128, 1) and not p.quick
  assert p.flops == 2 * 32768 * 7168 * 4096
  mb = 32768 // 128
  assert p.min_bytes() == (32768 * 7168 + 32768 * 4096 + 4 * mb * (7168 + 4096)
                           + 2 * 4 * 7168 * 4096)
  assert p.size_label() == "G4 32768x7168x4096 block wgrad"
  assert p.ref_variant == "lax.ragged_dot_general[bf16 dequantized]"
  assert p.peers == ((SRD.XLA_PEER, "dequantize+lax.ragged_dot_general"),
                     (SRD.BF16_PEER, "ragged_dot_general[auto]"))
  assert p.baselines == ("dequantize+lax.ragged_dot_general",)
  f = p.csv_fields("bf16")
  assert (f["mode"], f["layout"], f["xla_ref"], f["min_bytes"]) == ("wgrad", "TN",
                                                                   p.ref_variant, p.min_bytes())
  t = dataclasses.replace(p, scaling="tensor", active_groups=2)   # all G blocks written
  assert t.a_block() is None and t.min_bytes() == (32768 * (7168 + 4096) + 4 * 2
                                                   + 2 * 4 * 7168 * 4096)
  sp = FM.scaled_problem(p)
  assert (sp.ragged_contracting, sp.mode, sp.scale_kind) == (True, "ragged-K", "block")
  assert (sp.lhs_scale_shape, sp.rhs_scale_shape, sp.out_shape) == (
      (1, mb, 7168), (1, mb, 4096), (1, 4, 7168, 4096))
  assert "ragged-K" in sp.describe() and "ragged-K" in sp.cache_fields()
  assert not FM.scaled_problem(_tiny("g4.m64.k256.n128.block")).ragged_contracting
  with pytest.raises(ValueError, match="mode='dgrad' must be one of"):
    dataclasses.replace(p, mode="dgrad")


def _exact64(p, lhs, rhs):
  """float64 of the dequantized operands: fwd (M, N), rows past the groups zero; wgrad
  (G, K, N), an empty group's zeros, rows past the groups in no group."""
  want = np.zeros(p.out_shape())
  start = 0
  for g, size in enumerate(p.group_sizes):
    rows = slice(start, start + size)
    if p.wgrad:
      want[g] = lhs[rows].T @ rhs[rows]
    else:
      want[rows] = lhs[rows] @ rhs[g]
    start += size
  return want


@pytest.mark.parametrize("name", ["g8.m48.k256.n64.edges.block", "g4.m40.k200.n72.tail.tensor",
                                  "g5.m320.k192.n80.edges.wgrad.block"])
def test_inputs_and_the_exact_product(name):
  """The quantized operands' exact product is float64's of the dequantized values (fwd:
  rows past the groups zero; wgrad: an empty group's block zero, rows past the groups in
  no sum); the bf16 forms are those values rounded; the reference (XLA's bf16 grouped
  GEMM) and the peers are within the gate."""
  p = FM.SCALED_RAGGED_DOT.prepare(cpu_context([]), _tiny(name), "bf16")
  l8, r8, gs, sl, sr, l16, r16 = FM.make_inputs(p, 1, 0)
  assert (l8.shape, r8.shape, l8.dtype.name) == (p.lhs_shape(), p.rhs_shape(), "float8_e4m3fn")
  lhs = np.asarray(FM.dequantize_lhs(l8, sl, p), np.float64)
  rhs = np.asarray(FM.dequantize_rhs(r8, sr, p), np.float64)
  want = _exact64(p, lhs, rhs)
  args = (l8, r8, gs, sl, sr, l16, r16)
  exact = np.asarray(FM.exact_fn(p)(*args), np.float64)
  np.testing.assert_allclose(exact, want, rtol=1e-5, atol=1e-4)
  if p.wgrad:
    assert not exact[[g for g, size in enumerate(p.group_sizes) if not size]].any()
    # The rows past the groups are in no sum: a kernel that gave them to the last group
    # (it ends at M) fails the gate.
    tail = slice(sum(p.group_sizes), p.m)
    leaky = want.copy()
    leaky[-1] += lhs[tail].T @ rhs[tail]
    assert np.linalg.norm(leaky - want) / np.linalg.norm(want) > 10 * F.TOLERANCE
  else:
    assert not exact[sum(p.group_sizes):].any()
  with pytest.raises(ValueError, match="group sizes"):     # before prepare drew them
    FM.exact_fn(_tiny("g4.m64.k256.n128.block"))
  np.testing.assert_array_equal(np.asarray(l16, np.float64),
                                np.asarray(jax.numpy.asarray(lhs, "bfloat16"), np.float64))
  for fn in (FM.ref_fn(p), *(FM.peer_fn(p, v) for _, v in p.peers)):
    got = np.asarray(fn(*args), np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= F.TOLERANCE


@pytest.mark.parametrize("name", ["g5.m320.k192.n80.edges.wgrad.block"])
def test_triton_on_the_tiny_weight_gradient(name):
  """The Triton kernel (interpreted) on the tiny weight gradient's edge cases, through the
  suite's kernel program (`ragged_dot_dimension_numbers=RAGGED_K_NUMBERS`): within the gate
  of the exact product, an empty group's block zeros. (The suite's CPU run below takes the
  default, the xla backend here.)"""
  pytest.importorskip("triton")
  assert "triton" in jaxgemm.backends(SRD.OP)
  p = FM.SCALED_RAGGED_DOT.prepare(cpu_context([]), _tiny(name), "bf16")
  args = FM.make_inputs(p, 1, 0)
  want = np.asarray(FM.exact_fn(p)(*args), np.float64)
  got = np.asarray(jax.jit(FM.kernel_fn(p, "triton", "grouped"))(*args), np.float64)
  assert got.shape == p.out_shape()
  assert np.linalg.norm(got - want) / np.linalg.norm(want) <= F.TOLERANCE
  assert not got[[g for g, size in enumerate(p.group_sizes) if not size]].any()


def _wrong_kernels(p, dtype_name, backend, variant):
  if variant == "unscaled":       # the scales left out
    return lambda l8, r8, gs, *_: jax.lax.ragged_dot(l8.astype("bfloat16"),
                                                     r8.astype("bfloat16"), gs)
  raise RuntimeError("a crash")


def test_a_wrong_kernel_fails_and_the_peers_are_checked():
  p = _tiny("g4.m64.k256.n128.block")
  rows = []
  kernels = runner.choose_kernels(p, [runner.AUTO, "xla"], "best", "bf16",
                                  ops=FM.SCALED_RAGGED_DOT)
  assert kernels == [(runner.AUTO, runner.AUTO_VARIANT, ""), ("xla", "ragged_dot", "")]
  runner.run_problem(cpu_context(rows), p, [("fake", "unscaled", ""), ("fake", "crash", "")],
                     make_fn=_wrong_kernels, ops=FM.SCALED_RAGGED_DOT)
  by = {(r["backend"], r["variant"]): r for r in rows}
  ref = by[(runner.REF, p.ref_variant)]
  assert ref["status"] == "ok" and 0 < ref["error"] <= F.TOLERANCE and ref["active_groups"] > 0
  for backend, variant in p.peers:
    r = by[(backend, variant)]
    assert r["status"] == "ok" and r["error"] <= F.TOLERANCE and r["speedup_vs_paired"] > 0
    assert r["xla_ref"] in (p.ref_variant, *p.baselines)
  assert by[("fake", "unscaled")]["status"] == "fail"
  assert "time_ms_median" not in by[("fake", "unscaled")]
  assert by[("fake", "crash")]["status"] == "error"


# ---------------------------------------------------------------- the tiny suite, end to end

@pytest.fixture(scope="module")
def fp8_moe_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench-fp8-moe")
  # The default only (on a CPU it runs the xla backend's kernel, test_a_wrong_kernel_...
  # shows), and one FP8 recipe in the step (a --variants list picks them; the bf16 step runs
  # whatever it names): the tensor recipe's step is the same machinery. Each interpreted
  # FP8 step compiles for 5-8 s here.
  rc = cli.main(["--suite", "fp8-moe-tiny", "--backends", "auto", "--iters", "3",
                 "--variants", "fp8=block", "--training-steps", "2",
                 "--out", str(out), "--run-name", "cpu-fp8-moe"])
  assert rc == 0
  return out / "cpu-fp8-moe"


def test_fp8_moe_tiny_run_writes_its_rows(fp8_moe_run):
  rows = csvio.read_csv(fp8_moe_run / "results.csv")
  gemm = [r for r in rows if r["kind"] == "gemm"]
  assert {r["problem"] for r in gemm} == {p.name for p in TINY}
  refs = {r["problem"]: r for r in gemm if r["backend"] == runner.REF}
  for p in TINY:
    r = refs[p.name]
    assert r["status"] == "ok" and r["suite"] == "fp8-moe-tiny", r
    assert r["variant"] == p.ref_variant and (r["scaling"], r["mode"]) == (p.scaling, p.mode)
    sizes = [int(x) for x in r["group_sizes"].split()]
    assert len(sizes) == p.groups and sum(sizes) <= p.m
    assert p.group_sizes is None or tuple(sizes) == p.group_sizes
    sized = dataclasses.replace(p, active_groups=int(r["active_groups"]))
    assert int(r["active_groups"]) == sum(s > 0 for s in sizes)
    assert int(r["flops"]) == p.flops and int(r["min_bytes"]) == sized.min_bytes()
    assert 0 < float(r["error"]) <= F.TOLERANCE
    peers = [x for x in gemm if x["problem"] == p.name and x["backend"] in (SRD.XLA_PEER,
                                                                              SRD.BF16_PEER)]
    assert {(x["backend"], x["variant"]) for x in peers} == set(p.peers)
    assert all(x["status"] == "ok" and float(x["speedup_vs_paired"]) > 0 for x in peers)
  kernels = [r for r in gemm if r["backend"] == runner.AUTO]
  assert len(kernels) == len(TINY)
  for r in kernels:
    p = _tiny(r["problem"])
    assert r["status"] == "ok", r
    assert float(r["error"]) <= F.TOLERANCE and float(r["speedup_vs_xla"]) > 0
    assert float(r["speedup_vs_bf16"]) > 0 and float(r["bf16_time_ms"]) > 0
    assert r["xla_ref"] in (p.ref_variant, *p.baselines)
  steps = {(r["backend"], r["variant"]): r for r in rows if r["kind"] == "train_step"}
  cfg = T.fp8_moe_model(on_gpu=False)
  assert set(steps) == {(runner.REF, runner.REF_VARIANT), (runner.AUTO, runner.AUTO_VARIANT),
                        (runner.AUTO, "fp8=block")}
  for (b, v), r in steps.items():
    assert r["status"] == "ok" and r["problem"] == cfg.name, r
    if b != runner.REF:
      assert r["agree"] == "1"
      # the bf16 rows keep bf16's bounds, the FP8 rows FP8's
      assert float(r["tolerance"]) == (T.FP8_TOLERANCES["trajectory"] if v.startswith("fp8=")
                                       else T.TRAJECTORY_TOL["bf16"])
  assert cfg.name.startswith("fp8.moe.") and cfg.moe and cfg.fp8


def test_fp8_moe_tiny_report(fp8_moe_run):
  report = (fp8_moe_run / "REPORT.md").read_text()
  assert "NOT GPU TIMINGS" in report[:600]
  suite = report[report.index("## Suite `fp8-moe-tiny` (FP8 grouped GEMMs)"):]
  header = next(x for x in suite.splitlines() if x.startswith("| problem |"))
  assert ("| XLA lax.ragged_dot bf16 (dequantized beforehand) | dequantize + XLA "
          "lax.ragged_dot | jaxgemm bf16 ragged_dot (auto) | default (auto), chose | memory "
          "bound") in header
  line = next(x for x in suite.splitlines() if x.startswith("| g8.m48.k256.n64.edges.block |"))
  assert "| block | 8 (5) | 48x256x64 |" in line and " bf16) xla/ragged_dot" in line
  wgrad = next(x for x in suite.splitlines()
               if x.startswith("| g5.m320.k192.n80.edges.wgrad.block |"))
  assert "| block | 5 (3) | 320x192x80 |" in wgrad and " bf16) xla/ragged_dot" in wgrad
  targets = report[report.index("## FP8 grouped GEMM targets (issue 45)"):]
  targets = targets[:targets.index("\n## ", 5)]
  assert "g4.m32768" not in targets                       # GPU problems: not in a CPU run
  step = next(x for x in targets.splitlines() if "fp8=block" in x)
  assert step.startswith("| FP8 MoE training step (fp8.moe.")
  assert step.endswith("| n/a (not a GPU run) |")
  assert "| XLA lax.ragged_dot (bf16) | ok |" in report
  assert "#### FP8 grouped GEMMs: suite `fp8-moe-tiny`" in (
      fp8_moe_run / "README_TABLES.md").read_text()


# ---------------------------------------------------------------- the targets, from a GPU run

COPY_BW = 3000.0


def _synthetic_gpu_csv(path):
  """A GPU run's rows of four targets' problems (the G=8 contiguous ones, fwd and wgrad,
  left out) and the FP8 MoE step: triton's and the default's TFLOP/s or time."""
  prov = {"platform": "gpu", "device": "NVIDIA H100", "jax": "0.11.2", "git_commit": "abc",
          "date": "2026-11-28", "timer": "cupti", "run_id": "h100-fp8-moe-test", "dtype": "bf16"}
  rows = [{**prov, "suite": "copy", "kind": "copy_bw", "backend": "xla", "variant": "negate",
           "status": "ok", "gbps": COPY_BW}]
  # problem: (XLA's reference, triton, auto) TFLOP/s
  measured = {"g4.m32768.k7168.n4096.block": (400.0, 1250.0, 1100.0),
              "g128.m16384.k2048.n768.block": (5.0, 550.0, 500.0),
              "g64.m256.k2048.n1408.block": (3.0, 5.0, 4.0),
              "g4.m32768.k7168.n4096.wgrad.block": (300.0, 950.0, 880.0)}
  for p in GPU:
    if p.name not in measured:
      continue
    p = dataclasses.replace(p, active_groups=p.groups)
    base = {**prov, **p.csv_fields("bf16"), "suite": "fp8-moe", "kind": "gemm",
            "problem": p.name, "iters": 20}
    for (b, v), t in zip(((runner.REF, p.ref_variant), ("triton", "grouped"),
                          (runner.AUTO, runner.AUTO_VARIANT)), measured[p.name]):
      ms = p.flops / (t * 1e12) * 1e3
      gbps = p.min_bytes() / (ms * 1e-3) / 1e9
      rows.append({**base, "backend": b, "variant": v, "status": "ok", "time_ms_median": ms,
                   "tflops": t, "gbps": gbps, "pct_copy_bw": 100 * gbps / COPY_BW,
                   "memory_bound": int(p.m == 256), "speedup_vs_xla": t / measured[p.name][0],
                   "chosen": "triton/grouped (table)" if b == runner.AUTO else ""})
  model = T.fp8_moe_model(on_gpu=True).name
  for b, v, ms in ((runner.REF, runner.REF_VARIANT, 30.0), ("triton", "(default)", 10.0),
                   ("triton", "fp8=block", 6.0), ("triton", "fp8=tensor", 8.0)):
    rows.append({**prov, "suite": "fp8-moe", "kind": "train_step", "backend": b, "variant": v,
                 "status": "ok", "time_ms_median": ms, "problem": model,
                 **({} if b == runner.REF else {"xla_time_ms": 30.0,
                                                 "speedup_vs_xla": 30.0 / ms, "agree": 1})})
  w = csvio.CsvWriter(path)
  for r in rows:
    w(r)
  w.close()


def test_report_renders_the_issue_45_targets(tmp_path):
  csv_path = tmp_path / "results.csv"
  _synthetic_gpu_csv(csv_path)
  made = generate(csv_path)
  assert S.entry_of("fp8-moe") is SRD.ENTRY
  table = SRD.fp8_moe_targets_table(made["run"])
  assert table[0] == "| problem | target | triton (best variant) | default (auto) |  |"
  lines = {line.split("|")[1].strip().split(" (")[0]: line for line in table[2:]}
  g4 = lines["g4.m32768.k7168.n4096.block"]
  assert "| 1,250.0 TFLOP/s | 1,100.0 TFLOP/s |" in g4 and g4.endswith("| met |")
  assert lines["g8.m32768.k4096.n7168.block"].endswith("| not measured |")
  wgrad = lines["g4.m32768.k7168.n4096.wgrad.block"]     # triton's 950 >= 900
  assert ">= 900 TFLOP/s (k-grouped weight gradient) | 950.0 TFLOP/s | 880.0 TFLOP/s |" in wgrad
  assert wgrad.endswith("| met |")
  assert lines["g8.m32768.k4096.n7168.wgrad.block"].endswith("| not measured |")
  assert lines["g128.m16384.k2048.n768.block"].endswith("| **missed** |")    # 550 < 600
  decode = lines["g64.m256.k2048.n1408.block"]
  p = dataclasses.replace(next(x for x in GPU if x.name == "g64.m256.k2048.n1408.block"),
                          active_groups=64)
  rf = p.min_bytes() / (p.flops / 5e12) / 1e9 / COPY_BW          # triton's 5 TFLOP/s
  assert f"| {rf:.2f}x (" in decode
  assert decode.endswith("| met |" if rf >= 0.90 else "| **missed** |")
  steps = [line for line in table[2:] if line.startswith("| FP8 MoE training step (")]
  block = next(x for x in steps if "fp8=block" in x)    # 10 ms bf16 / 6 ms FP8
  assert "| 1.67x (" in block and block.endswith("| met |")
  tensor = next(x for x in steps if "fp8=tensor" in x)  # 10 / 8
  assert "| 1.25x (" in tensor and tensor.endswith("| **missed** |")
  report = made["report"].read_text()
  assert "## FP8 grouped GEMM targets (issue 45)" in report
  assert "## Suite `fp8-moe` (FP8 grouped GEMMs)" in report


def test_cli_lists_the_fp8_moe_suites(capsys):
  assert cli.main(["--list", "--suite", "fp8-moe"]) == 0
  text = capsys.readouterr().out
  assert "fp8-moe-tiny" in text and "g128.m16384.k2048.n768.block" in text
  for name in ("g4.m32768.k7168.n4096.wgrad.block", "g8.m32768.k4096.n7168.wgrad.block",
               "g128.m16384.k2048.n768.wgrad.block"):
    assert name in text
  assert "then an FP8 MoE training step" in text
