"""ragged_dot's entry: the moe suites (grouped GEMMs, issue 26, then an MoE training
step), their table and the issue's targets.

The problems run in bench/moe.py (`moe.run_suite`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..entry import BenchOp, Section, Suite
from ..problems import dtype_of
from ..report.csvio import AUTO, REF, num
from ..report.markdown import (backends_in, base_suite, cell_t, fmt_t, fmt_x, pick, ref_step,
                               shape, step_vs_xla, table, us, verdict)

OP = "ragged_dot"
# jax's example grouped GEMM kernel (bench/moe.py measures it on forward problems): a peer
# of the kernels, not one of jaxgemm's backends.
EXAMPLE = "jax_example"
EXAMPLE_VARIANT = "ragged_dot_mgpu"

# Issue 26: `ragged_dot` (op "ragged_dot"), a mixture-of-experts layer's grouped GEMM.
# Each problem is one layer's GEMM over G experts: M tokens (rows of lhs, sorted by
# expert) of width K times each expert's (K, N) weights, in one of three calls:
#
#   fwd    y = ragged_dot(x, W)               x (M, K), W (G, K, N) -> (M, N)     "NN"
#   dgrad  dx = dy @ W[g]^T per group         dy (M, N), W (G, K, N) -> (M, K)    "NT"
#          (ragged_dot_general, rhs contracted on its last dimension)
#   wgrad  dW[g] = x[rows g]^T @ dy[rows g]   x (M, K), dy (M, N) -> (G, K, N)    "TN"
#          (ragged_dot_general, the ragged dimension M contracted)
#
# m, k, n are the layer's (tokens, width in, width out) in all three, so the FLOPs
# are 2 M K N in each, however the tokens split. The group sizes are a Dirichlet(2)
# split of the M tokens (jaxgemm.ops.ragged_dot.primitive.example_group_sizes, a
# fixed seed), or fixed ones (`group_sizes`, the tiny suite's edge cases).


@dataclasses.dataclass(frozen=True)
class MoeProblem:
  suite: str
  name: str
  layer: str              # the layer's name: its fwd, dgrad and wgrad share it
  groups: int
  m: int
  k: int
  n: int
  mode: str = "fwd"       # "fwd", "dgrad" or "wgrad" (above)
  group_sizes: tuple[int, ...] | None = None   # fixed sizes; None: a Dirichlet(2) split
  active_groups: int | None = None   # experts with tokens (the runner fills it in)
  dtype: str | None = None
  default: bool = False
  quick: bool = False
  ladder: bool = False    # every variant of every backend runs it
  note: str = ""

  op = "ragged_dot"
  batch = 1
  trans_a = False

  MODES = ("fwd", "dgrad", "wgrad")

  @property
  def trans_b(self) -> bool:
    return self.mode == "dgrad"

  @property
  def layout(self) -> str:
    return {"fwd": "NN", "dgrad": "NT", "wgrad": "TN"}[self.mode]

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n

  def lhs_shape(self) -> tuple[int, int]:
    return (self.m, self.n) if self.mode == "dgrad" else (self.m, self.k)

  def rhs_shape(self) -> tuple[int, ...]:
    return (self.m, self.n) if self.mode == "wgrad" else (self.groups, self.k, self.n)

  def out_shape(self) -> tuple[int, ...]:
    return {"fwd": (self.m, self.n), "dgrad": (self.m, self.k),
            "wgrad": (self.groups, self.k, self.n)}[self.mode]

  def dimension_numbers(self):
    """lax.RaggedDotDimensionNumbers of the call (lax.ragged_dot's own for fwd)."""
    from jax import lax  # noqa: PLC0415
    if self.mode == "wgrad":
      return lax.RaggedDotDimensionNumbers(
          dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
          rhs_group_dimensions=[])
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [2 if self.mode == "dgrad" else 1]), ([], [])),
        lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])

  def min_bytes(self, dtype_name: str) -> int:
    """lhs and rhs read once, the output written once; of the weights (fwd, dgrad) only
    those of the experts that have tokens (`active_groups`, else all G)."""
    item = np.dtype(dtype_of(dtype_name)).itemsize
    g = self.groups if self.active_groups is None else self.active_groups
    lhs, out = math.prod(self.lhs_shape()), math.prod(self.out_shape())
    rhs = self.m * self.n if self.mode == "wgrad" else g * self.k * self.n
    return item * (lhs + rhs + out)

  def size_label(self) -> str:
    return f"G{self.groups} {self.m}x{self.k}x{self.n} {self.mode}"

  def csv_fields(self, dtype_name: str) -> dict:
    """The problem's columns of a CSV row (`runner.base_row`)."""
    return {
        "batch": 1, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": 0, "flops": self.flops, "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note, "groups": self.groups, "mode": self.mode,
        "layer": self.layer, "active_groups": "" if self.active_groups is None
        else self.active_groups,
        "group_sizes": "" if self.group_sizes is None else " ".join(map(str, self.group_sizes)),
    }


