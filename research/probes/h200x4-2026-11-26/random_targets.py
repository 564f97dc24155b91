"""Issue 23's targets on the H200 from today's two random-suite runs.

    .venv/bin/python research/probes/h200x4-2026-11-26/random_targets.py

r00-r11 and all of random-holdout: bench/results/h200-random-2026-11-26/results.csv (one
nvidia-h200 call, commit 5cf9bde). r12-r39: that CSV did not come back from the 4-GPU call
(the device tool returns at most 8 files), so they are read off the bench's own per-problem
lines in run1/random.log ("<problem> <shape> xla_dot T | auto/default T (x) | ... |
triton/<v> T (x) | pallas/<v> T (x)": each backend's pick, its ratio to XLA's dot timed
beside it). r40-r47 did not run (time budget). Both runs: JAXGEMM_TABLES=off, --variants best.
"""
import csv
import math
import pathlib
import re

HERE = pathlib.Path(__file__).parent
CSV = HERE.parents[2] / "bench/results/h200-random-2026-11-26/results.csv"
LINE = re.compile(r"^\s+(r\d\d\.\S+)\s+\S+ xla_dot .*$")
CELL = re.compile(r"(auto|triton|pallas)/\S+ [\d.e+-]+ \(([\d.]+)x\)")


def geomean(xs):
  return math.exp(sum(map(math.log, xs)) / len(xs))


def from_csv():
  by = {}
  for r in csv.DictReader(open(CSV)):
    if r["kind"] == "gemm" and r["status"] == "ok" and r["speedup_vs_xla"]:
      by.setdefault((r["suite"], r["problem"]), {})[r["backend"]] = float(r["speedup_vs_xla"])
  return by


def from_log():
  by = {}
  for line in (HERE / "run1/random.log").read_text().splitlines():
    m = LINE.match(line)
    if m:
      by[("random", m.group(1))] = {b: float(x) for b, x in CELL.findall(line)}
  return by


def main():
  by = {**from_csv(), **from_log()}
  print("| suite | problems | best kernel geomean | best kernel worst | auto geomean | auto worst |")
  print("|---|---|---|---|---|---|")
  for suite in ("random", "random-holdout"):
    probs = {p: d for (s, p), d in by.items() if s == suite}
    best = {p: max(d[b] for b in ("triton", "pallas") if b in d) for p, d in probs.items()}
    auto = {p: d["auto"] for p, d in probs.items() if "auto" in d}
    wb, wa = min(best, key=best.get), min(auto, key=auto.get)
    print(f"| {suite} | {len(probs)} | {geomean(best.values()):.3f}x | {best[wb]:.2f}x ({wb}) "
          f"| {geomean(auto.values()):.3f}x | {auto[wa]:.2f}x ({wa}) |")
    low = sorted((x, p) for p, x in auto.items() if x < 0.98)
    print(f"|  | auto below 0.98x: {', '.join(f'{p} {x:.2f}x' for x, p in low) or 'none'} |||||")


if __name__ == "__main__":
  main()
