"""The Markdown a run's CSV makes: tables, REPORT.md, the README's tables, the ladder guide.

Generated blocks go into hand-written documents between markers (one
mechanism, `replace_block`): README.md's `<!-- bench:begin ... -->` block and
docs/ladders.md's `<!-- ladder:<backend>:begin -->` blocks.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .csvio import PROVENANCE, num
from .plots import PLOTS
from .view import AUTO, EXAMPLE, REF, XLA_PEER, Run, geomean

# Issue 6's target for the default: geomean over these suites at least
# DEFAULT_TARGET x XLA, no problem below DEFAULT_FLOOR x, and a training step no
# slower than XLA's.
TARGET_SUITES = ("square", "llm")
DEFAULT_TARGET = 1.00
DEFAULT_FLOOR = 0.97

NOT_GPU_BANNER = ("**NOT GPU TIMINGS: no GPU was found.** These numbers come from XLA:CPU "
                  "and the kernels' CPU interpreters on tiny problems; they check that the "
                  "benchmark and the kernels run and agree with XLA, and say nothing about "
                  "GPU performance.")


def _cell_t(r: dict | None, with_speedup=True) -> str:
  if r is None:
    return "-"
  if r["status"] != "ok":
    return r["status"]
  t = num(r["tflops"])
  s = num(r["speedup_vs_xla"])
  if with_speedup and s is not None:
    return f"{_fmt_t(t)} ({_fmt_x(s)})"
  return _fmt_t(t)


def _fmt_t(x):
  """TFLOP/s: one decimal, or 3 significant digits below 1 (CPU runs)."""
  return "-" if x is None else (f"{x:.1f}" if x >= 1 else f"{x:.3g}")


def _fmt_x(s):
  return "-" if s is None else (f"{s:.2f}x" if s >= 0.1 else f"{s:.2g}x")


def _table(header, rows) -> list[str]:
  out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return out


def headline_table(run: Run) -> list[str]:
  """Best jaxgemm kernel (own backends) and jaxgemm's default against XLA, per suite."""
  own = run.own_backends
  rows = []
  for suite in run.suites:
    probs = run.problems(suite)
    speedups, wins, losses, bad, best_txt, worst_txt = [], 0, 0, 0, None, None
    best_s, worst_s = -1, 1e99
    for p in probs:
      ks = run.kernel_rows(suite, p["problem"])
      bad += sum(1 for r in ks if r["status"] in ("fail", "error"))
      b = run.best(suite, p["problem"], own)
      if b is None:
        continue
      s = num(b["speedup_vs_xla"])
      speedups.append(s)
      wins += s > 1
      losses += s < 1
      label = f"{p['problem']} {_fmt_x(s)} ({b['backend']}/{b['variant']})"
      if s > best_s:
        best_s, best_txt = s, label
      if s < worst_s:
        worst_s, worst_txt = s, label
    xla = [num(p["tflops"]) for p in probs if p["status"] == "ok"]
    g = geomean(speedups)
    row = [suite, len(probs), _fmt_t(geomean(xla)), _fmt_x(g), f"{wins}/{len(speedups)}",
           losses, bad, best_txt or "-", worst_txt or "-"]
    if run.has_auto:
      d = _auto_stats(run, [suite])
      row += [_fmt_x(d["geomean"]), f"{_fmt_x(d['min'])} ({d['min_problem']})" if d["n"] else "-",
              f"{d['below']}/{d['n']}" if d["n"] else "-"]
    rows.append(row)
  header = ["suite", "problems", "XLA TFLOP/s (geomean)", "best jaxgemm vs XLA (geomean)",
            "jaxgemm faster", "slower", "failed/errored kernel runs", "best", "worst"]
  if run.has_auto:
    header += ["default (auto) vs XLA (geomean)", "default min",
               f"default below {DEFAULT_FLOOR:.2f}x"]
  return _table(header, rows)


def _auto_stats(run: Run, suites) -> dict:
  """The default's (backend='auto') speedups over XLA on the problems of `suites`."""
  speedups, below, bad, lo, lo_problem = [], 0, 0, None, ""
  for suite in suites:
    for p in run.problems(suite):
      a = run.auto(suite, p["problem"])
      if a is None:
        continue
      bad += a["status"] in ("fail", "error")
      s = num(a["speedup_vs_xla"]) if a["status"] == "ok" else None
      if not s:
        continue
      speedups.append(s)
      below += s < DEFAULT_FLOOR
      if lo is None or s < lo:
        lo, lo_problem = s, p["problem"]
  return {"geomean": geomean(speedups), "min": lo, "min_problem": lo_problem,
          "below": below, "n": len(speedups), "bad": bad}


def _base_suite(suite: str) -> str:
  """'square' of 'square (fp32)' (a merged run's label for its other dtypes)."""
  return suite.split(" (", 1)[0]


def _default_suites(run: Run) -> tuple[list[str], bool]:
  """(suites the defaults section covers, whether they are the target's).

  The target's suites (square, llm) where the run has them, else every suite
  the default ran on (a CPU run's tiny suite), so that a run always shows them.
  """
  target = [s for s in run.suites if _base_suite(s) in TARGET_SUITES]
  if target:
    return target, True
  ran = [s for s in run.suites if any(r["backend"] == AUTO for r in run.gemm
                                      if r["suite"] == s)]
  # matmul's suites where the run has some (a CPU run's tiny), else the grouped GEMM's
  return [s for s in ran if not run.is_moe(s)] or ran, False


def _met(ok: bool) -> str:
  return "target met" if ok else "target NOT met"


def defaults_summary(run: Run) -> list[str]:
  """jaxgemm's default (backend='auto') against XLA: the GEMM and training numbers."""
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["backend"] == AUTO
           and not _is_moe_step(r) and not _is_epilogue_step(r) and not _is_fp8_step(r)]
  if not steps and not run.has_auto:
    return []
  suites, is_target = _default_suites(run)
  out = []
  by_dtype = defaultdict(list)   # merged runs: one line per dtype, never a mixed geomean
  for s in suites:
    by_dtype[run.problems(s)[0]["dtype"] if run.problems(s) else ""].append(s)
  for dtype, group in by_dtype.items():
    d = _auto_stats(run, group)
    label = f"{' + '.join(_base_suite(s) for s in group)} ({dtype})"
    if not d["n"]:
      out.append(f"- {label}: no measured backend='auto' rows.")
      continue
    text = (f"- {label}: geomean {_fmt_x(d['geomean'])} over {d['n']} problems, min "
            f"{_fmt_x(d['min'])} ({d['min_problem']}), {d['below']} below "
            f"{DEFAULT_FLOOR:.2f}x")
    if d["bad"]:
      text += f", {d['bad']} failed/errored"
    if is_target:
      text += ": " + _met(d["geomean"] >= DEFAULT_TARGET and d["min"] >= DEFAULT_FLOOR
                          and not d["bad"])
    out.append(text + ".")
  for r in steps:
    s = num(r.get("speedup_vs_xla"))
    if r["status"] != "ok" or not s:
      bad = r["status"] in ("fail", "error")   # a skipped step is unmeasured, not a miss
      out.append(f"- training step ({r['problem']}): {r['status']}"
                 + (f" ({r['note']})" if r.get("note") else "")
                 + (f": {_met(False)}." if bad else "."))
      continue
    out.append(f"- training step ({r['problem']}): {num(r['time_ms_median']):.3f} ms against "
               f"XLA's {num(r['xla_time_ms']):.3f} ms ({_fmt_x(s)}): {_met(s >= 1.0)}.")
  return out