# (layer, G, M, K, N, with backward GEMMs, default, quick, ladder, note)
MOE_LAYERS = (
    ("g8.m16384.k4096.n14336", 8, 16384, 4096, 14336, True, True, False, True,
     "8 experts of Mixtral-8x7B's MLP width, 16384 tokens"),
    ("g64.m16384.k2048.n1408", 64, 16384, 2048, 1408, True, True, True, True,
     "64 fine-grained experts (DeepSeekMoE-16B's widths), 16384 tokens"),
    ("g128.m8192.k7168.n2048", 128, 8192, 7168, 2048, False, True, False, False,
     "128 experts of DeepSeek-V3's widths: 3.76 GB of weights, memory bound"),
    ("g8.m128.k4096.n14336", 8, 128, 4096, 14336, False, True, True, False,
     "decode: 128 tokens over 0.94 GB of weights, memory bound"),
)
# Issue 45: where MoE models have gone, many small experts (the `moe-fine` suite). XLA's
# lax.ragged_dot runs 1-10 TFLOP/s on them (issue 44's table, H100); the floors are the
# issue's: G=128 compute bound (aim for dense rates), G=256 N=256 and decode weight bound.
MOE_FINE_LAYERS = (
    ("g128.m16384.k2048.n768", 128, 16384, 2048, 768, True, True, True, True,
     "Qwen3-30B-A3B: 128 experts of 2048x768, 16384 tokens"),
    ("g32.m8192.k7168.n2048", 32, 8192, 7168, 2048, True, True, False, False,
     "DeepSeek-V3 on 8-way expert parallelism: 32 local experts of 7168x2048"),
    ("g256.m8192.k7168.n2048", 256, 8192, 7168, 2048, False, True, False, False,
     "DeepSeek-V3's 256 experts (no expert parallelism): 7.5 GB of weights"),
    ("g256.m8192.k7168.n256", 256, 8192, 7168, 256, False, True, False, False,
     "256 experts of N=256: 940 MB of weights, 0.28 ms at 3.35 TB/s"),
    ("g64.m256.k2048.n1408", 64, 256, 2048, 1408, False, True, True, False,
     "decode: 256 tokens over 64 experts' 370 MB of weights"),
)
# The CPU's analogues: small enough for the interpreters, with the edge cases
# (empty groups, a group of one row, rows past sum(group_sizes), which are zeros).
MOE_TINY_LAYERS = (
    ("g4.m64.k64.n128", 4, 64, 64, 128, True, True, True, True, None, "Dirichlet(2) split"),
    ("g8.m48.k32.n64.edges", 8, 48, 32, 64, True, True, False, False,
     (10, 0, 1, 20, 0, 9, 8, 0), "empty groups and a group of one row"),
    ("g4.m40.k96.n80.tail", 4, 40, 96, 80, False, True, False, False, (5, 10, 0, 15),
     "rows past sum(group_sizes) (zeros)"),
    ("g4.m8.k128.n256", 4, 8, 128, 256, False, True, True, False, None, "decode"),
)


def _moe(suite, layers, tiny=False):
  """Every layer's forward GEMM first, then the backward ones: a run stopped by its time
  budget has measured every forward problem."""
  out = []
  for modes in (("fwd",), ("dgrad", "wgrad")):
    for row in layers:
      out += _moe_layer(suite, row, tiny, modes)
  return out


