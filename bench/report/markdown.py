"""The pieces every table of the report is made of, whatever the op: Markdown tables,
cells and number formats, the default's statistics, and verdicts against a target.

Each op's tables (bench/ops/*.py) and the shared ones (`tables`) use these; this module
knows no op, and imports only `csvio`.

>>> table(["a", "b"], [[1, fmt_x(1.234)]])
['| a | b |', '|---|---|', '| 1 | 1.23x |']
"""

from __future__ import annotations

import math

from .csvio import REF, num

# jaxgemm's default against XLA (issue 6): the headline counts the problems where it is
# below this, and matmul's defaults section holds it to it.
DEFAULT_FLOOR = 0.97

NOT_GPU_BANNER = ("**NOT GPU TIMINGS: no GPU was found.** These numbers come from XLA:CPU "
                  "and the kernels' CPU interpreters on tiny problems; they check that the "
                  "benchmark and the kernels run and agree with XLA, and say nothing about "
                  "GPU performance.")
# A target's verdict on a run without a GPU: the targets are GPU numbers, which a CPU run
# (XLA:CPU and the interpreters) neither meets nor misses.
NOT_APPLICABLE = "n/a (not a GPU run)"


def geomean(xs):
  xs = [x for x in xs if x and x > 0]
  return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def table(header, rows) -> list[str]:
  out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return out


def fmt_t(x):
  """TFLOP/s: one decimal, or 3 significant digits below 1 (CPU runs)."""
  return "-" if x is None else (f"{x:.1f}" if x >= 1 else f"{x:.3g}")


def fmt_x(s):
  return "-" if s is None else (f"{s:.2f}x" if s >= 0.1 else f"{s:.2g}x")


def cell_t(r: dict | None, with_speedup=True) -> str:
  """'812.3 (1.02x)': a row's TFLOP/s and its speedup over XLA, or its status."""
  if r is None:
    return "-"
  if r["status"] != "ok":
    return r["status"]
  t = num(r["tflops"])
  s = num(r["speedup_vs_xla"])
  if with_speedup and s is not None:
    return f"{fmt_t(t)} ({fmt_x(s)})"
  return fmt_t(t)


def shape(p: dict) -> str:
  """'8192x4096x14336' (and ' b32' where batched): a row's M x K x N."""
  return f"{p['m']}x{p['k']}x{p['n']}" + (f" b{p['batch']}" if p["batch"] not in ("", "1") else "")


def us(r: dict) -> str:
  """A row's median time in microseconds, no decimals."""
  return f"{num(r['time_ms_median']) * 1e3:,.0f} us"


def base_suite(suite: str) -> str:
  """'square' of 'square (fp32)' (a merged run's label for its other dtypes, `view`)."""
  return suite.split(" (", 1)[0]


def fastest(rows) -> dict | None:
  """The correct row of least median time among `rows` (None entries allowed)."""
  ok = [r for r in rows if r and r["status"] == "ok" and num(r["time_ms_median"])]
  return min(ok, key=lambda r: num(r["time_ms_median"])) if ok else None


def pick(run, suite: str, problem: str, backend: str) -> dict | None:
  """The fastest correct row of `backend` on the problem: a backend's best variant, or
  a peer's (a program measured beside the kernels, such as jax's example kernel)."""
  return fastest(r for r in run.gemm if r["suite"] == suite and r["problem"] == problem
                 and r["backend"] == backend)


def backends_in(run, suites) -> list[str]:
  """jaxgemm's backends with rows on the problems of `suites`, in the run's order (the
  xla backend first)."""
  seen = {r["backend"] for s in suites for p in run.problems(s)
          for r in run.kernel_rows(s, p["problem"])}
  return [b for b in run.backend_variants if b in seen]


def auto_stats(run, suites) -> dict:
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


def verdict(run, met: bool) -> str:
  """A targets table's last cell: 'met' or '**missed**'; NOT_APPLICABLE off a GPU."""
  if not run.on_gpu:
    return NOT_APPLICABLE
  return "met" if met else "**missed**"


def step_vs_xla(r: dict, digits: int = 3) -> str:
  """'1.05x (XLA 12.350 / 11.760 ms)': a training step's speedup over XLA's and the two
  times it is made of, XLA's step timed beside it (interleaved: `xla_time_ms`) over its
  own. XLA's own row is timed alone, so its time is not the ratio's numerator."""
  s, xla, own = (num(r.get(k)) for k in ("speedup_vs_xla", "xla_time_ms", "time_ms_median"))
  if s is None:
    return "-"
  if xla is None or own is None:
    return fmt_x(s)
  return f"{fmt_x(s)} (XLA {xla:.{digits}f} / {own:.{digits}f} ms)"


def ref_step(steps: list[dict], model: str) -> dict | None:
  """XLA's training step row of `model` among `steps`."""
  return next((r for r in steps if r["backend"] == REF and r["problem"] == model), None)