def defaults_section(run: Run) -> list[str]:
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
      cell = _cell_t(a)
      if a["status"] == "ok" and (num(a["speedup_vs_xla"]) or 0) < DEFAULT_FLOOR:
        cell = f"**{cell}**"
      rows.append([suite, p["problem"], _shape(p), p["layout"], _cell_t(p, False), cell,
                   a.get("chosen") or "-"])
  if rows:
    out += _table(["suite", "problem", "MxKxN", "layout", "XLA TFLOP/s",
                   f"default TFLOP/s (vs XLA; bold below {DEFAULT_FLOOR:.2f}x)", "chose"], rows)
  return out


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


def targets_table(run: Run) -> list[str]:
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
                 f"{b['variant']} {_fmt_t(num(b['tflops']))} TFLOP/s ({_fmt_x(s)})",
                 "met" if s >= target else "**missed**"])
  if not rows:
    return []
  return _table(["problem (MxKxN)", "backend", "target vs XLA", "best variant", ""], rows)


# ---------------------------------------------------------------- grouped GEMM (moe suites)

def _is_moe_step(r: dict) -> bool:
  """A training step of the moe suites' MoE model (not the dense model's)."""
  return r.get("suite", "").startswith("moe")


def _moe_backends(run: Run, suites) -> list[str]:
  """jaxgemm's backends with rows in the moe suites (xla's first), then the default."""
  seen = [r["backend"] for s in suites for p in run.problems(s)
          for r in run.kernel_rows(s, p["problem"])]
  bs = [b for b in run.backend_variants if b in seen]
  return bs + ([AUTO] if AUTO in seen else [])


def _fastest(rows) -> dict | None:
  ok = [r for r in rows if r and r["status"] == "ok" and num(r["time_ms_median"])]
  return min(ok, key=lambda r: num(r["time_ms_median"])) if ok else None


def _pick(run: Run, suite: str, problem: str, backend: str) -> dict | None:
  """The fastest correct row of `backend` on the problem (EXAMPLE: jax's example)."""
  if backend == EXAMPLE:
    return _fastest([run.example(suite, problem)])
  return _fastest(r for r in run.kernel_rows(suite, problem) if r["backend"] == backend)


def _us(r: dict) -> str:
  return f"{num(r['time_ms_median']) * 1e3:,.0f} us"


def _roofline(r: dict) -> float | None:
  pct = num(r.get("pct_copy_bw"))
  return None if pct is None else pct / 100


def moe_table(run: Run, suite: str) -> list[str]:
  """A moe suite's problems: TFLOP/s of XLA's lax.ragged_dot, jax's example kernel, the
  default and each backend (best variant) with its ratios, and the bandwidth roofline."""
  bs = [b for b in _moe_backends(run, [suite]) if b != AUTO]
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    ex = _pick(run, suite, name, EXAMPLE)
    exr = run.example(suite, name)
    row = [name, f"{p.get('groups')} ({p.get('active_groups') or '?'})", _shape(p),
           p.get("mode", ""), _cell_t(p, False) if p["status"] == "ok" else p["status"],
           _fmt_t(num(ex["tflops"])) if ex else (exr["status"] if exr else "-")]

    def cell(r):
      if r is None:
        return "-"
      text = _cell_t(r)
      sx = num(r.get("speedup_vs_example"))
      if r["status"] == "ok" and sx:
        text = text[:-1] + f"; {_fmt_x(sx)} ex.)"
      return text

    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else f"{cell(a)} {a.get('chosen') or ''}".strip())
    for b in bs:
      best = _pick(run, suite, name, b)
      if best is None:
        st = sorted({r["status"] for r in run.kernel_rows(suite, name) if r["backend"] == b})
        row.append("/".join(st) or "-")
      else:
        row.append(f"{cell(best)} {best['variant']}")
    if p.get("memory_bound") == "1":
      parts = []
      for who, r in (("XLA", p if p["status"] == "ok" else None), ("example", ex),
                     *((b, _pick(run, suite, name, b)) for b in bs)):
        if r is not None and _roofline(r) is not None:
          parts.append(f"{who} {_us(r)} {_roofline(r):.2f}x")
      row.append("; ".join(parts))
    else:
      row.append("")
    rows.append(row)
  header = ["problem", "G (with tokens)", "MxKxN", "call", "XLA lax.ragged_dot TFLOP/s",
            "jax example TFLOP/s (best config)",
            *(["default (auto) (vs XLA; vs ex.), chose"] if run.has_auto else []),
            *[f"{b} best (vs XLA; vs ex.) variant" for b in bs],
            "memory bound: time, fraction of the bandwidth roofline"]
  return _table(header, rows)


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


def _moe_value(run: Run, kind: str, suite: str, problem: str, r: dict | None, backend: str):
  """(value compared with the target, cell text) of row `r`, or (None, text)."""
  if r is None:
    return None, "-"
  if r["status"] != "ok":
    return None, r["status"]
  t, ms = num(r.get("tflops")), num(r["time_ms_median"])
  if kind == "tflops":
    return t, f"{_fmt_t(t)} TFLOP/s"
  if kind == "time_us":
    rf = _roofline(r)
    return ms * 1e3, _us(r) + (f" ({rf:.2f}x roofline)" if rf is not None else "")
  if kind == "roofline":
    rf = _roofline(r)
    return rf, "-" if rf is None else f"{rf:.2f}x ({_us(r)})"
  if kind == "bwd":
    fwd_name = problem.rsplit(".", 1)[0]
    fwd = (next((p for p in run.problems(suite) if p["problem"] == fwd_name), None)
           if backend == REF else _pick(run, suite, fwd_name, backend))
    ft = num(fwd["tflops"]) if fwd and fwd["status"] == "ok" else None
    if not ft:
      return None, f"{_fmt_t(t)} TFLOP/s (no forward)"
    return t / ft, f"{_fmt_t(t)} TFLOP/s ({t / ft:.2f}x fwd)"
  raise ValueError(kind)


