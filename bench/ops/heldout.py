"""The held-out suites' entry (issue 44): fresh random problems of every op, drawn at run
time from a logged seed, `auto` against XLA; their table and summary.

The problems are drawn and run in bench/heldout.py (`heldout.run_suite`): they are not a
fixed table (`Suite.problems` is None), since a fixed table is one that rules could have
been fitted to. Each problem's name starts with its group (`GROUPS`), which the summary
is per.
"""

from __future__ import annotations

from ..entry import BenchOp, Section, Suite
from ..report.csvio import AUTO, num
from ..report.markdown import DEFAULT_FLOOR, base_suite, fmt_x, geomean, table

HELDOUT, TINY = "heldout", "heldout-tiny"
SUITES = (HELDOUT, TINY)
# One group per op and mode: matmul and the fused epilogue also forward + backward.
GROUPS = ("matmul", "matmul+bwd", "fused_matmul", "fused_matmul+bwd", "glu", "ragged_dot",
          "scaled_matmul")
# Problems per group: (tiny suite, --quick) -> count.
PER_GROUP = {(False, False): 20, (False, True): 5, (True, False): 2, (True, True): 1}
OPS = ("matmul", "fused_matmul", "glu", "ragged_dot", "scaled_matmul")


def group_of(problem: str) -> str:
  """'fused_matmul+bwd' of 'fused_matmul+bwd.03.512x64x999.bf16.bias.gelu'."""
  return problem.split(".", 1)[0]


def _refs(run, suites=None) -> list[dict]:
  """XLA's reference row of every held-out problem of the run (of `suites`, else of
  every held-out suite: a run of several dtypes splits a suite by dtype, `view.Run`)."""
  names = [s for s in run.suites if base_suite(s) in SUITES and (suites is None or s in suites)]
  return [p for s in names for p in run.problems(s)]


def _stats(rows: list[dict]) -> dict:
  """geomean, worst (and its problem), count below the floor, of measured rows."""
  ok = [(num(r["speedup_vs_xla"]), r["problem"]) for r in rows
        if r["status"] == "ok" and num(r.get("speedup_vs_xla"))]
  worst = min(ok) if ok else (None, "")
  return {"n": len(ok), "geomean": geomean([s for s, _ in ok]), "worst": worst[0],
          "worst_problem": worst[1], "below": sum(s < DEFAULT_FLOOR for s, _ in ok),
          "bad": sum(r["status"] in ("fail", "error") for r in rows)}


def _ran_kernel(auto_row: dict) -> bool:
  """Whether `auto` ran a kernel of ours (its forward's, for a fwd+bwd problem), not XLA."""
  chosen = (auto_row.get("chosen") or "").removeprefix("forward: ")
  return bool(chosen) and not chosen.startswith("xla/")


def _backends(run, refs) -> list[str]:
  """The named backends (own choice) with rows on the held-out problems, in run order."""
  seen = {r["backend"] for p in refs for r in run.kernel_rows(p["suite"], p["problem"])}
  return [b for b in run.backend_variants if b in seen]


def summary_table(run) -> list[str]:
  """Per group: `auto` vs XLA (geomean, worst, count below 0.97x, failures, how often it
  ran a kernel of ours), and each named backend's own choice (geomean)."""
  refs = _refs(run)
  if not refs:
    return []
  bs = _backends(run, refs)
  rows = []
  groups = [g for g in GROUPS if any(group_of(p["problem"]) == g for p in refs)]
  groups += sorted({group_of(p["problem"]) for p in refs} - set(groups))
  for g in [*groups, "all"]:
    mine = [p for p in refs if g == "all" or group_of(p["problem"]) == g]
    autos = [a for p in mine if (a := run.auto(p["suite"], p["problem"])) is not None]
    d = _stats(autos)
    kernels = sum(1 for a in autos if _ran_kernel(a))
    skipped = sum(p["status"] == "skipped" for p in mine)
    row = [f"**{g}**" if g == "all" else g, f"{d['n']}/{len(mine)}", fmt_x(d["geomean"]),
           f"{fmt_x(d['worst'])} ({d['worst_problem']})" if d["n"] else "-",
           f"{d['below']}/{d['n']}" if d["n"] else "-", d["bad"], kernels, skipped]
    for b in bs:
      s = _stats([x for p in mine for x in run.kernel_rows(p["suite"], p["problem"])
                  if x["backend"] == b])
      row.append(f"{fmt_x(s['geomean'])} ({s['n']})" if s["n"] else "-")
    rows.append(row)
  return table(["group", "measured", "auto vs XLA (geomean)", "worst",
                f"below {DEFAULT_FLOOR:.2f}x", "failed/errored", "auto ran a kernel",
                "not run", *[f"{b} own choice (geomean, n)" for b in bs]], rows)


