"""matmul's entry: the GEMM suites and the training suite, their tables, the default's
target (issue 6) and the kernel targets of the Triton and Pallas issues.

The problems are bench/problems.py's (`problems.SUITES`); the GEMM suites run in
bench/runner.py, the training suite in bench/training.py.
"""

from __future__ import annotations

from collections import defaultdict

from .. import problems as P
from ..entry import BenchOp, Section, Suite
from ..report.csvio import AUTO, num
from ..report.markdown import (DEFAULT_FLOOR, NOT_APPLICABLE, auto_stats, base_suite, cell_t,
                               fmt_t, fmt_x, shape, table, verdict)

TRAINING = "training"   # the training suite: a model's step, not a table of GEMMs

# Issue 6's target for the default: geomean over these suites at least
# DEFAULT_TARGET x XLA, no problem below DEFAULT_FLOOR x, and a training step no
# slower than XLA's.
TARGET_SUITES = ("square", "llm")
DEFAULT_TARGET = 1.00

HELP = {
    "square": "M=K=N from 256 to 16384 (powers of two and a few non-powers)",
    "llm": "Llama-3 8B/70B projections (QKV, O, gate_up, down) at 1..16384 tokens",
    "skinny": "M in 1..256 against large K=N (decode; memory bound)",
    "unaligned": "sizes not multiples of 8 or 16 (e.g. 4095x4097x4093)",
    "backward": "a layer's forward GEMM and both backward GEMMs (NN, NT, TN layouts)",
    "random": f"{P.RANDOM_COUNT} random problems (seed {P.RANDOM_SEED}): M, N, K log-uniform "
              "in [1, 16384], bf16/fp16/fp32, random transposes (the heuristics' development "
              "set)",
    "random-holdout": f"{P.RANDOM_HOLDOUT_COUNT} more drawn the same way (seed "
                      f"{P.RANDOM_HOLDOUT_SEED}): problems the heuristics were not developed on",
    "tiny": "small shapes for a machine without a GPU (XLA:CPU, interpreters)",
    TRAINING: "a jit-compiled transformer training step on jaxgemm vs on XLA's dot",
}
GPU_DEFAULT = ("square", "llm", "skinny", "unaligned", "backward")
OWN_SUITES = (*P.SUITES, TRAINING)


# ---------------------------------------------------------------- the default (issue 6)

def _default_suites(run) -> tuple[list[str], bool]:
  """(suites the defaults section covers, whether they are the target's).

  The target's suites (square, llm) where the run has them, else matmul's suites the
  default ran on (a CPU run's tiny), else every suite it ran on (a run of another op's
  suites only), so that a run always shows them.
  """
  target = [s for s in run.suites if base_suite(s) in TARGET_SUITES]
  if target:
    return target, True
  ran = [s for s in run.suites if any(r["backend"] == AUTO for r in run.gemm
                                      if r["suite"] == s)]
  return [s for s in ran if base_suite(s) in OWN_SUITES] or ran, False


def _met(run, ok: bool) -> str:
  """The defaults' verdict; off a GPU the target (a GPU number) does not apply."""
  if not run.on_gpu:
    return f"target {NOT_APPLICABLE}"
  return "target met" if ok else "target NOT met"


