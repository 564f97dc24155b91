"""REPORT.md, README_TABLES.md and plots/ made from a run's CSV (`generate`), the project's
documents' generated blocks (`update_docs`), and the `python -m bench report` command
(`main`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import csvio, plots, tables
from .view import Run

# The run's tables go to the results page; the README links to it.
RESULTS = csvio.repo_root() / "docs" / "results.md"
LADDERS = csvio.repo_root() / "docs" / "ladders.md"


def generate(csv_path, out_dir=None) -> dict:
  """REPORT.md, README_TABLES.md and plots/ from a CSV; returns their paths, the CSV's
  and the Run."""
  csv_path = Path(csv_path)
  out_dir = Path(out_dir) if out_dir else csv_path.parent
  out_dir.mkdir(parents=True, exist_ok=True)
  run = Run(csvio.read_csv(csv_path))
  plots_dir = out_dir / "plots"
  plots_dir.mkdir(exist_ok=True)
  made = {}
  for name, (_, fn) in plots.PLOTS.items():
    p = plots_dir / name
    try:
      ok = fn(run, p)
    except Exception as e:  # noqa: BLE001 (a plot must not lose the report)
      print(f"  plot {name} failed: {type(e).__name__}: {e}")
      ok = False
    if ok:
      made[name] = p
    elif p.exists():
      p.unlink()
  try:
    csv_rel = os.path.relpath(csv_path, out_dir)
  except ValueError:
    csv_rel = str(csv_path)
  report = out_dir / "REPORT.md"
  report.write_text(tables.report_markdown(run, csv_rel, made))
  try:
    plots_rel = Path(os.path.relpath(plots_dir.resolve(), csvio.repo_root())).as_posix()
    if plots_rel.startswith(".."):
      plots_rel = "plots"
  except ValueError:
    plots_rel = "plots"
  readme_tables = out_dir / "README_TABLES.md"
  readme_tables.write_text(tables.readme_tables(run, plots_rel, made))
  return {"report": report, "readme_tables": readme_tables, "plots": made, "run": run,
          "csv": csv_path}


def _shown(path: Path) -> str:
  """A path as the docs cite it: from the repository root where it is inside."""
  try:
    rel = os.path.relpath(Path(path).resolve(), csvio.repo_root())
  except ValueError:
    return str(path)
  return str(path) if rel.startswith("..") else Path(rel).as_posix()


def _links_from(doc, made: dict) -> str:
  """README_TABLES.md's text with its plot links (written from the repository root)
  made relative to `doc`'s folder, where the plots lie inside the repository."""
  text = made["readme_tables"].read_text()
  root, folder = csvio.repo_root(), Path(doc).resolve().parent
  for plot in made["plots"].values():
    from_root = _shown(plot)
    if not Path(from_root).is_absolute():
      text = text.replace(f"]({from_root})",
                          f"]({Path(os.path.relpath(root / from_root, folder)).as_posix()})")
  return text


def update_docs(made: dict, readme=None, ladders=None) -> list[str]:
  """Puts a generated run's blocks into the README (`readme`) and the ladder guide
  (`ladders`) where those files carry the markers; returns what was updated."""
  done = []
  if readme and tables.update_readme(readme, _links_from(readme, made)):
    done.append(str(readme))
  if ladders:
    backends = tables.update_ladders(ladders, made["run"], _shown(made["csv"]))
    if backends:
      done.append(f"{ladders} ({', '.join(backends)})")
  return done


def main(argv) -> int:
  ap = argparse.ArgumentParser(
      prog="python -m bench report",
      description="Regenerate REPORT.md, README_TABLES.md and plots/ from benchmark CSVs. "
                  "Several CSVs (e.g. suites run as separate commands) are merged into "
                  "<out>/results.csv first. For a GPU run, also put the tables into "
                  "docs/results.md (between its bench markers) and the ladder tables into "
                  "docs/ladders.md (between its ladder:<backend> markers), where the files "
                  "and markers exist.")
  ap.add_argument("csv", nargs="+")
  ap.add_argument("--out", default=None,
                  help="folder for the outputs (default: the CSV's; required for several)")
  ap.add_argument("--readme", default=None, metavar="docs/results.md",
                  help="the page whose bench block to replace (default: the repository's "
                       "docs/results.md, for a GPU run)")
  ap.add_argument("--ladders", default=None, metavar="docs/ladders.md",
                  help="the ladder guide whose ladder blocks to replace (default: the "
                       "repository's docs/ladders.md, for a GPU run)")
  ap.add_argument("--no-docs", action="store_true",
                  help="write only the run's own outputs, no README or ladder guide")
  args = ap.parse_args(argv)
  csv_path = args.csv[0]
  if len(args.csv) > 1:
    if not args.out:
      raise SystemExit("several CSVs: name the merged run's folder with --out")
    csv_path = csvio.merge_csvs(args.csv, Path(args.out) / "results.csv")
    print(f"merged {len(args.csv)} CSVs into {csv_path}")
  made = generate(csv_path, args.out)
  print(f"report:        {made['report']}")
  print(f"README tables: {made['readme_tables']}")
  for p in made["plots"].values():
    print(f"plot:          {p}")
  if args.no_docs:
    return 0
  # Not-GPU timings never go into the project's documents unless named.
  on_gpu = made["run"].on_gpu
  readme = args.readme or (RESULTS if on_gpu else None)
  ladders = args.ladders or (LADDERS if on_gpu else None)
  done = update_docs(made, readme, ladders)
  for doc in done:
    print(f"updated:       {doc}")
  for named in (args.readme, args.ladders):
    if named and not any(d.startswith(str(named)) for d in done):
      print(f"not updated:   {named} (no such file, or no markers for this run)")
  if not on_gpu and not (args.readme or args.ladders):
    print("(not GPU timings: docs/results.md and docs/ladders.md left alone)")
  return 0