def moe_targets_table(run: Run) -> list[str]:
  """Issue 26's targets against this run: XLA, jax's example, each backend's best variant
  and the default; `met` where any of jaxgemm's kernels (a named backend other than xla,
  or the default) reaches the target."""
  suites = [s for s in run.suites if run.is_moe(s)
            and all(p["dtype"] == "bf16" for p in run.problems(s))]
  steps = [r for r in run.rows if r["kind"] == "train_step" and _is_moe_step(r)]
  bs = _moe_backends(run, suites)
  ours = [b for b in bs if b != "xla"]
  rows = []
  for problem, kind, target, text in MOE_TARGETS:
    cells, values = [], []
    if kind == "train":
      if not steps:
        continue
      model = steps[0]["problem"]
      ref = next((r for r in steps if r["backend"] == REF and r["problem"] == model), None)
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
        cells.append(f"{_fmt_x(s)} ({num(r['time_ms_median']):.2f} ms)")
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
                   _moe_value(run, kind, suite, problem, _pick(run, suite, problem, EXAMPLE),
                              EXAMPLE)[1])
      for b in bs:
        v, c = _moe_value(run, kind, suite, problem, _pick(run, suite, problem, b), b)
        cells.append(c)
        if v is not None and b in ours:
          values.append(v)
      label = f"{problem} (G={ref.get('groups')}, {_shape(ref)}, {ref.get('mode')})"
    if not values:
      verdict = "not measured"
    else:
      best = min(values) if kind == "time_us" else max(values)
      verdict = "met" if (best <= target if kind == "time_us" else best >= target) \
          else "**missed**"
    rows.append([label, text, *cells, verdict])
  if not rows:
    return []
  return _table(["problem", "target", "XLA", "jax example", *[
      "default (auto)" if b == AUTO else f"{b} (best variant)" for b in bs], ""], rows)


# ---------------------------------------------------------------- GEMM epilogues (epilogue suites)

def _is_epilogue_step(r: dict) -> bool:
  """A training step of the epilogue suites' SwiGLU model."""
  return r.get("suite", "").startswith("epilogue")


# The expressions as the reports print them (bench/problems.py's EXPRESSIONS).
EXPR_TEXT = {"dot": "x @ w", "bias": "x @ w + b", "bias.gelu": "gelu(x @ w + b)",
             "silu": "silu(x @ w)", "bias.residual": "x @ w + b + residual",
             "swiglu": "silu(x @ wg) * (x @ wu)"}
EXPR_GEMMS = {"swiglu": 2}   # forward GEMMs of M x K x N; x3 with the backward


def _expr_text(p: dict) -> str:
  text = EXPR_TEXT.get(p.get("expr", ""), p.get("expr", ""))
  return text + (" (fwd+bwd)" if p.get("mode") == "fwd+bwd" else "")


def _gemm_floor_ms(run: Run, suite: str, p: dict) -> float | None:
  """XLA's bare dot at the problem's shape (the `dot` forward problem of its layer) times
  the expression's GEMM count: the time the GEMMs alone take on XLA."""
  dot = next((q for q in run.problems(suite) if q.get("layer") == p.get("layer")
              and q.get("expr") == "dot" and q.get("mode") == "fwd" and q["status"] == "ok"),
             None)
  if dot is None or not num(dot["time_ms_median"]):
    return None
  gemms = EXPR_GEMMS.get(p.get("expr"), 1) * (3 if p.get("mode") == "fwd+bwd" else 1)
  return num(dot["time_ms_median"]) * gemms


def _us_e(r: dict) -> str:
  """A row's time in us, with a decimal below 100 us (the decode-sized problems)."""
  us = num(r["time_ms_median"]) * 1e3
  return f"{us:.1f} us" if us < 100 else f"{us:,.0f} us"


def _us_x(r: dict) -> str:
  """'1,234 us (1.05x)': a kernel row's time and its speedup over XLA's program."""
  return f"{_us_e(r)} ({_fmt_x(num(r['speedup_vs_xla']))})"


def _epilogue_backends(run: Run, suites) -> list[str]:
  """jaxgemm's backends with rows in the epilogue suites (the xla backend first)."""
  seen = {r["backend"] for s in suites for p in run.problems(s)
          for r in run.kernel_rows(s, p["problem"])}
  return [b for b in run.backend_variants if b in seen]


def _epilogue_cell(run: Run, suite: str, problem: str, backend: str) -> str:
  best = _pick(run, suite, problem, backend)
  if best is None:
    st = sorted({r["status"] for r in run.kernel_rows(suite, problem) if r["backend"] == backend})
    return "/".join(st) or "-"
  v = best["variant"]
  return _us_x(best) + ("" if v in ("(default)", "default") else f" {v}")


def epilogue_table(run: Run, suite: str) -> list[str]:
  """An epilogue suite's problems: XLA's program of each expression (and its ratio to the
  GEMMs alone on XLA), the default and each backend: time (vs XLA)."""
  bs = _epilogue_backends(run, [suite])
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    if p["status"] == "ok":
      floor = _gemm_floor_ms(run, suite, p)
      xla = _us_e(p) + (f" ({num(p['time_ms_median']) / floor:.3f}x)" if floor else "")
    else:
      xla = p["status"]
    row = [name, _expr_text(p), _shape(p), xla]
    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else
                 f"{_us_x(a) if a['status'] == 'ok' else a['status']} {a.get('chosen') or ''}".strip())
    row += [_epilogue_cell(run, suite, name, b) for b in bs]
    rows.append(row)
  header = ["problem", "expression", "MxKxN", "XLA's program (x its GEMMs on XLA)",
            *(["default (auto) (vs XLA), chose"] if run.has_auto else []),
            *[f"{b} (vs XLA)" for b in bs]]
  return _table(header, rows)


# Issue 27's targets (H200, bf16): (problem of the epilogue suite, best jaxgemm kernel's
# speedup over XLA's program of the same expression, at least), then the SwiGLU
# training step's (backend="auto" only, losses agreeing).
EPILOGUE_TARGETS = (
    *((f"{shape}.bias.gelu", t) for shape, t in (
        ("m8192.k4096.n14336", 1.10), ("sq4096", 1.10), ("m128.k4096.n14336", 1.12))),
    *((f"{shape}.silu", 1.08) for shape in ("m8192.k4096.n14336", "sq4096", "m128.k4096.n14336")),
    *((f"{shape}.bias.residual", 1.03)
      for shape in ("m8192.k4096.n14336", "sq4096", "m128.k4096.n14336")),
    ("m8192.k4096.n14336.swiglu", 1.05), ("m128.k4096.n14336.swiglu", 1.12),
    ("m8192.k4096.n14336.bias.gelu.fwd+bwd", 1.03), ("m128.k4096.n14336.bias.gelu.fwd+bwd", 1.15),
)
EPILOGUE_TRAIN_TARGET = 1.03
EPILOGUE_TARGETS_NOTE = (
    "Each target against XLA's jitted program of the same jnp expression, timed in the same "
    "run; cells: each backend's fastest correct variant, time (vs XLA). `met` where a jaxgemm "
    "kernel (not the `xla` backend) reaches it; the SwiGLU training step's target is the "
    "default's (`backend='auto'`), with its losses agreeing with XLA's model.")
EPILOGUE_TABLE_NOTE = (
    "Cells: time per call (CUPTI on a GPU) and, for kernels, XLA's program's time over "
    "theirs (> 1: faster). XLA's column also gives its time over its bare `x @ w` at the "
    "same shape times the expression's GEMM count (2 for SwiGLU, x3 with the backward): "
    "what the epilogue costs XLA. fwd+bwd: `y, vjp = jax.vjp(expr, x, w[, b])`, `(y, "
    "*vjp(dy))` with a random cotangent `dy`. Named backends run with variant=None (their "
    "own choice per GEMM) unless the run named variants.")


