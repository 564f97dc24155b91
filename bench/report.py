"""The run's outputs: provenance, the long-format CSV, and everything made from it.

Everything after the CSV -- REPORT.md, README_TABLES.md and the PNG plots -- is
generated from the CSV alone (`python -m bench report <csv>`), so a committed
CSV reproduces its report and the README's tables.

CSV: one row per measurement (a kernel on a problem, XLA's dot on a problem, a
training step, one step's loss, the copy bandwidth), with the run's provenance
(device, driver, versions, git commit, date, timer, input distribution) on
every row.
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import math
import os
import re
import platform as _platform
import subprocess
from collections import defaultdict
from pathlib import Path

REF = "xla_dot"
# jaxgemm's default, jaxgemm.matmul(a, b) (runner.AUTO / AUTO_VARIANT): a row of its
# own on every problem, kept apart from the backends it picks from.
AUTO, AUTO_VARIANT = "auto", "default"
# Issue 6's target for the default: geomean over these suites at least
# DEFAULT_TARGET x XLA, no problem below DEFAULT_FLOOR x, and a training step no
# slower than XLA's.
TARGET_SUITES = ("square", "llm")
DEFAULT_TARGET = 1.00
DEFAULT_FLOOR = 0.97

PROVENANCE = ["date", "platform", "device", "device_count", "driver", "platform_version",
              "jax", "jaxlib", "triton", "jax_triton", "numpy", "python", "git_commit",
              "git_dirty"]

COLUMNS = [
    "run_id", "suite", "kind", "problem", "backend", "variant", "variant_rank", "dtype",
    "precision",
    "batch", "m", "k", "n", "layout", "ladder", "flops", "min_bytes", "arith_intensity",
    "status", "error", "tolerance", "note",
    "timer", "iters", "rotate", "working_set_mb",
    "time_ms_median", "time_ms_p10", "time_ms_p90", "time_ms_iqr", "time_ms_min",
    "tflops", "pct_peak", "gbps", "pct_copy_bw", "memory_bound",
    "xla_time_ms", "speedup_vs_xla", "compile_s", "first_run_s",
    "tokens_per_step", "tokens_per_s", "step_wall_ms", "steps", "step", "loss", "loss_first",
    "loss_last",
    "loss_max_rel_diff", "loss0_rel_diff", "grad_rel_err", "agree",
    "config", "chosen", "peak_tflops", "copy_bw_gbps", "problem_note", "input_dist", "seed",
    *PROVENANCE,
]

NOT_GPU_BANNER = ("**NOT GPU TIMINGS: no GPU was found.** These numbers come from XLA:CPU "
                  "and the kernels' CPU interpreters on tiny problems; they check that the "
                  "benchmark and the kernels run and agree with XLA, and say nothing about "
                  "GPU performance.")


# ---------------------------------------------------------------- provenance

def _run(cmd, cwd=None) -> str:
  try:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20,
                          check=False).stdout.strip()
  except Exception:  # noqa: BLE001
    return ""


def _version(dist: str) -> str:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def _driver() -> str:
  v = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
  if v:
    return v.splitlines()[0].strip()
  try:
    text = Path("/proc/driver/nvidia/version").read_text()
    for tok in text.split():
      if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
        return tok
  except OSError:
    pass
  return "unknown"


COMMIT_ENV = "JAXGEMM_BENCH_COMMIT"   # the commit, when the tree has no .git


def repo_root() -> Path:
  return Path(__file__).resolve().parent.parent


def provenance() -> dict:
  import jax  # noqa: PLC0415

  devs = jax.devices()
  d = devs[0]
  platform = "gpu" if d.platform in ("gpu", "cuda", "rocm") else d.platform
  on_gpu = platform == "gpu"
  try:
    pv = d.client.platform_version
  except Exception:  # noqa: BLE001
    pv = ""
  root = repo_root()
  commit = _run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root)
  dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
  if os.environ.get(COMMIT_ENV) or not re.fullmatch(r"[0-9a-f]{40}", commit or ""):
    # A copy of the tree without a usable .git (the GPU machine's copy answered
    # "HEAD" to rev-parse): the caller says which commit it is.
    commit = os.environ.get(COMMIT_ENV, "") or "unknown"
    dirty = os.environ.get(COMMIT_ENV + "_DIRTY", "")
  return {
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "platform": platform,
      "device": getattr(d, "device_kind", str(d)),
      "device_count": len(devs),
      "driver": _driver() if on_gpu else "n/a (no GPU)",
      "platform_version": str(pv).replace("\n", " "),
      "jax": _version("jax"), "jaxlib": _version("jaxlib"),
      "triton": _version("triton"), "jax_triton": _version("jax-triton"),
      "numpy": _version("numpy"), "python": _platform.python_version(),
      "git_commit": commit,
      "git_dirty": int(bool(dirty) and dirty != "0") if commit != "unknown" else "",
  }


# ---------------------------------------------------------------- CSV

def _fmt(v):
  if isinstance(v, float):
    if math.isnan(v):
      return "nan"
    return f"{v:.6g}"
  if isinstance(v, bool):
    return int(v)
  return v


class CsvWriter:
  """Appends rows as they come (a crash keeps what was measured)."""

  def __init__(self, path: Path):
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._f = open(self.path, "w", newline="")
    self._w = csv.DictWriter(self._f, fieldnames=COLUMNS, extrasaction="ignore")
    self._w.writeheader()
    self._f.flush()
    self.n = 0

  def __call__(self, row: dict):
    self._w.writerow({k: _fmt(v) for k, v in row.items()})
    self._f.flush()
    self.n += 1

  def close(self):
    self._f.close()


def read_csv(path) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def merge_csvs(paths, out_path) -> Path:
  """Concatenates benchmark CSVs (same or older column sets) into one."""
  out_path = Path(out_path)
  rows = []
  for p in paths:
    if Path(p).resolve() == out_path.resolve():
      raise SystemExit(f"{p} is the merge's output; name another --out")
    rows += read_csv(p)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  with open(out_path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  return out_path


def num(x):
  if x is None or x == "":
    return None
  try:
    v = float(x)
  except ValueError:
    return None
  return v


def _geomean(xs):
  xs = [x for x in xs if x and x > 0]
  return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


# ---------------------------------------------------------------- analysis

def _merged_view(rows: list[dict]) -> list[dict]:
  """Rows of merged runs, made comparable problem by problem.

  * Several dtypes: the GEMM rows of every dtype but the run's first are
    labelled with it ("square (fp32)"), so that tables never put an fp32 time
    next to a bf16 one, and the plots keep the first dtype's suites.
  * A problem skipped in one run (out of time) and measured in another: the
    measured rows win.
  """
  gemm_dtypes = list(dict.fromkeys(r["dtype"] for r in rows if r["kind"] == "gemm"))
  if len(gemm_dtypes) > 1:
    rows = [dict(r, suite=f"{r['suite']} ({r['dtype']})")
            if r["kind"] == "gemm" and r["dtype"] != gemm_dtypes[0] else r for r in rows]
  keep: dict[tuple, int] = {}
  for i, r in enumerate(rows):
    if r["kind"] != "gemm":
      continue
    key = (r["suite"], r["problem"], r["backend"], r["variant"])
    if key not in keep or r["status"] != "skipped" or rows[keep[key]]["status"] == "skipped":
      keep[key] = i
  chosen = set(keep.values())
  return [r for i, r in enumerate(rows) if r["kind"] != "gemm" or i in chosen]


class Run:
  """The CSV's rows, indexed for the tables and plots."""

  def __init__(self, rows: list[dict]):
    rows = _merged_view(rows)
    self.rows = rows
    self.gemm = [r for r in rows if r["kind"] == "gemm"]
    self.first = rows[0] if rows else {}
    self.on_gpu = self.first.get("platform") == "gpu"
    # backends and their variants in the CSV's order (ladder order as run)
    self.backend_variants: dict[str, list[str]] = {}
    rank = {}
    for r in rows:
      if r["backend"] in (REF, AUTO, "") or r["kind"] != "gemm":
        continue
      vs = self.backend_variants.setdefault(r["backend"], [])
      if r["variant"] not in vs:
        vs.append(r["variant"])
        rank[(r["backend"], r["variant"])] = num(r.get("variant_rank")) or 0
    for b, vs in self.backend_variants.items():   # ladder order, as registered when run
      vs.sort(key=lambda v, b=b: rank[(b, v)])
    self.suites = []
    for r in self.gemm:
      if r["suite"] not in self.suites:
        self.suites.append(r["suite"])
    # Runs from before the default was measured have no auto rows: their
    # reports keep the tables they had.
    self.has_auto = any(r["backend"] == AUTO for r in self.gemm)

  @property
  def own_backends(self) -> list[str]:
    """Backends with kernels of our own (not the xla backend), else all of them."""
    own = [b for b in self.backend_variants if b != "xla"]
    return own or list(self.backend_variants)

  def problems(self, suite: str) -> list[dict]:
    """The XLA reference row of each problem of `suite`, in run order."""
    return [r for r in self.gemm if r["suite"] == suite and r["backend"] == REF]

  def kernel_rows(self, suite: str, problem: str) -> list[dict]:
    return [r for r in self.gemm if r["suite"] == suite and r["problem"] == problem
            and r["backend"] != REF]

  def auto(self, suite: str, problem: str) -> dict | None:
    """The default's (backend='auto') row of the problem, if it ran."""
    rr = [r for r in self.kernel_rows(suite, problem) if r["backend"] == AUTO]
    return rr[0] if rr else None

  def best(self, suite: str, problem: str, backends) -> dict | None:
    """The fastest correct kernel row of `backends` on the problem."""
    ok = [r for r in self.kernel_rows(suite, problem)
          if r["backend"] in backends and r["status"] == "ok" and num(r["speedup_vs_xla"])]
    return max(ok, key=lambda r: num(r["speedup_vs_xla"])) if ok else None

  def copy_bw(self):
    for r in self.rows:
      if r["kind"] == "copy_bw":
        return num(r["gbps"])
    return None


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
    g = _geomean(speedups)
    row = [suite, len(probs), _fmt_t(_geomean(xla)), _fmt_x(g), f"{wins}/{len(speedups)}",
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
  return {"geomean": _geomean(speedups), "min": lo, "min_problem": lo_problem,
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
  return [s for s in run.suites if any(r["backend"] == AUTO for r in run.gemm
                                       if r["suite"] == s)], False


def _met(ok: bool) -> str:
  return "target met" if ok else "target NOT met"


def defaults_summary(run: Run) -> list[str]:
  """jaxgemm's default (backend='auto') against XLA: the GEMM and training numbers."""
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["backend"] == AUTO]
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


def backend_suite_table(run: Run) -> list[str]:
  """Per backend (its best variant on each problem): geomean speedup per suite."""
  bs = list(run.backend_variants)
  rows = []
  for suite in run.suites:
    row = [suite]
    for b in bs:
      sp = [num(x["speedup_vs_xla"]) for p in run.problems(suite)
            if (x := run.best(suite, p["problem"], [b])) is not None]
      g = _geomean(sp)
      row.append(f"{_fmt_x(g)} ({len(sp)})" if g else "-")
    rows.append(row)
  return _table(["suite", *[f"{b} vs XLA" for b in bs]], rows)


def ladder_tables(run: Run) -> list[str]:
  out = []
  ladder = [r for r in run.gemm if r["backend"] == REF and r.get("ladder") == "1"]
  if not ladder:
    return ["No ladder problems in this run."]
  probs = [(r["suite"], r["problem"]) for r in ladder]
  several_dtypes = len({r["dtype"] for r in ladder}) > 1
  header = ["variant", *[f"{p} ({r['m']}x{r['k']}x{r['n']}"
                         f"{', ' + r['dtype'] if several_dtypes else ''})"
                         for (_, p), r in zip(probs, ladder)]]
  for b, vs in run.backend_variants.items():
    rows = []
    for v in vs:
      row = [v]
      for suite, p in probs:
        rr = [r for r in run.kernel_rows(suite, p) if r["backend"] == b and r["variant"] == v]
        row.append(_cell_t(rr[0]) if rr else "-")
      rows.append(row)
    rows.append(["XLA dot", *[_cell_t(r, False) for r in ladder]])
    out += [f"#### Ladder: backend `{b}` (TFLOP/s, speedup vs XLA)", "", *_table(header, rows), ""]
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
  steps = [r for r in run.rows if r["kind"] == "train_step"]
  if not steps:
    return []
  rows = []
  for r in steps:
    who = "XLA dot" if r["backend"] == REF else f"{r['backend']}/{r['variant']}"
    t = num(r["time_ms_median"])
    w = num(r.get("step_wall_ms"))
    rows.append([who, r["status"], f"{t:.3f}" if t else "-", f"{w:.3f}" if w else "-",
                 f"{num(r['tokens_per_s']):,.0f}" if num(r["tokens_per_s"]) else "-",
                 _fmt_x(num(r["speedup_vs_xla"])),
                 f"{num(r['loss_first']):.4f} -> {num(r['loss_last']):.4f}" if num(r["loss_first"]) else "-",
                 f"{num(r['loss_max_rel_diff']):.2e}" if num(r["loss_max_rel_diff"]) is not None else "-",
                 f"{num(r['grad_rel_err']):.2e}" if num(r["grad_rel_err"]) is not None else "-",
                 {"1": "yes", "0": "NO"}.get(r.get("agree", ""), "-")])
  head = steps[0]
  return [f"Model: {head['problem_note']} ({head['problem']}).", "",
          *_table(["GEMMs", "status", "step ms (median, run timer)", "step ms (wall, training loop)",
                   "tokens/s", "vs XLA",
                   "loss first -> last", "max loss rel diff vs XLA", "step-0 grad rel err",
                   "agree"], rows)]


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


# ---------------------------------------------------------------- plots

def _plt():
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  return plt


def plot_size(run: Run, path: Path) -> bool:
  """TFLOP/s against size, one panel per backend, each with XLA's dot."""
  suite = "square" if "square" in run.suites else (run.suites[0] if run.suites else None)
  if suite is None or not run.backend_variants:
    return False
  plt = _plt()
  bs = list(run.backend_variants)
  fig, axes = plt.subplots(1, len(bs), figsize=(5.5 * len(bs), 4.2), squeeze=False)
  refs = [r for r in run.problems(suite) if r["status"] == "ok"]

  def size(r):
    return (num(r["m"]) * num(r["k"]) * num(r["n"])) ** (1 / 3)

  for ax, b in zip(axes[0], bs):
    refs_sorted = sorted(refs, key=size)
    ax.plot([size(r) for r in refs_sorted], [num(r["tflops"]) for r in refs_sorted], "k--o",
            label="XLA dot", linewidth=2, markersize=4)
    for v in run.backend_variants[b]:
      pts = sorted(((size(r), num(r["tflops"])) for r in run.gemm
                    if r["suite"] == suite and r["backend"] == b and r["variant"] == v
                    and r["status"] == "ok"))
      if pts:
        ax.plot(*zip(*pts), "-o", label=v, markersize=3)
    _autoscale(ax, [y for line in ax.get_lines() for y in line.get_ydata()])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (M*K*N)^(1/3)" if suite != "square" else "M = K = N")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{b}: {suite} suite, {run.first.get('dtype', '')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  _save(fig, run, path)
  return True


def plot_ladder(run: Run, path: Path) -> bool:
  ladder = [r for r in run.gemm if r["backend"] == REF and r.get("ladder") == "1"]
  if not ladder or not run.backend_variants:
    return False
  plt = _plt()
  bs = list(run.backend_variants)
  fig, axes = plt.subplots(len(bs), 1, figsize=(max(7, 1.8 * len(ladder) + 3), 3.6 * len(bs)),
                           squeeze=False)
  for ax, b in zip(axes[:, 0], bs):
    vs = run.backend_variants[b]
    labels = ["XLA dot", *vs]
    width = 0.8 / len(labels)
    all_ys = []
    for i, lab in enumerate(labels):
      ys = []
      for ref in ladder:
        if lab == "XLA dot":
          ys.append(num(ref["tflops"]) or 0)
          continue
        rr = [r for r in run.kernel_rows(ref["suite"], ref["problem"])
              if r["backend"] == b and r["variant"] == lab and r["status"] == "ok"]
        ys.append(num(rr[0]["tflops"]) if rr else 0)
      xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(ladder))]
      ax.bar(xs, ys, width, label=lab, color="black" if lab == "XLA dot" else None)
      all_ys += ys
    _autoscale(ax, all_ys)
    ax.set_xticks(range(len(ladder)))
    ax.set_xticklabels([f"{r['problem']}\n{r['m']}x{r['k']}x{r['n']}" for r in ladder], fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"kernel ladder: {b} (missing bar = failed/unsupported)")
    ax.legend(fontsize=7, ncol=min(len(labels), 6))
    ax.grid(axis="y", alpha=0.3)
  _save(fig, run, path)
  return True


