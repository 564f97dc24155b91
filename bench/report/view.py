"""A run's rows, indexed for the tables and plots (`Run`)."""

from __future__ import annotations

from ..suites import PEERS
from .csvio import AUTO, REF, num


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
  """The CSV's rows, indexed for the tables and plots.

  Rows of a problem are XLA's reference (backend REF), jaxgemm's kernels (each
  backend's variants, and the default, AUTO) and the peers of the op's entry
  (`suites.PEERS`: programs measured beside the kernels, not jaxgemm backends).
  """

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

  def row(self, suite: str, problem: str, backend: str, variant: str | None = None):
    """The problem's (first) row of `backend` (and `variant`), if it has one: a peer's
    (jax's example kernel, XLA's other programs of an fp8 problem)."""
    return next((r for r in self.gemm if r["suite"] == suite and r["problem"] == problem
                 and r["backend"] == backend and variant in (None, r["variant"])), None)

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