def epilogue_targets_table(run: Run) -> list[str]:
  """Issue 27's targets against this run: XLA, each backend's best variant and the default;
  `met` where one of jaxgemm's kernels (a backend other than xla, or the default)
  reaches the target (the training step: the default)."""
  suites = [s for s in run.suites if run.is_epilogue(s)
            and all(p["dtype"] == "bf16" for p in run.problems(s))]
  steps = [r for r in run.rows if r["kind"] == "train_step" and _is_epilogue_step(r)]
  bs = [*_epilogue_backends(run, suites), *([AUTO] if run.has_auto else [])]
  ours = [b for b in bs if b != "xla"]
  rows = []
  for problem, target in EPILOGUE_TARGETS:
    suite = next((s for s in suites if any(p["problem"] == problem for p in run.problems(s))),
                 None)
    if suite is None:
      continue
    ref = next(p for p in run.problems(suite) if p["problem"] == problem)
    cells, values = [_us_e(ref) if ref["status"] == "ok" else ref["status"]], []
    for b in bs:
      r = _pick(run, suite, problem, b)
      cells.append(_epilogue_cell(run, suite, problem, b))
      if r is not None and b in ours:
        values.append(num(r["speedup_vs_xla"]))
    verdict = ("not measured" if not values else
               "met" if max(values) >= target else "**missed**")
    rows.append([f"{_expr_text(ref)} at {_shape(ref)}", f">= {target:.2f}x", *cells, verdict])
  if steps:
    model = steps[0]["problem"]
    ref = next((r for r in steps if r["backend"] == REF and r["problem"] == model), None)
    cells = [f"{num(ref['time_ms_median']):.2f} ms" if ref and ref["status"] == "ok"
             else (ref["status"] if ref else "-")]
    verdict = "not measured"
    for b in bs:
      rr = [r for r in steps if r["backend"] == b and r["problem"] == model]
      ok = [r for r in rr if r["status"] == "ok" and num(r.get("speedup_vs_xla"))]
      if not ok:
        cells.append("/".join(sorted({r["status"] for r in rr})) or "-")
        if b == AUTO and any(r["status"] == "fail" for r in rr):
          verdict = "**missed** (losses disagree)"
        continue
      r = max(ok, key=lambda r: num(r["speedup_vs_xla"]))
      s = num(r["speedup_vs_xla"])
      cells.append(f"{num(r['time_ms_median']):.2f} ms ({_fmt_x(s)})")
      if b == AUTO:
        verdict = "met" if s >= EPILOGUE_TRAIN_TARGET else "**missed**"
    rows.append([f"SwiGLU training step ({model}), default", f">= {EPILOGUE_TRAIN_TARGET:.2f}x",
                 *cells, verdict])
  if not rows:
    return []
  return _table(["expression at MxKxN", "target vs XLA", "XLA", *[
      "default (auto)" if b == AUTO else f"{b} (best variant)" for b in bs], ""], rows)


# ---------------------------------------------------------------- FP8 GEMMs (fp8 suites)

def _is_fp8_step(r: dict) -> bool:
  """A training step of the fp8 suites' FP8 model (against its bf16 step on XLA)."""
  return r.get("suite", "").startswith("fp8")


# XLA's other programs of an fp8 problem (bench/fp8.py), as the tables name them.
FP8_PEERS = (("fp8_dot", "XLA fp8 dot (no scales)"), ("bf16_dot", "XLA bf16 dot"))


def _fp8_backends(run: Run, suites) -> list[str]:
  """jaxgemm's backends with rows in the fp8 suites (the xla backend first)."""
  seen = {r["backend"] for s in suites for p in run.problems(s)
          for r in run.kernel_rows(s, p["problem"])}
  return [b for b in run.backend_variants if b in seen]


def _tf_x(r: dict | None, label: bool = True) -> str:
  """'1,310.2 (1.35x) variant': a row's TFLOP/s and its speedup over XLA's scaled form."""
  if r is None:
    return "-"
  if r["status"] != "ok":
    return r["status"]
  v = r["variant"]
  text = f"{num(r['tflops']):,.1f}" if num(r["tflops"]) >= 1 else _fmt_t(num(r["tflops"]))
  s = num(r.get("speedup_vs_xla"))
  if s is not None and r["backend"] != REF:
    text += f" ({_fmt_x(s)})"
  return text + (f" {v}" if label and r["backend"] not in (REF, XLA_PEER)
                 and v not in ("(default)", "default") else "")


def _fp8_cell(run: Run, suite: str, problem: str, backend: str) -> str:
  best = _pick(run, suite, problem, backend)
  if best is None:
    st = sorted({r["status"] for r in run.kernel_rows(suite, problem) if r["backend"] == backend})
    return "/".join(st) or "-"
  return _tf_x(best)


def fp8_table(run: Run, suite: str) -> list[str]:
  """An fp8 suite's problems: TFLOP/s of XLA's fp8 dot, its scaled form (the reference),
  its bf16 dot, the default and each backend, each (vs the scaled form)."""
  bs = _fp8_backends(run, [suite])
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    row = [name, p.get("scaling", ""), p.get("layout", ""), _shape(p), p.get("fp8_dtypes", ""),
           *[_tf_x(run.peer(suite, name, v)) for v, _ in FP8_PEERS[:1]],
           f"{_tf_x(p)} `{p['variant']}`", *[_tf_x(run.peer(suite, name, v)) for v, _ in FP8_PEERS[1:]]]
    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else f"{_tf_x(a)} {a.get('chosen') or ''}".strip())
    row += [_fp8_cell(run, suite, name, b) for b in bs]
    rows.append(row)
  header = ["problem", "scales", "layout", "MxKxN", "fp8", f"{FP8_PEERS[0][1]}",
            "XLA scaled form (the reference)", f"{FP8_PEERS[1][1]}",
            *(["default (auto), chose"] if run.has_auto else []), *bs]
  return _table(header, rows)


# Issue 28's targets (bf16 output): (problem of the fp8 suite, kind, threshold, as the issue
# says it). Kinds: "tflops" (the best jaxgemm kernel's TFLOP/s, at least), "speedup" (its
# speedup over XLA's scaled form of the problem, at least).
FP8_TARGETS = (
    *((f"{shape}.tensor", "tflops", t) for shape, t in (
        ("sq8192", 1350.0), ("m8192.k4096.n14336", 1300.0), ("sq4096", 1100.0))),
    ("m128.k4096.n14336.tensor", "speedup", 2.0),
    *((f"{shape}.block", "tflops", t) for shape, t in (
        ("sq8192", 1250.0), ("m8192.k4096.n14336", 1200.0), ("sq4096", 1000.0))),
    ("m128.k4096.n14336.block", "speedup", 1.8),
)
# The FP8 training step's: at least this x XLA's bf16 step, its last loss within
# FP8_TRAIN_LOSS (2%) of bf16's after FP8_TRAIN_STEPS steps (training.GPU_FP8_MODEL's).
FP8_TRAIN_TARGET = 1.25
FP8_TRAIN_LOSS = 0.02
FP8_TRAIN_STEPS = 100
FP8_TARGETS_NOTE = (
    "Each target against this run's rows (bf16 output): TFLOP/s count 2 M K N; ratios are "
    "against XLA's scaled form of the same problem timed in the same run (per tensor "
    "`(jnp.dot(a8, b8, f32) * (sa * sb)).astype(bf16)`, `dot_f32*scales`; block scales the "
    "`xla` backend's fori_loop over 128-wide K blocks, `scaled_matmul[xla]`: the CSV's "
    "`xla_ref`). Cells: TFLOP/s (vs the scaled form). `met` where a jaxgemm kernel (not the "
    "`xla` backend) reaches it. The training step: `jaxgemm.matmul(x, w, fp8=recipe)` in the "
    "layers against the same model's bf16 step on XLA, step time ratio and the last step's "
    f"loss against bf16's (target after {FP8_TRAIN_STEPS} steps).")