def defaults_summary(run) -> list[str]:
  """jaxgemm's default (backend='auto') against XLA: the GEMM and training numbers."""
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["backend"] == AUTO
           and r.get("suite", "") in OWN_SUITES]
  if not steps and not run.has_auto:
    return []
  suites, is_target = _default_suites(run)
  out = []
  by_dtype = defaultdict(list)   # merged runs: one line per dtype, never a mixed geomean
  for s in suites:
    by_dtype[run.problems(s)[0]["dtype"] if run.problems(s) else ""].append(s)
  for dtype, group in by_dtype.items():
    d = auto_stats(run, group)
    label = f"{' + '.join(base_suite(s) for s in group)} ({dtype})"
    if not d["n"]:
      out.append(f"- {label}: no measured backend='auto' rows.")
      continue
    text = (f"- {label}: geomean {fmt_x(d['geomean'])} over {d['n']} problems, min "
            f"{fmt_x(d['min'])} ({d['min_problem']}), {d['below']} below "
            f"{DEFAULT_FLOOR:.2f}x")
    if d["bad"]:
      text += f", {d['bad']} failed/errored"
    if is_target:
      text += ": " + _met(run, d["geomean"] >= DEFAULT_TARGET and d["min"] >= DEFAULT_FLOOR
                          and not d["bad"])
    out.append(text + ".")
  for r in steps:
    s = num(r.get("speedup_vs_xla"))
    if r["status"] != "ok" or not s:
      bad = r["status"] in ("fail", "error")   # a skipped step is unmeasured, not a miss
      out.append(f"- training step ({r['problem']}): {r['status']}"
                 + (f" ({r['note']})" if r.get("note") else "")
                 + (f": {_met(run, False)}." if bad else "."))
      continue
    out.append(f"- training step ({r['problem']}): {num(r['time_ms_median']):.3f} ms against "
               f"XLA's {num(r['xla_time_ms']):.3f} ms timed beside it ({fmt_x(s)}): "
               f"{_met(run, s >= 1.0)}.")
  return out


def defaults_section(run) -> list[str]:
  """The '## Defaults' section: summary, then the default on each problem."""
  summary = defaults_summary(run)
  if not summary:
    return ["No backend='auto' rows in this run (run with `--backends auto,...`)."]
  suites, is_target = _default_suites(run)
  out = ["`jaxgemm.matmul(a, b)` / `jaxgemm.dot_general(...)` as a user calls them, with no "
         "backend, variant or config: on each problem the kernel `jaxgemm.dispatch` picks "
         "(`chose`: a tuned kernel from the autotune cache or the shipped table, or XLA's dot "
         f"as the fallback). Target: geomean >= {DEFAULT_TARGET:.2f}x over the "
         f"{' and '.join(TARGET_SUITES)} suites, no problem below {DEFAULT_FLOOR:.2f}x, and a "
         "training step no slower than XLA's.", "", *summary, ""]
  if not is_target:
    out += [f"This run has no {' or '.join(TARGET_SUITES)} problems; the table shows every "
            "problem the default ran on.", ""]
  rows = []
  for suite in suites:
    for p in run.problems(suite):
      a = run.auto(suite, p["problem"])
      if a is None:
        continue
      cell = cell_t(a)
      if a["status"] == "ok" and (num(a["speedup_vs_xla"]) or 0) < DEFAULT_FLOOR:
        cell = f"**{cell}**"
      rows.append([suite, p["problem"], shape(p), p["layout"], cell_t(p, False), cell,
                   a.get("chosen") or "-"])
  if rows:
    out += table(["suite", "problem", "MxKxN", "layout", "XLA TFLOP/s",
                  f"default TFLOP/s (vs XLA; bold below {DEFAULT_FLOOR:.2f}x)", "chose"], rows)
  return out


def _console(run) -> list[str]:
  summary = defaults_summary(run)
  return ["", "jaxgemm's default (backend='auto') vs XLA:", *summary] if summary else []


# ---------------------------------------------------------------- kernel targets

# The kernel targets of the Triton and Pallas issues: (problem, dtype, backend,
# best variant at least this x XLA). What a run did not measure shows as such.
ISSUE_TARGETS = [
    ("sq4096", "bf16", "triton", 0.92), ("sq4096", "bf16", "pallas", 0.97),
    ("sq8192", "bf16", "triton", 0.92), ("sq8192", "bf16", "pallas", 1.00),
    ("u4095x4097x4093", "bf16", "triton", 3.0), ("u4095x4097x4093", "bf16", "pallas", 3.0),
    ("m16.k8192.n8192", "bf16", "triton", 0.9), ("m128.k8192.n8192", "bf16", "pallas", 0.9),
    ("llama3-8b.up.t8192", "bf16", "pallas", 1.00),
    ("llama3-8b.down.t8192", "bf16", "pallas", 1.00),
    ("square4096.t4096.dgrad", "bf16", "triton", 0.9),
    ("square4096.t4096.wgrad", "bf16", "triton", 0.9),
    ("square4096.t4096.dgrad", "bf16", "pallas", 0.95),
    ("square4096.t4096.wgrad", "bf16", "pallas", 0.95),
    ("sq8192", "fp32", "triton", 0.9), ("sq8192", "fp32-highest", "triton", 0.9),
]