def plot_ratio(run: Run, path: Path, suite: str = "llm") -> bool:
  refs = run.problems(suite)
  if not refs or not (run.backend_variants or run.has_auto):
    return False
  plt = _plt()
  fig, ax = plt.subplots(figsize=(max(8, 0.28 * len(refs) + 3), 4.5))
  for b in run.backend_variants:
    ys = []
    for r in refs:
      best = run.best(suite, r["problem"], [b])
      ys.append(num(best["speedup_vs_xla"]) if best else float("nan"))
    ax.plot(range(len(refs)), ys, "o-", label=f"{b} (best variant)", markersize=4)
  ys = [num(a["speedup_vs_xla"]) if (a := run.auto(suite, r["problem"])) and a["status"] == "ok"
        else float("nan") for r in refs]
  if any(math.isfinite(y) for y in ys):
    ax.plot(range(len(refs)), ys, "s-", color="black", label="default (backend='auto')",
            markersize=4)
  ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
  ax.set_xticks(range(len(refs)))
  ax.set_xticklabels([r["problem"] for r in refs], rotation=75, fontsize=6, ha="right")
  ax.set_ylabel("speedup vs XLA dot (>1: faster)")
  ax.set_title(f"{suite} suite: each backend's best variant, and the default, against XLA's dot")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  _save(fig, run, path)
  return True