FP8_TABLE_NOTE = (
    "Cells: TFLOP/s (2 M K N over the median time) and each one's speedup over XLA's scaled "
    "form of the problem (the reference, named in its column), all timed in the same run. "
    "`XLA fp8 dot`: `lax.dot_general(a8, b8, preferred_element_type=bf16)` without scales; "
    "`XLA bf16 dot`: the dot of the dequantized values in bf16. Every result is checked "
    "first against the exact product of the dequantized operands (fp32, HIGHEST). dgrad "
    "(NT) and wgrad (TN) are a layer's backward GEMMs, with the recipe's gradient dtype.")


def _fp8_train_cell(r: dict) -> tuple[str, float | None, float | None]:
  """(cell, speedup, last-step loss rel diff) of an FP8 step row."""
  if r["status"] != "ok":
    return r["status"], None, None
  s, d = num(r.get("speedup_vs_xla")), num(r.get("loss_last_rel_diff"))
  text = f"{num(r['time_ms_median']):.2f} ms ({_fmt_x(s)})"
  if d is not None:
    text += f", loss {100 * d:.2f}% off"
  return text, s, d


def fp8_targets_table(run: Run) -> list[str]:
  """Issue 28's targets against this run: XLA's programs, each backend's best variant and
  the default; `met` where one of jaxgemm's kernels (a backend other than xla, or the
  default) reaches the target."""
  suites = [s for s in run.suites if run.is_fp8(s)]
  steps = [r for r in run.rows if r["kind"] == "train_step" and _is_fp8_step(r)]
  bs = [*_fp8_backends(run, suites), *([AUTO] if run.has_auto or any(
      r["backend"] == AUTO for r in steps) else [])]
  ours = [b for b in bs if b != "xla"]
  rows = []
  for problem, kind, target in FP8_TARGETS:
    suite = next((s for s in suites if any(p["problem"] == problem for p in run.problems(s))),
                 None)
    if suite is None:
      continue
    ref = next(p for p in run.problems(suite) if p["problem"] == problem)
    cells = [_tf_x(run.peer(suite, problem, FP8_PEERS[0][0])), _tf_x(ref),
             _tf_x(run.peer(suite, problem, FP8_PEERS[1][0]))]
    values = []
    for b in bs:
      r = _pick(run, suite, problem, b)
      cells.append(_fp8_cell(run, suite, problem, b))
      if r is not None and b in ours:
        values.append(num(r["tflops"]) if kind == "tflops" else num(r["speedup_vs_xla"]))
    verdict = ("not measured" if not values else
               "met" if max(values) >= target else "**missed**")
    text = f">= {target:,.0f} TFLOP/s" if kind == "tflops" else f">= {target:g}x XLA's scaled form"
    rows.append([f"{problem} ({_shape(ref)}, {ref.get('scaling')} scales)", text, *cells,
                 verdict])
  models = list(dict.fromkeys(r["problem"] for r in steps))
  for model in models:
    ref = next((r for r in steps if r["backend"] == REF and r["problem"] == model), None)
    recipes = list(dict.fromkeys(r["variant"] for r in steps
                                 if r["problem"] == model and r["backend"] != REF))
    for recipe in recipes:
      cells = ["-", f"{num(ref['time_ms_median']):.2f} ms (bf16 step)"
               if ref and ref["status"] == "ok" else (ref["status"] if ref else "-"), "-"]
      met, measured = False, False
      n_steps = 0
      for b in bs:
        rr = [r for r in steps if r["problem"] == model and r["backend"] == b
              and r["variant"] == recipe]
        if not rr:
          cells.append("-")
          continue
        cell, sp, d = _fp8_train_cell(rr[0])
        cells.append(cell)
        if sp is not None and d is not None and b in ours:
          measured = True
          n_steps = max(n_steps, int(num(rr[0].get("steps")) or 0))
          met |= sp >= FP8_TRAIN_TARGET and d <= FP8_TRAIN_LOSS
      verdict = ("not measured" if not measured else
                 f"not measured ({n_steps} steps)" if n_steps < FP8_TRAIN_STEPS else
                 "met" if met else "**missed**")
      rows.append([f"FP8 training step ({model}), {recipe}",
                   f">= {FP8_TRAIN_TARGET:g}x XLA's bf16 step, last loss within "
                   f"{100 * FP8_TRAIN_LOSS:g}%", *cells, verdict])
  if not rows:
    return []
  return _table(["problem", "target", FP8_PEERS[0][1], "XLA scaled form", FP8_PEERS[1][1],
                 *["default (auto)" if b == AUTO else f"{b} (best variant)" for b in bs], ""],
                rows)


def backend_suite_table(run: Run) -> list[str]:
  """Per backend (its best variant on each problem): geomean speedup per suite."""
  bs = list(run.backend_variants)
  rows = []
  for suite in run.suites:
    row = [suite]
    for b in bs:
      sp = [num(x["speedup_vs_xla"]) for p in run.problems(suite)
            if (x := run.best(suite, p["problem"], [b])) is not None]
      g = geomean(sp)
      row.append(f"{_fmt_x(g)} ({len(sp)})" if g else "-")
    rows.append(row)
  return _table(["suite", *[f"{b} vs XLA" for b in bs]], rows)


def _ladder_refs(run: Run) -> list[dict]:
  """XLA's row of each ladder problem (where every variant ran), in run order."""
  return [r for r in run.gemm if r["backend"] == REF and r.get("ladder") == "1"]


def ladder_table(run: Run, backend: str) -> list[str]:
  """One backend's rungs (ladder order) on the ladder problems: TFLOP/s (speedup vs XLA)."""
  ladder = _ladder_refs(run)
  if not ladder or backend not in run.backend_variants:
    return []
  several_dtypes = len({r["dtype"] for r in ladder}) > 1
  header = ["variant", *[f"{r['problem']} ({r['m']}x{r['k']}x{r['n']}"
                         f"{', ' + r['dtype'] if several_dtypes else ''})" for r in ladder]]
  rows = []
  on_ladder = {r["variant"] for ref in ladder for r in run.kernel_rows(ref["suite"], ref["problem"])
               if r["backend"] == backend}
  for v in run.backend_variants[backend]:
    if v not in on_ladder:    # another op's variant (the moe suites'), or not run there
      continue
    row = [v]
    for ref in ladder:
      rr = [r for r in run.kernel_rows(ref["suite"], ref["problem"])
            if r["backend"] == backend and r["variant"] == v]
      row.append(_cell_t(rr[0]) if rr else "-")
    rows.append(row)
  rows.append(["XLA dot", *[_cell_t(r, False) for r in ladder]])
  return _table(header, rows)