def targets_table(run) -> list[str]:
  """Each issue target against the best variant of its backend in this run."""
  rows = []
  for problem, dtype, backend, target in ISSUE_TARGETS:
    rr = [r for r in run.gemm if r["problem"] == problem and r["dtype"] == dtype]
    if not rr:
      continue
    label = f"{problem} ({rr[0].get('m')}x{rr[0].get('k')}x{rr[0].get('n')}, {dtype})"
    ok = [r for r in rr if r["backend"] == backend and r["status"] == "ok"
          and num(r["speedup_vs_xla"])]
    if not ok:
      rows.append([label, backend, f">= {target:g}x", "not measured", "-"])
      continue
    b = max(ok, key=lambda r: num(r["speedup_vs_xla"]))
    s = num(b["speedup_vs_xla"])
    rows.append([label, backend, f">= {target:g}x",
                 f"{b['variant']} {fmt_t(num(b['tflops']))} TFLOP/s ({fmt_x(s)})",
                 verdict(run, s >= target)])
  if not rows:
    return []
  return table(["problem (MxKxN)", "backend", "target vs XLA", "best variant", ""], rows)


# ---------------------------------------------------------------- a GEMM suite's table

def suite_table(run, suite: str) -> list[str]:
  """Each problem: XLA's TFLOP/s and % of peak, the default's and each backend's best
  variant (vs XLA), and for memory-bound problems the bandwidth."""
  bs = list(run.backend_variants)
  bw = run.copy_bw()
  rows = []
  for p in run.problems(suite):
    xla = cell_t(p, False) if p["status"] == "ok" else p["status"]
    row = [p["problem"], shape(p), p["layout"], xla,
           f"{num(p['pct_peak']):.0f}%" if num(p["pct_peak"]) else "-"]
    if run.has_auto:
      a = run.auto(suite, p["problem"])
      row.append("-" if a is None else f"{cell_t(a)} {a.get('chosen') or ''}".strip())
    for b in bs:
      best = run.best(suite, p["problem"], [b])
      if best is None:
        st = sorted({r["status"] for r in run.kernel_rows(suite, p["problem"]) if r["backend"] == b})
        row.append("/".join(st) or "-")
      else:
        row.append(f"{cell_t(best)} {best['variant']}")
    mb = p.get("memory_bound") == "1" or suite == "skinny"
    if mb and num(p["gbps"]):
      pct = f" ({num(p['gbps']) / bw * 100:.0f}% of copy)" if bw else ""
      row.append(f"XLA {num(p['gbps']):.0f} GB/s{pct}" + "".join(
          f"; {b} {num(x['gbps']):.0f}" for b in bs
          if (x := run.best(suite, p["problem"], [b])) is not None))
    else:
      row.append("")
    rows.append(row)
  header = ["problem", "MxKxN", "layout", "XLA TFLOP/s", "XLA % peak",
            *(["default (auto) (vs XLA), chose"] if run.has_auto else []),
            *[f"{b} best (vs XLA) variant" for b in bs], "memory bound: GB/s"]
  return table(header, rows)


# ---------------------------------------------------------------- the entry

ENTRY = BenchOp(
    name="matmul", order=10, ops=("matmul",),
    suites=(
        *(Suite(name, HELP[name], problems, runner="runner", gpu_default=name in GPU_DEFAULT,
                cpu_default=name == "tiny")
          for name, problems in P.SUITES.items()),
        Suite(TRAINING, HELP[TRAINING], None, runner="training", gpu_default=True,
              cpu_default=True, list_note="a training step: see bench/training.py"),
    ),
    suite_table=suite_table,
    targets=(
        Section("Defaults (backend='auto') vs XLA", defaults_section,
                readme_title="Defaults (backend='auto') vs XLA", readme_body=defaults_summary),
        Section("Kernel targets of the Triton and Pallas issues", targets_table,
                readme_title="Kernel targets of the Triton and Pallas issues"),
    ),
    console=_console,
)