def plot_bandwidth(run: Run, path: Path) -> bool:
  refs = [r for r in run.problems("skinny") if r["status"] == "ok"]
  if not refs:
    return False
  plt = _plt()
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  groups = defaultdict(list)
  for r in refs:
    groups[(r["k"], r["n"])].append(r)
  for (k, n), rs in groups.items():
    rs.sort(key=lambda r: num(r["m"]))
    ax.plot([num(r["m"]) for r in rs], [num(r["gbps"]) for r in rs], "k--o", markersize=3,
            label=f"XLA K={k} N={n}")
    for b in run.backend_variants:
      pts = [(num(r["m"]), num(x["gbps"])) for r in rs
             if (x := run.best("skinny", r["problem"], [b])) is not None]
      if pts:
        ax.plot(*zip(*pts), "-o", markersize=3, label=f"{b} K={k} N={n}")
  bw = run.copy_bw()
  if bw:
    ax.axhline(bw, color="red", linewidth=1, label=f"measured copy {bw:.0f} GB/s")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("M (tokens)")
  ax.set_ylabel("GB/s (operands read once, output written once)")
  ax.set_title("skinny (decode) suite: achieved bandwidth")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=6)
  _save(fig, run, path)
  return True


def plot_training(run: Run, path: Path) -> bool:
  losses = defaultdict(list)
  for r in run.rows:
    if r["kind"] == "train_loss":
      who = "XLA dot" if r["backend"] == REF else f"{r['backend']}/{r['variant']}"
      losses[who].append((int(num(r["step"])), num(r["loss"])))
  if not losses:
    return False
  plt = _plt()
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for who, pts in losses.items():
    pts.sort()
    style = dict(color="black", linewidth=2.5, alpha=0.5) if who == "XLA dot" else {}
    ax.plot(*zip(*pts), label=who, **style)
  ax.set_xlabel("step")
  ax.set_ylabel("training loss")
  ax.set_title("training loss: jaxgemm GEMMs vs XLA's dot (same init, same data)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  _save(fig, run, path)
  return True


def _autoscale(ax, values):
  """Log y when the values span more than two decades (e.g. interpreters vs XLA)."""
  v = [x for x in values if x and x > 0]
  if v and max(v) / min(v) > 100:
    ax.set_yscale("log")


def _save(fig, run: Run, path: Path) -> None:
  plt = _plt()
  _title(fig, run)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _title(fig, run: Run):
  f = run.first
  tag = "" if run.on_gpu else "NOT GPU TIMINGS (CPU) - "
  fig.suptitle(f"{tag}{f.get('device', '')}, jax {f.get('jax', '')}, {f.get('timer', '')}",
               fontsize=8, y=0.995)


PLOTS = {
    "tflops_vs_size.png": ("TFLOP/s against size, per backend, with XLA's dot", plot_size),
    "ladder.png": ("The kernel ladder (every variant on the ladder problems)", plot_ladder),
    "llm_ratio.png": ("Speedup against XLA across the llm suite", plot_ratio),
    "skinny_bandwidth.png": ("Achieved bandwidth on the skinny (decode) suite", plot_bandwidth),
    "training_loss.png": ("Training loss trajectories", plot_training),
}


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
  lines += ["## Kernel ladders", "", *ladder_tables(run), ""]
  for suite in run.suites:
    lines += [f"## Suite `{suite}`", "", *suite_table(run, suite), ""]
  tt = training_table(run)
  if tt:
    lines += ["## Training step", "", *tt, ""]
  lines += ["## Failures, errors, skips", "", *problem_list(run), ""]
  lines += ["## Plots", ""]
  for name, (caption, _) in PLOTS.items():
    if name not in plots:
      continue
    lines += [f"### {caption}", "", f"![{caption}](plots/{name})", ""]
  return "\n".join(lines)


def readme_tables(run: Run, plots_rel: str, plots=PLOTS) -> str:
  """The block the README shows: headline, defaults, ladders, training, plots (from the CSV)."""
  f = run.first
  lines = ["<!-- generated by `python -m bench report`; do not edit by hand -->", ""]
  if not run.on_gpu:
    lines += [f"> {NOT_GPU_BANNER}", ""]
  dtypes = ", ".join(dict.fromkeys(r["dtype"] for r in run.gemm)) or f.get("dtype", "?")
  lines += [f"{f.get('device', '?')}, jax {f.get('jax', '?')}, triton {f.get('triton', '?')}, "
            f"{dtypes}, timer {f.get('timer', '?')}, commit "
            f"`{f.get('git_commit', '?')[:10]}`, {f.get('date', '?')}.", ""]
  lines += [*headline_table(run), ""]
  summary = defaults_summary(run)
  if summary:
    lines += ["#### Defaults (backend='auto') vs XLA", "", *summary, ""]
  targets = targets_table(run)
  if targets:
    lines += ["#### Kernel targets of the Triton and Pallas issues", "", *targets, ""]
  lines += ladder_tables(run)
  tt = training_table(run)
  if tt:
    lines += ["#### Training step", "", *tt, ""]
  for name, (caption, _) in PLOTS.items():
    if name in plots:
      lines += [f"![{caption}]({plots_rel}/{name})", ""]
  return "\n".join(lines)


README_BEGIN = "<!-- bench:begin (python -m bench report ... --readme README.md) -->"
README_END = "<!-- bench:end -->"


def update_readme(readme: Path, tables: str) -> None:
  """Puts `tables` between the README's bench markers (which must be there)."""
  text = readme.read_text()
  if README_BEGIN not in text or README_END not in text:
    raise SystemExit(f"{readme} has no '{README_BEGIN}' ... '{README_END}' block")
  head, rest = text.split(README_BEGIN, 1)
  _, tail = rest.split(README_END, 1)
  readme.write_text(f"{head}{README_BEGIN}\n{tables.strip()}\n{README_END}{tail}")


def generate(csv_path, out_dir=None) -> dict:
  """REPORT.md, README_TABLES.md and plots/ from a CSV; returns their paths."""
  csv_path = Path(csv_path)
  out_dir = Path(out_dir) if out_dir else csv_path.parent
  out_dir.mkdir(parents=True, exist_ok=True)
  run = Run(read_csv(csv_path))
  plots_dir = out_dir / "plots"
  plots_dir.mkdir(exist_ok=True)
  made = {}
  for name, (_, fn) in PLOTS.items():
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
  report.write_text(report_markdown(run, csv_rel, made))
  try:
    plots_rel = Path(os.path.relpath(plots_dir.resolve(), repo_root())).as_posix()
    if plots_rel.startswith(".."):
      plots_rel = "plots"
  except ValueError:
    plots_rel = "plots"
  tables = out_dir / "README_TABLES.md"
  tables.write_text(readme_tables(run, plots_rel, made))
  return {"report": report, "readme_tables": tables, "plots": made}