def ladder_tables(run: Run) -> list[str]:
  if not _ladder_refs(run):
    return ["No ladder problems in this run."]
  out = []
  for b in run.backend_variants:
    out += [f"#### Ladder: backend `{b}` (TFLOP/s, speedup vs XLA)", "", *ladder_table(run, b), ""]
  return out


def _shape(p: dict) -> str:
  return f"{p['m']}x{p['k']}x{p['n']}" + (f" b{p['batch']}" if p["batch"] not in ("", "1") else "")


def suite_table(run: Run, suite: str) -> list[str]:
  bs = list(run.backend_variants)
  bw = run.copy_bw()
  rows = []
  for p in run.problems(suite):
    xla = _cell_t(p, False) if p["status"] == "ok" else p["status"]
    row = [p["problem"], _shape(p), p["layout"], xla,
           f"{num(p['pct_peak']):.0f}%" if num(p["pct_peak"]) else "-"]
    if run.has_auto:
      a = run.auto(suite, p["problem"])
      row.append("-" if a is None else f"{_cell_t(a)} {a.get('chosen') or ''}".strip())
    for b in bs:
      best = run.best(suite, p["problem"], [b])
      if best is None:
        st = sorted({r["status"] for r in run.kernel_rows(suite, p["problem"]) if r["backend"] == b})
        row.append("/".join(st) or "-")
      else:
        row.append(f"{_cell_t(best)} {best['variant']}")
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
  return _table(header, rows)


def training_table(run: Run) -> list[str]:
  """Each model's training steps (the dense model's, the moe suites' MoE model's)."""
  steps = [r for r in run.rows if r["kind"] == "train_step"]
  out = []
  for model in dict.fromkeys(r["problem"] for r in steps):
    out += [*([""] if out else []), *_training_table(
        [r for r in steps if r["problem"] == model])]
  return out


def _training_table(steps: list[dict]) -> list[str]:
  fp8 = any(_is_fp8_step(r) for r in steps)
  rows = []
  for r in steps:
    who = (("XLA lax.ragged_dot" if _is_moe_step(r) else "XLA (jnp)" if _is_epilogue_step(r)
            else "XLA dot (bf16)" if _is_fp8_step(r) else "XLA dot") if r["backend"] == REF
           else f"{r['backend']}/{r['variant']}")
    t = num(r["time_ms_median"])
    w = num(r.get("step_wall_ms"))
    rows.append([who, r["status"], f"{t:.3f}" if t else "-", f"{w:.3f}" if w else "-",
                 f"{num(r['tokens_per_s']):,.0f}" if num(r["tokens_per_s"]) else "-",
                 _fmt_x(num(r["speedup_vs_xla"])),
                 f"{num(r['loss_first']):.4f} -> {num(r['loss_last']):.4f}" if num(r["loss_first"]) else "-",
                 f"{num(r['loss_max_rel_diff']):.2e}" if num(r["loss_max_rel_diff"]) is not None else "-",
                 f"{num(r['grad_rel_err']):.2e}" if num(r["grad_rel_err"]) is not None else "-",
                 {"1": "yes", "0": "NO"}.get(r.get("agree", ""), "-")])
    if fp8:   # the FP8 model: the issue's number, the last step's loss against bf16's
      d = num(r.get("loss_last_rel_diff"))
      rows[-1].insert(-2, f"{d:.2e}" if d is not None else "-")
  head = steps[0]
  return [f"Model: {head['problem_note']} ({head['problem']}).", "",
          *_table(["GEMMs", "status", "step ms (median, run timer)", "step ms (wall, training loop)",
                   "tokens/s", "vs XLA",
                   "loss first -> last", "max loss rel diff vs XLA",
                   *(["last-step loss rel diff vs XLA"] if fp8 else []), "step-0 grad rel err",
                   "agree"], rows)]


SHARDED_NOTE = (
    "Each row: one program on a mesh of every device, jaxgemm's call against jnp's on the same "
    "inputs and shardings, timed interleaved by the wall clock (a program on several GPUs has no "
    "one kernel time). Collectives are read off each compiled HLO (per kind: ops, MB of results "
    "on one device); memory is what XLA plans per device (arguments + outputs + temporaries - "
    "aliased); TFLOP/s counts the program's GEMM FLOPs over its time, all devices together. "
    "`bench/sharded.py` says more.")


def _local_problems(text: str) -> str:
  """One or two local problems as they are; more (a training step's) as a count."""
  problems = [p for p in text.split("; ") if p]
  return "; ".join(problems) if len(problems) <= 2 else f"{len(problems)} (in the CSV)"


def sharded_table(run: Run) -> list[str]:
  """The sharded suite: each layout's and the training step's rows (bench/sharded.py)."""
  rows = [r for r in run.rows if r["kind"] in ("sharded_gemm", "sharded_step")]
  if not rows:
    return []
  out = []
  for problem in dict.fromkeys(r["problem"] for r in rows):
    mine = [r for r in rows if r["problem"] == problem]
    ref = next((r for r in mine if r["backend"] == REF), mine[0])
    body = []
    for r in [*(r for r in mine if r["backend"] != REF), ref]:
      t, mem = num(r.get("time_ms_median")), num(r.get("mem_per_device_gb"))
      losses = (f"{num(r['loss_first']):.4f} -> {num(r['loss_last']):.4f}"
                if num(r.get("loss_first")) else "")
      diff = num(r.get("loss_max_rel_diff"))
      body.append([
          "XLA (jnp)" if r["backend"] == REF else f"{r['backend']}/{r['variant']}",
          r["status"] + (f": {r['error'][:80]}" if r.get("error") else ""),
          f"{t:.3f}" if t else "-", _fmt_x(num(r.get("speedup_vs_xla"))),
          f"{num(r['tflops']):.0f}" if num(r.get("tflops")) else "-",
          f"{mem:.2f}" if mem is not None else "-", r.get("collectives") or "-",
          {"1": "same", "0": "differ"}.get(r.get("same_collectives", ""), ""),
          losses + (f" (max rel diff {diff:.1e})" if diff is not None else ""),
          _local_problems(r.get("local_problems", "")), r.get("custom_calls") or "-"])
    note = ref.get("problem_note", "")
    out += [f"**`{problem}`**: {note} (mesh {ref.get('mesh', '?')}).", "",
            *_table(["GEMMs", "status", "ms (median)", "vs XLA", "TFLOP/s", "GB/device",
                     "collectives", "vs XLA's", "loss first -> last",
                     "local problems", "custom calls"], body), ""]
  return out[:-1]


