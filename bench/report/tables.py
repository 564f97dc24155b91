"""The Markdown a run's CSV makes: REPORT.md, README_TABLES.md (the results page's block),
the ladder guide's blocks, and the tables no one op owns: the headline, the backends per
suite, the kernel ladders, the training steps, the failures.

Each op's own tables and targets come from its entry (bench/ops/*.py, `entry.BenchOp`,
collected by `bench.suites`): this module places them and knows no op.

Generated blocks go into hand-written documents between markers (one
mechanism, `replace_block`): README.md's `<!-- bench:begin ... -->` block and
docs/ladders.md's `<!-- ladder:<backend>:begin -->` blocks.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..suites import ENTRIES, entry_of
from .csvio import PROVENANCE, REF, num
from .markdown import (DEFAULT_FLOOR, NOT_GPU_BANNER, auto_stats, cell_t, fmt_t, fmt_x,
                       geomean, step_vs_xla, table)
from .plots import PLOTS
from .view import Run


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
      label = f"{p['problem']} {fmt_x(s)} ({b['backend']}/{b['variant']})"
      if s > best_s:
        best_s, best_txt = s, label
      if s < worst_s:
        worst_s, worst_txt = s, label
    xla = [num(p["tflops"]) for p in probs if p["status"] == "ok"]
    g = geomean(speedups)
    row = [suite, len(probs), fmt_t(geomean(xla)), fmt_x(g), f"{wins}/{len(speedups)}",
           losses, bad, best_txt or "-", worst_txt or "-"]
    if run.has_auto:
      d = auto_stats(run, [suite])
      row += [fmt_x(d["geomean"]), f"{fmt_x(d['min'])} ({d['min_problem']})" if d["n"] else "-",
              f"{d['below']}/{d['n']}" if d["n"] else "-"]
    rows.append(row)
  header = ["suite", "problems", "XLA TFLOP/s (geomean)", "best jaxgemm vs XLA (geomean)",
            "jaxgemm faster", "slower", "failed/errored kernel runs", "best", "worst"]
  if run.has_auto:
    header += ["default (auto) vs XLA (geomean)", "default min",
               f"default below {DEFAULT_FLOOR:.2f}x"]
  return table(header, rows)



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
      row.append(f"{fmt_x(g)} ({len(sp)})" if g else "-")
    rows.append(row)
  return table(["suite", *[f"{b} vs XLA" for b in bs]], rows)


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
      row.append(cell_t(rr[0]) if rr else "-")
    rows.append(row)
  rows.append(["XLA dot", *[cell_t(r, False) for r in ladder]])
  return table(header, rows)


def ladder_tables(run: Run) -> list[str]:
  if not _ladder_refs(run):
    return ["No ladder problems in this run."]
  out = []
  for b in run.backend_variants:
    out += [f"#### Ladder: backend `{b}` (TFLOP/s, speedup vs XLA)", "", *ladder_table(run, b), ""]
  return out



def training_table(run: Run) -> list[str]:
  """Each model's training steps (the dense model's, the moe suites' MoE model's)."""
  steps = [r for r in run.rows if r["kind"] == "train_step"]
  out = []
  for model in dict.fromkeys(r["problem"] for r in steps):
    out += [*([""] if out else []), *_training_table(
        [r for r in steps if r["problem"] == model])]
  return out


def _training_table(steps: list[dict]) -> list[str]:
  """One model's steps; its op's entry names XLA's row and adds its own columns."""
  entry = entry_of(steps[0]["suite"])
  extra = entry.step_columns
  rows = []
  for r in steps:
    who = entry.train_ref_label if r["backend"] == REF else f"{r['backend']}/{r['variant']}"
    t = num(r["time_ms_median"])
    w = num(r.get("step_wall_ms"))
    rows.append([who, r["status"], f"{t:.3f}" if t else "-", f"{w:.3f}" if w else "-",
                 f"{num(r['tokens_per_s']):,.0f}" if num(r["tokens_per_s"]) else "-",
                 step_vs_xla(r),
                 f"{num(r['loss_first']):.4f} -> {num(r['loss_last']):.4f}" if num(r["loss_first"]) else "-",
                 f"{num(r['loss_max_rel_diff']):.2e}" if num(r["loss_max_rel_diff"]) is not None else "-",
                 *(cell(r) for _, cell in extra),
                 f"{num(r['grad_rel_err']):.2e}" if num(r["grad_rel_err"]) is not None else "-",
                 {"1": "yes", "0": "NO"}.get(r.get("agree", ""), "-")])
  head = steps[0]
  return [f"Model: {head['problem_note']} ({head['problem']}).", "",
          *table(["GEMMs", "status", "step ms (median, run timer)", "step ms (wall, training loop)",
                  "tokens/s", "vs XLA (XLA's step timed beside it / this step)",
                  "loss first -> last", "max loss rel diff vs XLA",
                  *(header for header, _ in extra), "step-0 grad rel err", "agree"], rows)]


