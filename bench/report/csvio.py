"""The run's CSV: provenance, columns, writing, reading and merging.

CSV: one row per measurement (a kernel on a problem, XLA's own op on a problem -- its
dot, or for the moe suites its ragged_dot -- jax's example grouped GEMM kernel, a
training step, one step's loss, the copy bandwidth; for the epilogue suites XLA's
program of the jnp expression; for the fp8 suites XLA's scaled form and its other
programs, `xla_peer`, with `xla_ref` naming the program each ratio is against: the
strongest of XLA's baselines, `speedup_vs_paired` the ratio to the scaled form timed
beside it), with the
run's provenance
(device, driver, versions, git commit, date, timer, input distribution) on
every row. Everything made after it (REPORT.md, the tables, the plots, the
runs' history) is read back from the CSV alone.
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import math
import os
import platform as _platform
import re
import subprocess
from pathlib import Path

PROVENANCE = ["date", "platform", "device", "device_count", "driver", "platform_version",
              "jax", "jaxlib", "triton", "jax_triton", "numpy", "python", "git_commit",
              "git_dirty"]

COLUMNS = [
    "run_id", "suite", "kind", "problem", "backend", "variant", "variant_rank", "dtype",
    "precision",
    "batch", "m", "k", "n", "layout", "ladder", "flops", "min_bytes", "arith_intensity",
    "groups", "active_groups", "mode", "layer", "expr", "scaling", "fp8_dtypes", "xla_ref",
    "status", "error", "tolerance", "note",
    "timer", "iters", "rotate", "working_set_mb",
    "time_ms_median", "time_ms_p10", "time_ms_p90", "time_ms_iqr", "time_ms_min",
    "tflops", "pct_peak", "gbps", "pct_copy_bw", "memory_bound",
    "xla_time_ms", "speedup_vs_xla", "speedup_vs_paired", "example_time_ms",
    "speedup_vs_example", "bf16_time_ms", "speedup_vs_bf16",
    "compile_s", "first_run_s",
    "tokens_per_step", "tokens_per_s", "step_wall_ms", "steps", "step", "loss", "loss_first",
    "loss_last",
    "loss_max_rel_diff", "loss_last_rel_diff", "loss0_rel_diff", "grad_rel_err", "agree",
    "mesh", "collectives", "collective_mb", "same_collectives", "mem_per_device_gb",
    "xla_mem_per_device_gb", "local_problems", "custom_calls",
    "config", "chosen", "group_sizes", "peak_tflops", "copy_bw_gbps", "problem_note", "input_dist", "seed",
    *PROVENANCE,
]


# Values of the `backend` column that are not jaxgemm backends: XLA's own op on the
# problem, the reference of every ratio (`runner.REF`), and jaxgemm's default
# (`runner.AUTO`: jaxgemm.matmul(a, b) with nothing named), a row of its own on every
# problem, kept apart from the backends it picks from. An op's entry names its other
# such values (`entry.BenchOp.peers`).
REF = "xla_dot"
AUTO = "auto"


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
  """The source checkout this module runs from, or (installed from a wheel, where
  `jaxgemm.bench` sits in site-packages) the working directory: results, history and
  docs are a checkout's files, never the installed package's."""
  checkout = Path(__file__).resolve().parents[2]
  if (checkout / "pyproject.toml").is_file() and (checkout / "bench" / "report").is_dir():
    return checkout
  return Path.cwd()


RESULTS = repo_root() / "bench" / "results"   # where runs, tuning logs and history.csv live


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