def _seeds(run, refs) -> str:
  return ", ".join(dict.fromkeys(p.get("seed", "?") for p in refs)) or "?"


def summary_section(run) -> list[str]:
  refs = _refs(run)
  if not refs:
    return []
  card = f"{run.first.get('device', '?')}" + (
      "" if run.on_gpu else " (XLA:CPU and the interpreters)")
  return [
          f"Card: **{card}**; seed {_seeds(run, refs)} (`python -m bench --suite "
          f"{base_suite(refs[0]['suite'])} --seed <seed>` draws the same problems). Each "
          "problem was drawn at run time, so no rule or table was fitted to it. Ratios: XLA's "
          "program of the same expression over `auto`'s (`jaxgemm` with nothing named), "
          "timed paired in the same run; a backend's column is its own choice (variant=None) "
          "where the run named it.", "", *summary_table(run)]


def suite_table(run, suite: str) -> list[str]:
  """Each problem: its group, shape, dtype, layout or mode, XLA's time, `auto`'s (vs XLA)
  and what it ran, and each named backend's own choice."""
  refs = _refs(run, [suite])
  bs = _backends(run, refs)
  rows = []
  for p in refs:
    a = run.auto(suite, p["problem"])
    g = f"G{p['groups']} " if p.get("groups") else ""
    b = f" b{p['batch']}" if p.get("batch") not in ("", "1", None) else ""
    xla = (f"{num(p['time_ms_median']):.4g} ms" if p["status"] == "ok" else p["status"])
    cell = "-" if a is None else (f"{fmt_x(num(a['speedup_vs_xla']))}" if a["status"] == "ok"
                                  else a["status"])
    if a is not None and a["status"] == "ok" and num(a["speedup_vs_xla"]) < DEFAULT_FLOOR:
      cell = f"**{cell}**"
    row = [p["problem"], group_of(p["problem"]), f"{g}{p['m']}x{p['k']}x{p['n']}{b}",
           p.get("scaling") or p["dtype"],
           (p.get("mode") or p["layout"]) + (f" ({p['problem_note']})" if p.get("problem_note")
                                             else ""), xla, cell,
           (a or {}).get("chosen") or "-"]
    for backend in bs:
      x = [r for r in run.kernel_rows(suite, p["problem"]) if r["backend"] == backend]
      row.append("/".join(fmt_x(num(r["speedup_vs_xla"])) if r["status"] == "ok"
                          else r["status"] for r in x) or "-")
    rows.append(row)
  return table(["problem", "group", "MxKxN", "dtype/scales", "layout/mode (routing)", "XLA",
                f"auto vs XLA (bold below {DEFAULT_FLOOR:.2f}x)", "auto chose",
                *[f"{b} own choice vs XLA" for b in bs]], rows)


def _console(run) -> list[str]:
  lines = summary_table(run)
  if not lines:
    return []
  refs = _refs(run)
  return ["", f"held-out problems (seed {_seeds(run, refs)}, {run.first.get('device', '?')}): "
              "`auto` vs XLA", *lines]


ENTRY = BenchOp(
    name="heldout", order=60, ops=OPS, family="heldout",
    suites=(
        Suite(HELDOUT, f"{PER_GROUP[(False, False)]} fresh random problems of every op "
              f"({', '.join(GROUPS)}), drawn at run time from a logged seed (--seed replays; "
              "default: the clock's), `auto` vs XLA's program of the same expression (issue "
              "44)", None, runner="heldout",
              list_note="problems drawn at run time: see bench/heldout.py"),
        Suite(TINY, "the heldout suite's CPU analogue: a handful of tiny problems of every op",
              None, runner="heldout", list_note="problems drawn at run time: see bench/heldout.py"),
    ),
    # Within a lent GPU's 10 minutes; what is left is recorded as not run, with the
    # command that runs it (the same seed, --only).
    gpu_time_budget_s=480.0,
    suite_table=suite_table, suite_title="Suite `{suite}` (held-out problems)",
    targets=(Section("Held-out problems: `auto` vs XLA (issue 44)", summary_section,
                     readme_title="Held-out problems: `auto` vs XLA"),),
    console=_console,
)