def _moe_layer(suite, row, tiny, modes):
  out = []
  if tiny:
    layer, g, m, k, n, backward, default, quick, ladder, sizes, note = row
  else:
    (layer, g, m, k, n, backward, default, quick, ladder, note), sizes = row, None
  for mode in modes:
    if mode == "fwd" or backward:
      out.append(MoeProblem(suite, layer if mode == "fwd" else f"{layer}.{mode}", layer, g,
                            m, k, n, mode=mode, group_sizes=sizes, default=default,
                            quick=quick and mode == "fwd", ladder=ladder and mode == "fwd",
                            note=note if mode == "fwd" else f"{note}; {mode}"))
  return out


MOE_SUITES: dict[str, list[MoeProblem]] = {
    "moe": _moe("moe", MOE_LAYERS),
    "moe-tiny": _moe("moe-tiny", MOE_TINY_LAYERS, tiny=True),
    "moe-fine": _moe("moe-fine", MOE_FINE_LAYERS),
}

# ---------------------------------------------------------------- the report

MOE_TARGETS_NOTE = (
    "Each target against XLA's `lax.ragged_dot(_general)`, jax's example kernel "
    "(`ragged_dot_mgpu`, best of a config sweep, forward only), each backend's fastest "
    "correct variant and the default (`backend='auto'`); `met` where a jaxgemm kernel (not "
    "the `xla` backend) reaches it. TFLOP/s count 2 M K N; the roofline is the minimum bytes "
    "(lhs, the weights of the experts that have tokens, the output) over the time, against "
    "the run's measured copy bandwidth; a backward GEMM is compared with the same backend's "
    "forward. The training step's cells: its speedup (XLA's step timed beside it / its own).")
MOE_TABLE_NOTE = (
    "`G (with tokens)`: experts, and those with tokens (a Dirichlet(2) split of M, fixed "
    "seed). `call`: fwd `ragged_dot` (M,K)x(G,K,N); dgrad (M,N)x(G,K,N)^T -> (M,K); wgrad "
    "(M,K)^T x (M,N) -> (G,K,N). Cells: TFLOP/s (vs XLA's `lax.ragged_dot(_general)`; vs jax's "
    "example kernel, forward only).")


def _roofline(r: dict) -> float | None:
  pct = num(r.get("pct_copy_bw"))
  return None if pct is None else pct / 100


def moe_table(run, suite: str) -> list[str]:
  """A moe suite's problems: TFLOP/s of XLA's lax.ragged_dot, jax's example kernel, the
  default and each backend (best variant) with its ratios, and the bandwidth roofline."""
  bs = backends_in(run, [suite])
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    ex = pick(run, suite, name, EXAMPLE)
    exr = run.row(suite, name, EXAMPLE)
    row = [name, f"{p.get('groups')} ({p.get('active_groups') or '?'})", shape(p),
           p.get("mode", ""), cell_t(p, False) if p["status"] == "ok" else p["status"],
           fmt_t(num(ex["tflops"])) if ex else (exr["status"] if exr else "-")]

    def cell(r):
      if r is None:
        return "-"
      text = cell_t(r)
      sx = num(r.get("speedup_vs_example"))
      if r["status"] == "ok" and sx:
        text = text[:-1] + f"; {fmt_x(sx)} ex.)"
      return text

    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else f"{cell(a)} {a.get('chosen') or ''}".strip())
    for b in bs:
      best = pick(run, suite, name, b)
      if best is None:
        st = sorted({r["status"] for r in run.kernel_rows(suite, name) if r["backend"] == b})
        row.append("/".join(st) or "-")
      else:
        row.append(f"{cell(best)} {best['variant']}")
    if p.get("memory_bound") == "1":
      parts = []
      for who, r in (("XLA", p if p["status"] == "ok" else None), ("example", ex),
                     *((b, pick(run, suite, name, b)) for b in bs)):
        if r is not None and _roofline(r) is not None:
          parts.append(f"{who} {us(r)} {_roofline(r):.2f}x")
      row.append("; ".join(parts))
    else:
      row.append("")
    rows.append(row)
  header = ["problem", "G (with tokens)", "MxKxN", "call", "XLA lax.ragged_dot TFLOP/s",
            "jax example TFLOP/s (best config)",
            *(["default (auto) (vs XLA; vs ex.), chose"] if run.has_auto else []),
            *[f"{b} best (vs XLA; vs ex.) variant" for b in bs],
            "memory bound: time, fraction of the bandwidth roofline"]
  return table(header, rows)