def problem_list(run: Run) -> list[str]:
  bad = [r for r in run.rows if r["status"] in ("fail", "error", "skipped")
         and r["kind"] in ("gemm", "train_step")]
  unsup = defaultdict(int)
  for r in run.rows:
    if r["status"] == "unsupported":
      unsup[(r["backend"], r["variant"], r["note"][:160])] += 1
  out = []
  if bad:
    out += _table(["suite", "problem", "backend/variant", "status", "note"],
                  [[r["suite"], r["problem"], f"{r['backend']}/{r['variant']}", r["status"],
                    r["note"].replace("|", "/")] for r in bad])
  if unsup:
    out += ["", "Unsupported (NotImplementedError; reported, not failures):", ""]
    out += _table(["backend/variant", "problems", "reason"],
                  [[f"{b}/{v}", n, note.replace("|", "/")] for (b, v, note), n in unsup.items()])
  return out or ["None."]



# ---------------------------------------------------------------- documents

def _values(run: Run, key: str) -> str:
  """A provenance field's distinct values over the rows (several for merged CSVs)."""
  vals = []
  for r in run.rows:
    v = r.get(key, "")
    if v and v not in vals:
      vals.append(v)
  return ", ".join(vals)


def _method(run: Run) -> list[str]:
  f = run.first
  bw = run.copy_bw()
  iters = sorted({r["iters"] for r in run.gemm if r["iters"]})
  timers = sorted({r["timer"] for r in run.rows if r["timer"]})
  return [
      f"- Timer: {', '.join(timers)}. "
      + ("CUPTI kernel time summed over the kernels of a call (no launch gaps or host overhead). "
         if any(t == "cupti" for t in timers) else
         "Wall clock around `block_until_ready` (includes dispatch overhead). ")
      + f"Warm-up excluded; median and p10/p90 of {', '.join(iters) or '?'} timed calls per row; "
        "compile time (`compile_s`) and first-run time (`first_run_s`, holds any autotuning) "
        "are separate columns.",
      f"- Inputs: {f.get('input_dist', '?')} (seed {f.get('seed', '?')}). Problems smaller "
      "than about twice the L2 rotate among several independent input sets (`rotate`, "
      "`working_set_mb` columns); one call's time is the set's total over `rotate`.",
      "- Correctness gate: every kernel's output is compared with XLA's on the same inputs "
      "before it is timed (relative Frobenius error against a per-dtype tolerance: bf16 1e-2, "
      "fp16 5e-3, fp32/TF32 5e-3, fp32-highest 1e-4); a wrong result is a `fail` row with no time.",
      "- Speedup = XLA's median time / the kernel's median time (>1: the kernel is faster). "
      "% peak against the datasheet dense peak (bf16/fp16 989, TF32 495, fp32 67 TFLOP/s) "
      "on H100/H200; GB/s counts each operand read once and the output written once"
      + (f", against a measured copy bandwidth of {bw:.0f} GB/s." if bw else "."),
  ]


MOE_TARGETS_NOTE = (
    "Each target against XLA's `lax.ragged_dot(_general)`, jax's example kernel "
    "(`ragged_dot_mgpu`, best of a config sweep, forward only), each backend's fastest "
    "correct variant and the default (`backend='auto'`); `met` where a jaxgemm kernel (not "
    "the `xla` backend) reaches it. TFLOP/s count 2 M K N; the roofline is the minimum bytes "
    "(lhs, the weights of the experts that have tokens, the output) over the time, against "
    "the run's measured copy bandwidth; a backward GEMM is compared with the same backend's "
    "forward.")
MOE_TABLE_NOTE = (
    "`G (with tokens)`: experts, and those with tokens (a Dirichlet(2) split of M, fixed "
    "seed). `call`: fwd `ragged_dot` (M,K)x(G,K,N); dgrad (M,N)x(G,K,N)^T -> (M,K); wgrad "
    "(M,K)^T x (M,N) -> (G,K,N). Cells: TFLOP/s (vs XLA's `lax.ragged_dot(_general)`; vs jax's "
    "example kernel, forward only).")


def report_markdown(run: Run, csv_name: str, plots=PLOTS) -> str:
  f = run.first
  lines = [f"# jaxgemm vs XLA's dot: run `{f.get('run_id', '?')}`", ""]
  if not run.on_gpu:
    lines += [f"> {NOT_GPU_BANNER}", ""]
  lines += [f"Generated from `{csv_name}` by `python -m bench report {csv_name}`.", ""]
  lines += ["## Provenance", ""]
  lines += _table(["field", "value"], [[k, _values(run, k)] for k in
                                       (*PROVENANCE, "dtype", "precision", "run_id")])
  lines += ["", "## Method", "", *_method(run), ""]
  lines += ["## Headline: best jaxgemm kernel, and jaxgemm's default, vs XLA, per suite", ""]
  if run.own_backends == ["xla"]:
    lines += ["Only the `xla` backend is registered: the 'best jaxgemm' column is XLA through "
              "jaxgemm's primitive (a sanity check, expected near 1.00x).", ""]
  lines += [*headline_table(run), "", "Per backend (its best variant per problem), geomean "
            "speedup vs XLA (number of problems):", "", *backend_suite_table(run), ""]
  lines += ["## Defaults (backend='auto') vs XLA", "", *defaults_section(run), ""]
  targets = targets_table(run)
  if targets:
    lines += ["## Kernel targets of the Triton and Pallas issues", "", *targets, ""]
  moe = moe_targets_table(run)
  if moe:
    lines += ["## Grouped GEMM targets (issue 26)", "", MOE_TARGETS_NOTE, "", *moe, ""]
  epi = epilogue_targets_table(run)
  if epi:
    lines += ["## GEMM epilogue targets (issue 27)", "", EPILOGUE_TARGETS_NOTE, "", *epi, ""]
  fp8 = fp8_targets_table(run)
  if fp8:
    lines += ["## FP8 GEMM targets (issue 28)", "", FP8_TARGETS_NOTE, "", *fp8, ""]
  lines += ["## Kernel ladders", "", *ladder_tables(run), ""]
  for suite in run.suites:
    if run.is_moe(suite):
      lines += [f"## Suite `{suite}` (grouped GEMM)", "", MOE_TABLE_NOTE, "",
                *moe_table(run, suite), ""]
      continue
    if run.is_epilogue(suite):
      lines += [f"## Suite `{suite}` (GEMM epilogues)", "", EPILOGUE_TABLE_NOTE, "",
                *epilogue_table(run, suite), ""]
      continue
    if run.is_fp8(suite):
      lines += [f"## Suite `{suite}` (FP8 GEMMs)", "", FP8_TABLE_NOTE, "",
                *fp8_table(run, suite), ""]
      continue
    lines += [f"## Suite `{suite}`", "", *suite_table(run, suite), ""]
  tt = training_table(run)
  if tt:
    lines += ["## Training step", "", *tt, ""]
  sh = sharded_table(run)
  if sh:
    lines += ["## Suite `sharded` (a mesh of every device)", "", SHARDED_NOTE, "", *sh, ""]
  lines += ["## Failures, errors, skips", "", *problem_list(run), ""]
  lines += ["## Plots", ""]
  for name, (caption, _) in PLOTS.items():
    if name not in plots:
      continue
    lines += [f"### {caption}", "", f"![{caption}](plots/{name})", ""]
  return "\n".join(lines)


