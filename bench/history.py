"""`python -m bench history`: every run's headline numbers, in one compact CSV.

    python -m bench history bench/results/<run>/results.csv      # into bench/results/history.csv
    python -m bench history a/results.csv b/results.csv --out other/history.csv

A run's folder (CSV with every column, report, plots, log) weighs more than a
megabyte, so bench/results/ keeps only the runs the docs cite and git history
keeps the others. The history keeps, from every run's CSV, one row per
measurement of XLA's dot, a kernel or the default (`auto`) on a problem (kind
`gemm`) and per training step (kind `train_step`; its time columns are the
step's), with the columns in HISTORY_COLUMNS: not the per-step losses or the
copy bandwidth. The CSVs' rows are merged in by run_id: a run already in the
history is replaced by the CSV's rows, any other run is kept. Runs are ordered
by date.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

from .report import csvio

HISTORY = csvio.RESULTS / "history.csv"
KINDS = ("gemm", "train_step")
HISTORY_COLUMNS = [
    "run_id", "date", "git_commit", "device", "suite", "kind", "problem", "dtype", "m", "k",
    "n", "layout", "backend", "variant", "status", "time_ms_median", "tflops", "xla_time_ms",
    "speedup_vs_xla", "step_wall_ms", "chosen",
]
COMMIT_CHARS = 10   # as the reports print it; enough for git to resolve


def history_rows(rows: list[dict]) -> list[dict]:
  """The headline rows of a results.csv's rows, in HISTORY_COLUMNS."""
  out = []
  for r in rows:
    if r.get("kind") not in KINDS:
      continue
    h = {c: r.get(c, "") for c in HISTORY_COLUMNS}
    h["git_commit"] = h["git_commit"][:COMMIT_CHARS]
    out.append(h)
  return out


def merge(history: list[dict], csv_paths) -> tuple[list[dict], list[str]]:
  """The history with the CSVs' runs merged in by run_id; and those run_ids."""
  incoming: dict[str, list[dict]] = {}
  for p in csv_paths:
    by_run: dict[str, list[dict]] = {}
    for h in history_rows(csvio.read_csv(p)):
      by_run.setdefault(h["run_id"], []).append(h)
    incoming.update(by_run)   # a later CSV's rows of a run replace an earlier one's
  rows = [h for h in history if h["run_id"] not in incoming]
  rows += [h for hs in incoming.values() for h in hs]
  first = {}
  for h in rows:
    first[h["run_id"]] = min(first.get(h["run_id"], h["date"]), h["date"])
  rows.sort(key=lambda h: (first[h["run_id"]], h["run_id"]))   # stable: CSV order within a run
  return rows, list(incoming)


def read_history(path) -> list[dict]:
  path = Path(path)
  if not path.exists():
    return []
  return [{c: r.get(c, "") for c in HISTORY_COLUMNS} for r in csvio.read_csv(path)]


def write_history(rows: list[dict], path) -> None:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=HISTORY_COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  os.replace(tmp, path)


def main(argv) -> int:
  ap = argparse.ArgumentParser(prog="python -m bench history", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("csv", nargs="+", help="a run's results.csv (several: merged in order)")
  ap.add_argument("--out", default=str(HISTORY),
                  help="the history to update (created if missing; default: %(default)s)")
  args = ap.parse_args(argv)
  old = read_history(args.out)
  rows, runs = merge(old, args.csv)
  write_history(rows, args.out)
  kept = len({h["run_id"] for h in old} - set(runs))
  print(f"history: {args.out}: {len({h['run_id'] for h in rows})} runs, {len(rows)} rows "
        f"({len(runs)} merged in: {', '.join(runs)}; {kept} kept)")
  return 0