# Issue 26's targets (H200, bf16): (problem of the moe suite, what is measured,
# threshold, as the issue says it). Kinds: "tflops" (at least), "time_us" (at most),
# "roofline" (min bytes / time / copy bandwidth, at least), "bwd" (a backward GEMM's
# TFLOP/s over its forward's on the same backend, at least), "train" (the MoE
# training step's speedup over XLA's step, at least).
MOE_TARGETS = (
    ("g8.m16384.k4096.n14336", "tflops", 720.0, ">= 720 TFLOP/s (0.9x of dense)"),
    ("g64.m16384.k2048.n1408", "tflops", 550.0, ">= 550 TFLOP/s"),
    ("g128.m8192.k7168.n2048", "time_us", 1000.0,
     "<= 1000 us (>= 0.87x of the bandwidth roofline)"),
    ("g8.m128.k4096.n14336", "roofline", 0.93,
     ">= 0.93x of the bandwidth roofline (experts with tokens)"),
    ("g8.m16384.k4096.n14336.dgrad", "bwd", 0.85, ">= 0.85x of its forward's TFLOP/s"),
    ("g8.m16384.k4096.n14336.wgrad", "bwd", 0.85, ">= 0.85x of its forward's TFLOP/s"),
    ("g64.m16384.k2048.n1408.dgrad", "bwd", 0.85, ">= 0.85x of its forward's TFLOP/s"),
    ("g64.m16384.k2048.n1408.wgrad", "bwd", 0.85, ">= 0.85x of its forward's TFLOP/s"),
    ("MoE training step", "train", 3.0, ">= 3x XLA's step"),
)


def _moe_value(run, kind: str, suite: str, problem: str, r: dict | None, backend: str):
  """(value compared with the target, cell text) of row `r`, or (None, text)."""
  if r is None:
    return None, "-"
  if r["status"] != "ok":
    return None, r["status"]
  t, ms = num(r.get("tflops")), num(r["time_ms_median"])
  if kind == "tflops":
    return t, f"{fmt_t(t)} TFLOP/s"
  if kind == "time_us":
    rf = _roofline(r)
    return ms * 1e3, us(r) + (f" ({rf:.2f}x roofline)" if rf is not None else "")
  if kind == "roofline":
    rf = _roofline(r)
    return rf, "-" if rf is None else f"{rf:.2f}x ({us(r)})"
  if kind == "bwd":
    fwd_name = problem.rsplit(".", 1)[0]
    fwd = (next((p for p in run.problems(suite) if p["problem"] == fwd_name), None)
           if backend == REF else pick(run, suite, fwd_name, backend))
    ft = num(fwd["tflops"]) if fwd and fwd["status"] == "ok" else None
    if not ft:
      return None, f"{fmt_t(t)} TFLOP/s (no forward)"
    return t / ft, f"{fmt_t(t)} TFLOP/s ({t / ft:.2f}x fwd)"
  raise ValueError(kind)


