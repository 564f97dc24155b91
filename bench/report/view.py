"""A run's rows, indexed for the tables and plots (`Run`)."""

from __future__ import annotations

import math

from .csvio import num

REF = "xla_dot"
# jaxgemm's default, jaxgemm.matmul(a, b) (runner.AUTO / AUTO_VARIANT): a row of its
# own on every problem, kept apart from the backends it picks from.
AUTO, AUTO_VARIANT = "auto", "default"
# jax's example grouped GEMM kernel (the moe suites, bench/moe.py): a peer measured
# beside the kernels, not one of jaxgemm's backends.
EXAMPLE = "jax_example"
# XLA's other programs of an fp8 problem (bench/fp8.py: its fp8 dot without scales, its
# bf16 dot): measured beside the kernels against XLA's scaled form, not jaxgemm backends.
XLA_PEER = "xla_peer"
PEERS = (EXAMPLE, XLA_PEER)


def geomean(xs):
  xs = [x for x in xs if x and x > 0]
  return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _merged_view(rows: list[dict]) -> list[dict]:
  """Rows of merged runs, made comparable problem by problem.

  * Several dtypes: the GEMM rows of every dtype but the run's first are
    labelled with it ("square (fp32)"), so that tables never put an fp32 time
    next to a bf16 one, and the plots keep the first dtype's suites.
  * A problem skipped in one run (out of time) and measured in another: the
    measured rows win. So do a training step's (`train_step`; its per-step
    `train_loss` rows, which only a measured step has, are the last run's): a
    suite's GEMMs and its step may come from separate commands (the fp8 suite's
    `--only 'fp8.*'`).
  """
  gemm_dtypes = list(dict.fromkeys(r["dtype"] for r in rows if r["kind"] == "gemm"))
  if len(gemm_dtypes) > 1:
    rows = [dict(r, suite=f"{r['suite']} ({r['dtype']})")
            if r["kind"] == "gemm" and r["dtype"] != gemm_dtypes[0] else r for r in rows]
  deduped = ("gemm", "train_step", "train_loss")
  keep: dict[tuple, int] = {}
  for i, r in enumerate(rows):
    if r["kind"] not in deduped:
      continue
    key = (r["kind"], r["suite"], r["problem"], r["backend"], r["variant"], r.get("step", ""))
    if key not in keep or r["status"] != "skipped" or rows[keep[key]]["status"] == "skipped":
      keep[key] = i
  chosen = set(keep.values())
  return [r for i, r in enumerate(rows) if r["kind"] not in deduped or i in chosen]


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
      if r["backend"] in (REF, AUTO, *PEERS, "") or r["kind"] != "gemm":
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
    """jaxgemm's rows of the problem: its backends' kernels and the default."""
    return [r for r in self.gemm if r["suite"] == suite and r["problem"] == problem
            and r["backend"] not in (REF, *PEERS)]

  def peer(self, suite: str, problem: str, variant: str) -> dict | None:
    """XLA's other program `variant` of an fp8 problem (backend XLA_PEER), if it ran."""
    rr = [r for r in self.gemm if r["suite"] == suite and r["problem"] == problem
          and r["backend"] == XLA_PEER and r["variant"] == variant]
    return rr[0] if rr else None

  def example(self, suite: str, problem: str) -> dict | None:
    """jax's example kernel's row of the problem (moe suites), if it has one."""
    rr = [r for r in self.gemm if r["suite"] == suite and r["problem"] == problem
          and r["backend"] == EXAMPLE]
    return rr[0] if rr else None

  def is_moe(self, suite: str) -> bool:
    """Whether `suite` holds grouped GEMMs (ragged_dot: rows with a `mode`, no `expr` or
    `scaling`)."""
    return any(r.get("mode") and not r.get("expr") and not r.get("scaling")
               for r in self.problems(suite))

  def is_fp8(self, suite: str) -> bool:
    """Whether `suite` holds FP8 GEMMs with scales (rows with a `scaling`)."""
    return any(r.get("scaling") for r in self.problems(suite))

  def is_epilogue(self, suite: str) -> bool:
    """Whether `suite` holds GEMM epilogue expressions (rows with an `expr`)."""
    return any(r.get("expr") for r in self.problems(suite))

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

