"""`python -m bench [run]`: every registered kernel, and jaxgemm's default, against XLA's dot.

Runs the named suites (see `python -m bench --list`), writes
bench/results/<run>/results.csv as it goes, then the report and plots
(`report.generate`). Without a GPU: a tiny suite on XLA:CPU and the
interpreters, labelled as not GPU timings.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import importlib
import re
import time
from collections import Counter
from pathlib import Path

from . import suites as S
from .problems import DTYPES
from .report.csvio import RESULTS


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(
      prog="python -m bench",
      description="Run every registered jaxgemm backend and variant, and jaxgemm's default "
                  "(backend='auto'), against XLA's dot on named problem suites; write a CSV, "
                  "a Markdown report and plots. Other subcommands: `python -m bench report "
                  "CSV...` (the report again, README.md and docs/ladders.md), `python -m bench "
                  "tune` (the shipped table), `python -m bench history CSV...` (the runs' "
                  "headline numbers in bench/results/history.csv); each takes --help.",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="suites:\n" + "\n".join(f"  {k:<10} {v}" for k, v in S.SUITE_HELP.items()))
  ap.add_argument("--suite", default="default",
                  help="comma-separated suite names (see below); default: %(default)s")
  ap.add_argument("--dtype", default="bf16", choices=list(DTYPES),
                  help="operand dtype: bf16 (default), fp16, fp32 (default precision: "
                       "TF32 on GPU), fp32-highest (precision=HIGHEST)")
  ap.add_argument("--backends", default=None,
                  help="comma-separated backends; 'auto' is jaxgemm's default, "
                       "jaxgemm.matmul(a, b) with no backend, variant or config (default: "
                       "auto and every registered backend)")
  ap.add_argument("--variants", default="ladder",
                  help="'ladder' (default: every variant on the ladder problems, each "
                       "backend's best elsewhere), 'best', 'all', or comma-separated names")
  ap.add_argument("--iters", type=int, default=None,
                  help="timed calls per measurement (>= 20 on a GPU; default 20 on a GPU, "
                       "3 on a CPU)")
  ap.add_argument("--out", default=str(RESULTS), help="results folder (default: bench/results/)")
  ap.add_argument("--run-name", default=None,
                  help="subfolder of --out (default: <device>-<dtype>-<date>; 'cpu-...' "
                       "without a GPU)")
  ap.add_argument("--default-only", action="store_true",
                  help="run only the default subset of each named suite")
  ap.add_argument("--quick", action="store_true",
                  help="a few problems per suite and a short training run")
  ap.add_argument("--list", action="store_true",
                  help="list suites, problems, backends and variants, then exit")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--training-steps", type=int, default=None,
                  help="training steps (default: 50 on a GPU, 100 for the fp8 suite's step, 15 "
                       "with --quick, a few on a CPU)")
  ap.add_argument("--max-rotate", type=int, default=32,
                  help="most input sets a small problem rotates among (default 32)")
  ap.add_argument("--cpu-max-gflop", type=float, default=0.05,
                  help="without a GPU, skip problems above this many GFLOP")
  ap.add_argument("--cpu-call-budget", type=float, default=1.0,
                  help="without a GPU, do not time interpreted kernels slower than this "
                       "many seconds per call (and skip them afterwards)")
  ap.add_argument("--only", default="",
                  help="comma-separated globs of problem names to run (others are left out), "
                       "e.g. 'r4*,r39*' to finish a suite another run stopped in")
  ap.add_argument("--exclude", default="",
                  help="comma-separated 'backend/variant[@problem]' globs to skip, e.g. "
                       "'pallas/clusters,triton/naive@sq16384' (recorded as skipped)")
  ap.add_argument("--kernel-timeout", type=float, default=None,
                  help="seconds one kernel (compile, check, timing) may take before the run "
                       "is ended as hung, keeping the CSV and report (default: 180 on a GPU, "
                       "60 on a CPU; 0: no limit)")
  ap.add_argument("--time-budget", type=float, default=0,
                  help="seconds after which no new problem (or training run) starts; the "
                       "rest are recorded as skipped and the report is written (0: none)")
  ap.add_argument("--verbose", action="store_true", help="print tracebacks of kernel errors")
  ap.add_argument("--wallclock", action="store_true",
                  help="time with the wall clock even on a GPU (labelled as such)")
  ap.add_argument("--strict", action="store_true",
                  help="exit with status 1 if any kernel failed or errored")
  return ap


def _problems(name: str, *, default_only: bool, quick: bool):
  """The problems of suite `name` to run (None: a suite that is not a table of problems)."""
  if S.suite(name).problems is None:
    return None
  return S.select(name, default_only=default_only, quick=quick)


def _suites(args, on_gpu: bool) -> list[tuple[str, list]]:
  """[(suite, problems)]; a suite that is not a table of problems has None."""
  names = [s.strip() for s in args.suite.split(",") if s.strip()]
  out = []
  for name in names:
    if name == "default":
      for s in (S.GPU_DEFAULT_SUITES if on_gpu else S.CPU_DEFAULT_SUITES):
        out.append((s, _problems(s, default_only=True, quick=args.quick)))
    elif name in S.ALL_SUITES:
      out.append((name, _problems(name, default_only=args.default_only, quick=args.quick)))
    else:
      raise SystemExit(f"unknown suite {name!r}; valid: {[*S.ALL_SUITES, 'default']}")
  seen, uniq = set(), []
  only = [g.strip() for g in args.only.split(",") if g.strip()]
  for s, probs in out:
    if s not in seen:
      seen.add(s)
      if only and probs is not None:
        probs = [p for p in probs if any(fnmatch.fnmatch(p.name, g) for g in only)]
      uniq.append((s, probs))
  return uniq


def _list(args, on_gpu, platform):
  import jaxgemm  # noqa: PLC0415

  from .runner import AUTO, AUTO_VARIANT  # noqa: PLC0415
  print(f"platform: {platform}" + ("" if on_gpu else "  (no GPU: the default is the tiny "
                                                     "CPU suite + a small training run)"))
  print("backends and variants (ladder order, best last):")
  print(f"  {AUTO}: {AUTO_VARIANT}  (jaxgemm's default, jaxgemm.matmul(a, b): per problem the "
        "tuned kernel of the autotune cache or shipped table, else XLA's dot)")
  for op in sorted(set(S.SUITE_OP.values())):
    for b in jaxgemm.backends(op):
      print(f"  {op} {b}: {', '.join(jaxgemm.variants(b, op))}")
  print(f"dtypes: {', '.join(DTYPES)}")
  print("suites:")
  for name, help_ in S.SUITE_HELP.items():
    op = f"[{S.SUITE_OP[name]}]" if name in S.SUITE_OP else ""
    print(f"  {name:<10} {op:<9} {help_}")
  print()
  for suite, probs in _suites(args, on_gpu):
    note = S.suite(suite).list_note
    if probs is None:
      print(f"[{suite}] {note}")
      continue
    print(f"[{suite}] {len(probs)} problems" + (f", {note}" if note else ""))
    for p in probs:
      flags = "".join(f for f, on in (("D", p.default), ("Q", p.quick), ("L", p.ladder)) if on)
      print(f"  {p.name:<32} {p.size_label():>22} {p.layout}  {flags:<3} {p.note}")
  print("\nflags: D = in the default set, Q = in --quick, L = ladder problem (every variant)")


def _slug(s: str) -> str:
  return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def main(argv) -> int:
  args = _parser().parse_args(argv)

  import jax  # noqa: PLC0415

  from jaxgemm.timing import Timer, platform_of  # noqa: PLC0415

  platform = platform_of()
  on_gpu = platform == "gpu"
  if args.list:
    _list(args, on_gpu, platform)
    return 0

  import jaxgemm  # noqa: PLC0415

  from . import history, runner  # noqa: PLC0415
  from .report import csvio, tables  # noqa: PLC0415
  from .report.make import generate  # noqa: PLC0415

  if args.iters is None:
    args.iters = 20 if on_gpu else 3
  if args.kernel_timeout is None:
    args.kernel_timeout = 180.0 if on_gpu else 60.0
  if on_gpu and args.iters < 20:
    raise SystemExit("--iters must be at least 20 on a GPU (median and spread of >= 20 runs)")
  if args.iters < 1:
    raise SystemExit("--iters must be positive")
  suites = _suites(args, on_gpu)
  # Each suite runs the backends of its op (matmul's, or ragged_dot's for the moe suites);
  # a named backend that has no kernels for a suite's op gets `unsupported` rows there.
  ops = list(dict.fromkeys(S.SUITE_OP[s] for s, _ in suites)) or ["matmul"]
  registered = list(dict.fromkeys(b for op in (*ops, *jaxgemm.registry.ops())
                                  for b in jaxgemm.backends(op)))
  if args.backends:
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in (runner.AUTO, *registered)]
    if unknown:
      raise SystemExit(f"unknown or unusable backend(s) {unknown}; valid here: "
                       f"{[runner.AUTO, *registered]}")
  else:
    backends = [runner.AUTO, *registered]

  def backends_of(suite: str) -> list[str]:
    if args.backends:
      return backends
    ops = S.entry_of(suite).ops
    return [runner.AUTO, *dict.fromkeys(b for op in ops for b in jaxgemm.backends(op))]

  def variants_of(b: str) -> list[str]:
    return [v for op in jaxgemm.registry.ops() if b in jaxgemm.backends(op)
            for v in jaxgemm.variants(b, op)]

  variants = args.variants
  if variants not in ("ladder", "best", "all"):
    variants = [v.strip() for v in variants.split(",") if v.strip()]
    known = {v for b in backends if b != runner.AUTO for v in variants_of(b)}
    known |= {v for e in S.ENTRIES for v in e.extra_variants}   # training steps' recipes
    unknown = [v for v in variants if v not in known]
    if unknown:
      raise SystemExit(f"unknown variant(s) {unknown}; variants of {backends}: {sorted(known)}")

  entries = list(dict.fromkeys(S.entry_of(s) for s, _ in suites))
  if on_gpu and not args.time_budget and len(entries) == 1 and entries[0].gpu_time_budget_s:
    args.time_budget = entries[0].gpu_time_budget_s
    print(f"time budget: {args.time_budget:g} s (the {entries[0].family} suites' default on a "
          "GPU, to fit a 10-minute command; --time-budget to change)")
  if on_gpu:
    runner.setup_triton_cache()
  prov = csvio.provenance()
  device = prov["device"]
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  run_name = args.run_name or (f"{_slug(device)}-{args.dtype}-{stamp}" if on_gpu
                               else f"cpu-{args.dtype}-{stamp}")
  if not on_gpu and not run_name.startswith("cpu-"):
    print("note: CPU run names should start with 'cpu-' (git ignores bench/results/cpu-*)")
  out_dir = Path(args.out) / run_name
  csv_path = out_dir / "results.csv"

  timer = Timer(platform, force_wall=args.wallclock)
  bar = "=" * 78
  print(bar)
  if not on_gpu:
    print("NO GPU FOUND: these are NOT GPU timings.")
    print(f"Running a tiny suite on XLA:CPU and the kernels' interpreters ({platform}).")
    print(f"Interpreted kernel calls slower than {args.cpu_call_budget:g} s are checked but not "
          "timed, and that variant is skipped afterwards; problems above "
          f"{args.cpu_max_gflop:g} GFLOP are skipped.")
    print(bar)
  print(f"jaxgemm benchmark: {device} ({platform}), dtype {args.dtype}, timer {timer.label}")
  print(f"jax {prov['jax']}, jaxlib {prov['jaxlib']}, triton {prov['triton']}, "
        f"commit {prov['git_commit'][:10]}{' (dirty)' if prov['git_dirty'] else ''}")
  labels = [f"{b} [{runner.AUTO_VARIANT}]" if b == runner.AUTO
            else f"{b} [{len(variants_of(b))} variants]" for b in backends]
  print(f"backends: {', '.join(labels)}; "
        f"variants: {variants if isinstance(variants, str) else ','.join(variants)}; "
        f"iters {args.iters}")
  print(f"suites: {', '.join(s + ('' if p is None else f' ({len(p)})') for s, p in suites)}")
  print(f"output: {out_dir}")
  print(bar)

  writer = csvio.CsvWriter(csv_path)
  ctx = runner.Context(platform=platform, device_kind=device, timer=timer, iters=args.iters,
                       dtype_name=args.dtype, provenance=prov, emit=writer, seed=args.seed,
                       max_rotate=args.max_rotate, cpu_call_budget_s=args.cpu_call_budget,
                       cpu_max_gflop=args.cpu_max_gflop, run_id=run_name,
                       exclude=tuple(x.strip() for x in args.exclude.split(",") if x.strip()),
                       kernel_timeout_s=args.kernel_timeout, verbose=args.verbose,
                       time_budget_s=args.time_budget)

  def on_hang():   # the watchdog's last act: keep the CSV and write the report
    writer.close()
    made = generate(csv_path)
    print(f"CSV: {csv_path}\nreport: {made['report']}")

  ctx.on_hang = on_hang
  options = runner.SuiteOptions(
      quick=args.quick, only=tuple(g.strip() for g in args.only.split(",") if g.strip()),
      training_steps=args.training_steps, out_dir=out_dir)
  t_start = time.perf_counter()
  try:
    try:
      bw, how = runner.measure_copy_bandwidth(timer, platform, args.iters)
      ctx.copy_bw_gbps = bw
      row = runner.base_row(ctx, "copy", "copy_bw", "xla", "negate")
      row.update(status="ok", gbps=bw, note=how, timer=timer.label, iters=args.iters)
      writer(row)
      print(f"copy bandwidth: {bw:,.0f} GB/s ({how})")
    except Exception as e:  # noqa: BLE001
      print(f"copy bandwidth not measured: {runner.short_error(e)}")
    for suite, probs in suites:
      t0 = time.perf_counter()
      print(f"\n== suite {suite} " + ("" if probs is None else f"({len(probs)} problems)"))
      runner_module = importlib.import_module(f".{S.suite(suite).runner}", __package__)
      runner_module.run_suite(ctx, suite, probs, backends_of(suite), variants, options)
      print(f"== suite {suite} done in {time.perf_counter() - t0:.1f} s")
  finally:
    writer.close()
  elapsed = time.perf_counter() - t_start

  made = generate(csv_path)
  rows = csvio.read_csv(csv_path)
  counts = Counter(r["status"] for r in rows if r["kind"] in ("gemm", "train_step")
                   and r["backend"] not in (runner.REF, *S.PEERS))
  run = made["run"]
  print("\n" + bar)
  if not on_gpu:
    print("NO GPU FOUND: these are NOT GPU timings (XLA:CPU and interpreters).")
  print(f"done in {elapsed:.1f} s; kernel rows: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
  print("\n".join(tables.headline_table(run)))
  for entry in S.ENTRIES:
    lines = entry.console(run) if entry.console else []
    if lines:
      print("\n".join(lines))
  tt = tables.training_table(run)
  if tt:
    print("\n".join(tt[2:]))
  print(f"\nCSV:           {csv_path}\nreport:        {made['report']}\n"
        f"README tables: {made['readme_tables']}\nplots:         {out_dir / 'plots'}")
  if on_gpu:
    print(f"history:       python -m bench history {csv_path}   (adds the run to "
          f"{history.HISTORY.relative_to(csvio.repo_root())})")
  else:
    print("(CPU runs are git-ignored: bench/results/cpu-*)")
  print(bar)
  if args.strict and (counts.get("fail") or counts.get("error")):
    return 1
  return 0