def moe_targets_table(run) -> list[str]:
  """Issue 26's targets against this run: XLA, jax's example, each backend's best variant
  and the default; `met` where any of jaxgemm's kernels (a named backend other than xla,
  or the default) reaches the target."""
  suites = [s for s in run.suites if base_suite(s) in MOE_SUITES
            and all(p["dtype"] == "bf16" for p in run.problems(s))]
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["suite"] in MOE_SUITES]
  has_auto = any(run.auto(s, p["problem"]) for s in suites for p in run.problems(s))
  bs = backends_in(run, suites) + ([AUTO] if has_auto else [])
  ours = [b for b in bs if b != "xla"]
  rows = []
  for problem, kind, target, text in MOE_TARGETS:
    cells, values = [], []
    if kind == "train":
      if not steps:
        continue
      model = steps[0]["problem"]
      ref = ref_step(steps, model)
      cells.append(f"{num(ref['time_ms_median']):.2f} ms" if ref and ref["status"] == "ok"
                   else (ref["status"] if ref else "-"))
      cells.append("-")
      for b in bs:
        rr = [r for r in steps if r["backend"] == b and r["problem"] == model]
        ok = [r for r in rr if r["status"] == "ok" and num(r.get("speedup_vs_xla"))]
        if not ok:
          cells.append("/".join(sorted({r["status"] for r in rr})) or "-")
          continue
        r = max(ok, key=lambda r: num(r["speedup_vs_xla"]))
        s = num(r["speedup_vs_xla"])
        cells.append(step_vs_xla(r, 2))
        if b in ours:
          values.append(s)
      label = f"MoE training step ({model})"
    else:
      suite = next((s for s in suites if any(p["problem"] == problem
                                             for p in run.problems(s))), None)
      if suite is None:
        continue
      ref = next(p for p in run.problems(suite) if p["problem"] == problem)
      cells.append(_moe_value(run, kind, suite, problem, ref, REF)[1])
      cells.append("-" if kind == "bwd" else
                   _moe_value(run, kind, suite, problem, pick(run, suite, problem, EXAMPLE),
                              EXAMPLE)[1])
      for b in bs:
        v, c = _moe_value(run, kind, suite, problem, pick(run, suite, problem, b), b)
        cells.append(c)
        if v is not None and b in ours:
          values.append(v)
      label = f"{problem} (G={ref.get('groups')}, {shape(ref)}, {ref.get('mode')})"
    if not values:
      outcome = "not measured"
    else:
      best = min(values) if kind == "time_us" else max(values)
      outcome = verdict(run, best <= target if kind == "time_us" else best >= target)
    rows.append([label, text, *cells, outcome])
  if not rows:
    return []
  return table(["problem", "target", "XLA", "jax example", *[
      "default (auto)" if b == AUTO else f"{b} (best variant)" for b in bs], ""], rows)


def _suite_table(run, suite: str) -> list[str]:
  return [MOE_TABLE_NOTE, "", *moe_table(run, suite)]


def _targets(run) -> list[str]:
  rows = moe_targets_table(run)
  return [MOE_TARGETS_NOTE, "", *rows] if rows else []


# ---------------------------------------------------------------- the entry

ENTRY = BenchOp(
    name="ragged_dot", order=20, ops=(OP,), family="moe",
    suites=(
        Suite("moe", "grouped GEMM (ragged_dot, issue 26): 4 MoE layers (2 memory bound) and the "
              "backward GEMMs of 2, vs lax.ragged_dot and jax's example kernel; an MoE "
              "training step", MOE_SUITES["moe"], runner="moe",
              list_note="then an MoE training step (bench/training.py)"),
        Suite("moe-fine", "fine-grained MoE (issue 45): Qwen3-MoE's 128 experts, DeepSeek-V3's "
              "256 and its EP8 share of 32, weight-bound N=256, decode; backward GEMMs of 2",
              MOE_SUITES["moe-fine"], runner="moe",
              list_note="then an MoE training step (bench/training.py)"),
        Suite("moe-tiny", "the moe suite's CPU analogue (interpreters; empty groups, a one-row "
              "group)", MOE_SUITES["moe-tiny"], runner="moe", cpu_default=True,
              list_note="then an MoE training step (bench/training.py)"),
    ),
    # A lent GPU runs one command for at most 10 minutes: no problem starts after this
    # less `training.TRAINING_RESERVE_S` seconds, and no training run (XLA's, or a
    # backend's: about 30-60 s each with its compile) after it.
    gpu_time_budget_s=450.0,
    peers=(EXAMPLE,),
    suite_table=_suite_table, suite_title="Suite `{suite}` (grouped GEMM)",
    readme_suite_title="Grouped GEMM: suite `{suite}`",
    targets=(Section("Grouped GEMM targets (issue 26)", _targets,
                     readme_title="Grouped GEMM targets (issue 26)"),),
    train_ref_label="XLA lax.ragged_dot",
)