def _run_line(run: Run) -> str:
  """Device, versions, dtypes, timer, commit and date of the run, in one line."""
  f = run.first
  dtypes = ", ".join(dict.fromkeys(r["dtype"] for r in run.gemm)) or f.get("dtype", "?")
  # The timer of the rows the tables show (a sharded run's are wall clock; its first
  # row, the copy bandwidth, is CUPTI's).
  shown = run.gemm or [r for r in run.rows if r["kind"].startswith("sharded_")] or [f]
  devices = f" x {f['device_count']}" if f.get("device_count", "1") not in ("", "1") else ""
  return (f"{f.get('device', '?')}{devices}, jax {f.get('jax', '?')}, triton {f.get('triton', '?')}, "
          f"{dtypes}, timer {shown[0].get('timer', '?')}, commit "
          f"`{f.get('git_commit', '?')[:10]}`, {f.get('date', '?')}.")


# The README is for users: its block has the headline, the defaults, the targets,
# the training step and two plots; the ladder tables go to docs/ladders.md.
README_PLOTS = ("tflops_vs_size.png", "training_loss.png")


def readme_tables(run: Run, plots_rel: str, plots=PLOTS) -> str:
  """The block the README shows: headline, defaults, targets, training, plots (from the CSV)."""
  lines = ["<!-- generated by `python -m bench report`; do not edit by hand -->", ""]
  if not run.on_gpu:
    lines += [f"> {NOT_GPU_BANNER}", ""]
  lines += [_run_line(run), ""]
  if run.gemm:
    lines += [*headline_table(run), ""]
  summary = defaults_summary(run)
  if summary:
    lines += ["#### Defaults (backend='auto') vs XLA", "", *summary, ""]
  targets = targets_table(run)
  if targets:
    lines += ["#### Kernel targets of the Triton and Pallas issues", "", *targets, ""]
  moe = moe_targets_table(run)
  if moe:
    lines += ["#### Grouped GEMM targets (issue 26)", "", MOE_TARGETS_NOTE, "", *moe, ""]
  for suite in run.suites:
    if run.is_moe(suite):
      lines += [f"#### Grouped GEMM: suite `{suite}`", "", MOE_TABLE_NOTE, "",
                *moe_table(run, suite), ""]
  epi = epilogue_targets_table(run)
  if epi:
    lines += ["#### GEMM epilogue targets (issue 27)", "", EPILOGUE_TARGETS_NOTE, "", *epi, ""]
  for suite in run.suites:
    if run.is_epilogue(suite):
      lines += [f"#### GEMM epilogues: suite `{suite}`", "", EPILOGUE_TABLE_NOTE, "",
                *epilogue_table(run, suite), ""]
  fp8 = fp8_targets_table(run)
  if fp8:
    lines += ["#### FP8 GEMM targets (issue 28)", "", FP8_TARGETS_NOTE, "", *fp8, ""]
  for suite in run.suites:
    if run.is_fp8(suite):
      lines += [f"#### FP8 GEMMs: suite `{suite}`", "", FP8_TABLE_NOTE, "",
                *fp8_table(run, suite), ""]
  tt = training_table(run)
  if tt:
    lines += ["#### Training step", "", *tt, ""]
  sh = sharded_table(run)
  if sh:
    lines += [f"#### Sharded: {run.first.get('device_count', '?')} x {run.first.get('device', '?')}",
              "", SHARDED_NOTE, "", *sh, ""]
  for name, (caption, _) in PLOTS.items():
    if name in plots and name in README_PLOTS:
      lines += [f"![{caption}]({plots_rel}/{name})", ""]
  return "\n".join(lines)


def _measured_at(refs: list[dict], main_run: str) -> str:
  """What each commit measured: 'bf16 at commit 546bc04; fp32 from run `x` at commit 5c66753'."""
  groups: dict[str, tuple[list, list]] = {}
  for r in refs:
    dtypes, runs = groups.setdefault(r.get("git_commit", "")[:7] or "?", ([], []))
    if r["dtype"] not in dtypes:
      dtypes.append(r["dtype"])
    if r.get("run_id", "") not in runs:
      runs.append(r.get("run_id", ""))
  parts = []
  for commit, (dtypes, runs) in groups.items():
    others = [x for x in runs if x != main_run]
    text = ", ".join(dtypes)
    if others:
      text += f" from run{'s' if len(others) > 1 else ''} " + ", ".join(f"`{x}`" for x in others)
    parts.append(f"{text} at commit {commit}")
  return "; ".join(parts)


def ladder_guide(run: Run, backend: str, source: str | None = None) -> str | None:
  """The ladder guide's block for one backend (docs/ladders.md): where the numbers come
  from, then `ladder_table`; None if the backend has no ladder rows. `source`: the CSV."""
  table = ladder_table(run, backend)
  if not table:
    return None
  f = run.first
  main = f.get("run_id", "?")
  lines = ["<!-- generated by `python -m bench report`; do not edit by hand -->", ""]
  if not run.on_gpu:
    lines += [f"> {NOT_GPU_BANNER}", ""]
  lines += [f"Run `{main}`" + (f", from `{source}`" if source else "")
            + f" ({_measured_at(_ladder_refs(run), main)}), {f.get('device', '?')}, timer "
            f"{f.get('timer', '?')}. TFLOP/s (speedup vs XLA):", "", *table]
  return "\n".join(lines)


# ---------------------------------------------------------------- generated blocks in documents

README_BEGIN = "<!-- bench:begin (python -m bench report writes this block) -->"
README_END = "<!-- bench:end -->"


def ladder_markers(backend: str) -> tuple[str, str]:
  return f"<!-- ladder:{backend}:begin -->", f"<!-- ladder:{backend}:end -->"


def replace_block(path, begin: str, end: str, body: str) -> bool:
  """Puts `body` between the markers `begin` and `end` of the file at `path`.

  Returns False, leaving the file as it was, where the file or either marker
  is missing: documents opt in by carrying the markers.
  """
  path = Path(path)
  if not path.is_file():
    return False
  text = path.read_text()
  if begin not in text or end not in text.split(begin, 1)[1]:
    return False
  head, rest = text.split(begin, 1)
  _, tail = rest.split(end, 1)
  path.write_text(f"{head}{begin}\n{body.strip()}\n{end}{tail}")
  return True


def update_readme(readme, tables: str) -> bool:
  """The README's bench block (README_TABLES.md's text); False where it has no markers."""
  return replace_block(readme, README_BEGIN, README_END, tables)


def update_ladders(doc, run: Run, source: str | None = None) -> list[str]:
  """The ladder guide's block of every backend of the run that has markers in `doc`."""
  done = []
  for b in run.backend_variants:
    body = ladder_guide(run, b, source)
    if body is not None and replace_block(doc, *ladder_markers(b), body):
      done.append(b)
  return done
