"""Issue 23's targets, computed from a benchmark CSV of the random suites.

    .venv/bin/python research/probes/heuristic-2026-11-25/targets.py \
        bench/results/h200-random-2026-11-25/results.csv

Per suite: the best named-backend kernel (each backend's own choice, variant=None,
with no tuning record) against XLA, geomean and worst; jaxgemm's default
(backend="auto"); and for problems with M <= 16 the bandwidth each reaches
against the device-to-device copy measured in the same run (the roofline).
"""
import collections
import csv
import math
import sys


def geomean(xs):
  return math.exp(sum(map(math.log, xs)) / len(xs))


def main(path):
  rows = list(csv.DictReader(open(path)))
  copy = max(float(r["gbps"]) for r in rows if r["kind"] == "copy_bw" and r["gbps"])
  by = collections.defaultdict(dict)
  for r in rows:
    if r["kind"] == "gemm" and r["status"] == "ok" and r["speedup_vs_xla"]:
      by[(r["suite"], r["problem"])][r["backend"]] = r
  print(f"copy bandwidth (roofline): {copy:,.0f} GB/s\n")
  print("| suite | problems | best kernel geomean | best kernel worst | auto geomean | auto worst |")
  print("|---|---|---|---|---|---|")
  for suite in sorted({s for s, _ in by}):
    probs = {p: d for (s, p), d in by.items() if s == suite}
    best = {p: max(float(d[b]["speedup_vs_xla"]) for b in ("triton", "pallas") if b in d)
            for p, d in probs.items() if "triton" in d or "pallas" in d}
    auto = {p: float(d["auto"]["speedup_vs_xla"]) for p, d in probs.items() if "auto" in d}
    wb, wa = min(best, key=best.get), min(auto, key=auto.get)
    print(f"| {suite} | {len(probs)} | {geomean(best.values()):.3f}x | {best[wb]:.2f}x ({wb}) "
          f"| {geomean(auto.values()):.3f}x | {auto[wa]:.2f}x ({wa}) |")
  print("\nM <= 16: GB/s and fraction of the copy bandwidth")
  print("| problem | MB moved | XLA | best kernel | auto |")
  print("|---|---|---|---|---|")
  for (suite, p), d in sorted(by.items()):
    ref = next(iter(d.values()))
    if int(ref["m"]) > 16:
      continue
    xla_gbps = float(ref["min_bytes"]) / (float(ref["xla_time_ms"]) * 1e-3) / 1e9
    kern = max((d[b] for b in ("triton", "pallas") if b in d), key=lambda r: float(r["gbps"]))
    auto = d.get("auto")
    cell = lambda g: f"{g:,.0f} ({g / copy:.2f})"
    print(f"| {suite}/{p} | {float(ref['min_bytes']) / 1e6:.2f} | {cell(xla_gbps)} | "
          f"{cell(float(kern['gbps']))} {kern['backend']}/{kern['variant']} | "
          f"{cell(float(auto['gbps'])) if auto else '-'} |")


if __name__ == "__main__":
  main(sys.argv[1])