def problem_list(run: Run) -> list[str]:
  bad = [r for r in run.rows if r["status"] in ("fail", "error", "skipped")
         and r["kind"] in ("gemm", "train_step")]
  unsup = defaultdict(int)
  for r in run.rows:
    if r["status"] == "unsupported":
      unsup[(r["backend"], r["variant"], r["note"][:160])] += 1
  out = []
  if bad:
    out += table(["suite", "problem", "backend/variant", "status", "note"],
                  [[r["suite"], r["problem"], f"{r['backend']}/{r['variant']}", r["status"],
                    r["note"].replace("|", "/")] for r in bad])
  if unsup:
    out += ["", "Unsupported (NotImplementedError; reported, not failures):", ""]
    out += table(["backend/variant", "problems", "reason"],
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



def _sections(run: Run, sections, readme: bool = False) -> list[str]:
  """The sections (`entry.Section`) with a body for this run, as REPORT.md ('## ') or
  README_TABLES.md ('#### ', only those with a readme_title) heads them."""
  out = []
  for sec in sections:
    if readme and sec.readme_title is None:
      continue
    body = sec.lines(run, readme)
    if body:
      out += [f"{'####' if readme else '##'} {sec.heading(run, readme)}", "", *body, ""]
  return out


def report_markdown(run: Run, csv_name: str, plots=PLOTS) -> str:
  f = run.first
  lines = [f"# jaxgemm vs XLA's dot: run `{f.get('run_id', '?')}`", ""]
  if not run.on_gpu:
    lines += [f"> {NOT_GPU_BANNER}", ""]
  lines += [f"Generated from `{csv_name}` by `python -m bench report {csv_name}`.", ""]
  lines += ["## Provenance", ""]
  lines += table(["field", "value"], [[k, _values(run, k)] for k in
                                       (*PROVENANCE, "dtype", "precision", "run_id")])
  lines += ["", "## Method", "", *_method(run), ""]
  lines += ["## Headline: best jaxgemm kernel, and jaxgemm's default, vs XLA, per suite", ""]
  if run.own_backends == ["xla"]:
    lines += ["Only the `xla` backend is registered: the 'best jaxgemm' column is XLA through "
              "jaxgemm's primitive (a sanity check, expected near 1.00x).", ""]
  lines += [*headline_table(run), "", "Per backend (its best variant per problem), geomean "
            "speedup vs XLA (number of problems):", "", *backend_suite_table(run), ""]
  for entry in ENTRIES:                     # each op's targets (matmul's: the defaults too)
    lines += _sections(run, entry.targets)
  lines += ["## Kernel ladders", "", *ladder_tables(run), ""]
  for suite in run.suites:
    entry = entry_of(suite)
    lines += [f"## {entry.suite_title.format(suite=suite)}", "", *entry.suite_table(run, suite), ""]
  tt = training_table(run)
  if tt:
    lines += ["## Training step", "", *tt, ""]
  for entry in ENTRIES:
    lines += _sections(run, entry.run_sections)
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
  for entry in ENTRIES:   # each op's targets, then its suites' tables where it shows them
    lines += _sections(run, entry.targets, readme=True)
    if entry.readme_suite_title is not None:
      for suite in run.suites:
        if entry_of(suite) is entry:
          lines += [f"#### {entry.readme_suite_title.format(suite=suite)}", "",
                    *entry.suite_table(run, suite), ""]
  tt = training_table(run)
  if tt:
    lines += ["#### Training step", "", *tt, ""]
  for entry in ENTRIES:
    lines += _sections(run, entry.run_sections, readme=True)
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
  rows = ladder_table(run, backend)
  if not rows:
    return None
  f = run.first
  main = f.get("run_id", "?")
  lines = ["<!-- generated by `python -m bench report`; do not edit by hand -->", ""]
  if not run.on_gpu:
    lines += [f"> {NOT_GPU_BANNER}", ""]
  lines += [f"Run `{main}`" + (f", from `{source}`" if source else "")
            + f" ({_measured_at(_ladder_refs(run), main)}), {f.get('device', '?')}, timer "
            f"{f.get('timer', '?')}. TFLOP/s (speedup vs XLA):", "", *rows]
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


def update_ladders(doc, run, source: str | None = None) -> list[str]:
  """The ladder guide's block of every backend of the run that has markers in `doc`."""
  done = []
  for b in run.backend_variants:
    body = ladder_guide(run, b, source)
    if body is not None and replace_block(doc, *ladder_markers(b), body):
      done.append(b)
  return done
