"""Runs GEMM problems on every kernel and on XLA's dot, checks, times, records.

For each problem, in one process:

1. random-normal inputs (``jax.random.normal``, mean 0, std 1, in the
   problem's dtype), rotated among several independent copies when the
   problem is smaller than about twice the L2;
2. XLA's dot (``lax.dot_general``, exactly what ``jnp.matmul`` runs) is
   compiled, run and timed: the reference, backend ``xla_dot``;
3. every chosen (backend, variant) runs through ``jaxgemm.matmul`` (or
   ``jaxgemm.dot_general`` for transposed layouts), and so does jaxgemm's
   default (pseudo-backend ``auto``, variant ``default``: no backend, variant
   or config named, as a user calls it): compiled (compile time
   recorded), run once (first-run time, which holds any autotuning, recorded),
   its output checked against XLA's (relative Frobenius error against a
   per-dtype tolerance) and only then timed, interleaved with XLA's dot
   (`time_paired`): the row's ``speedup_vs_xla`` compares the two timed
   side by side, not the kernel against XLA's timing at the problem's
   start. A wrong result is a ``fail``
   row with its error and no time; ``NotImplementedError`` is an
   ``unsupported`` row; any other exception is an ``error`` row, and the run
   goes on.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemm
from jaxgemm import dispatch, registry, tuning
from jaxgemm.timing import (MAX_ROTATE, Timer, l2_bytes, rotated, rotation, summarize,
                            time_paired)

from . import problems as P

REF = "xla_dot"           # XLA's own dot, the baseline every kernel is compared with
REF_VARIANT = "lax.dot_general"
# jaxgemm's default, `jaxgemm.matmul(a, b)`: not a backend of its own but the
# per-problem choice of `jaxgemm.dispatch` (a tuned kernel, or XLA's dot), so
# it is measured as a row of its own next to the backends it picks from.
AUTO = dispatch.AUTO
AUTO_VARIANT = "default"
# A named backend called with variant=None (its own choice per GEMM, forward and
# backward: the training step, the epilogue suites): the variant column's label.
DEFAULT_VARIANT = "(default)"

# Relative Frobenius error ||C - C_xla|| / ||C_xla|| a kernel may have, by run
# dtype: the autotuner's bounds (`jaxgemm.tuning.TOLERANCE` says why these), so
# a kernel the benchmark calls wrong is never one the tuner stores.
TOLERANCE = {name: tuning.TOLERANCE[kind] for name, kind in (
    ("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "tf32"), ("fp32-highest", "ieee"))}

# Dense peaks of an H100/H200 SXM (TFLOP/s), by run dtype; "fp8" for the fp8 suites'
# problems (`peak_dtype`: e4m3/e5m2 operands, 1979 TFLOP/s on the datasheet).
PEAK_TFLOPS = {"bf16": 989.0, "fp16": 989.0, "fp32": 495.0, "fp32-highest": 67.0,
               "fp8": 1979.0}
PEAK_DEVICES = ("H200", "H100")

INPUT_DIST = ("normal(0,1) in float32 rounded to the operand dtype (numpy default_rng "
              "for small input sets, jax.random.normal on the device for large ones)")

STATUS_OK, STATUS_FAIL, STATUS_UNSUPPORTED, STATUS_ERROR, STATUS_SKIPPED = (
    "ok", "fail", "unsupported", "error", "skipped")
# A kernel whose note starts so (`choose_kernels`) is recorded `unsupported`, not run.
UNSUPPORTED_PREFIX = "unsupported: "


def peak_tflops(device_kind: str, dtype_name: str) -> float | None:
  if any(d in device_kind for d in PEAK_DEVICES):
    return PEAK_TFLOPS[dtype_name]
  return None


def problem_peak(ctx: "Context", bp, dtype_name: str) -> float | None:
  """The peak a problem's TFLOP/s are compared with: its own `peak_dtype`'s (the fp8
  suites'), else the dtype's; None off a GPU."""
  if not ctx.on_gpu:
    return None
  return peak_tflops(ctx.device_kind, getattr(bp, "peak_dtype", None) or dtype_name)


def precision_of(dtype_name: str):
  p = P.DTYPES[dtype_name][1]
  return None if p is None else lax.Precision[p]


def is_not_implemented(e: BaseException) -> bool:
  """NotImplementedError, possibly wrapped by JAX's tracing/lowering."""
  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, NotImplementedError):
      return True
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return False


def short_error(e: BaseException, limit: int = 300) -> str:
  msg = f"{type(e).__name__}: {e}".replace("\n", " ").replace("\r", " ")
  return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# ---------------------------------------------------------------- functions

def ref_fn(bp: P.BenchProblem, dtype_name: str) -> Callable:
  """XLA's dot for the problem's layout: what jnp.matmul / lax.dot_general run."""
  dims = bp.dimension_numbers()
  prec = precision_of(dtype_name)
  out_dtype = P.dtype_of(dtype_name)

  def xla_dot(a, b):
    return lax.dot_general(a, b, dims, precision=prec, preferred_element_type=out_dtype)
  return xla_dot


def kernel_fn(bp: P.BenchProblem, dtype_name: str, backend: str, variant: str) -> Callable:
  """jaxgemm's kernel (backend, variant) for the problem, through the public API.

  (AUTO, AUTO_VARIANT) calls it as a user does by default: backend="auto", variant=None.
  """
  prec = precision_of(dtype_name)
  if backend == AUTO:
    variant = None
  if not bp.trans_a and not bp.trans_b:
    def gemm(a, b):
      return jaxgemm.matmul(a, b, precision=prec, backend=backend, variant=variant)
  else:
    dims = bp.dimension_numbers()

    def gemm(a, b):
      return jaxgemm.dot_general(a, b, dims, precision=prec, backend=backend,
                                 variant=variant)
  return gemm


def gemm_problem(bp: P.BenchProblem, dtype_name: str) -> jaxgemm.GemmProblem:
  """The canonical problem jaxgemm's API makes of `bp` (2-D operands fold to batch 1)."""
  dt = np.dtype(P.dtype_of(dtype_name))
  prec = precision_of(dtype_name)
  return jaxgemm.GemmProblem(batch=bp.batch, m=bp.m, n=bp.n, k=bp.k, dtype=dt, out_dtype=dt,
                              acc_dtype=np.dtype(np.float32), trans_a=bp.trans_a,
                              trans_b=bp.trans_b,
                              precision=None if prec is None else (prec, prec))


def slow_key(op: str, backend: str, variant: str) -> tuple:
  """The key of an op's (backend, variant) in `Context.slow`, `call_s` and `best_seen`:
  (backend, variant) for matmul, ("<op>:<backend>", variant) for other ops (whose
  variants may share a name with matmul's)."""
  return (backend, variant) if op == "matmul" else (f"{op}:{backend}", variant)


class Measured:
  """What `run_problem` needs to know about one op's problems; this one is matmul's
  (`GEMM`). Another op's suite (the moe suites: `moe.RAGGED_DOT`) subclasses it, and
  shares the rest: the reference's timing, the correctness gate, the paired timing,
  the watchdog, the rows."""

  op = "matmul"
  arity = 2                     # operands per call (one input set); see arity_of
  # Where XLA's reference takes longer than this (ms a call), kernels are timed alone
  # and compared with its median at the problem's start: pairing would cost `iters`
  # more reference calls per kernel (None: always paired).
  pair_max_ref_ms: float | None = None

  def ref_variant(self, bp) -> str:
    """The reference row's variant: XLA's own op."""
    return REF_VARIANT

  def arity_of(self, bp) -> int:
    """Operands per call of `bp` (one input set): `arity`, unless an op's problems differ."""
    return self.arity

  def kernels(self, bp, backends: list[str], variants_policy, dtype_name: str, slow=(),
              best_seen: set | None = None) -> list[tuple[str, str, str]]:
    """(backend, variant, note) triples to run on `bp` (`choose_kernels`)."""
    return choose_kernels(bp, backends, variants_policy, dtype_name, slow=slow,
                          best_seen=best_seen, ops=self)

  def prepare(self, ctx: "Context", bp, dtype_name: str):
    """The problem as it runs (the moe suite draws its group sizes here)."""
    return bp

  def ref_fn(self, bp, dtype_name: str) -> Callable:
    return ref_fn(bp, dtype_name)

  def kernel_fn(self, bp, dtype_name: str, backend: str, variant: str) -> Callable:
    """jaxgemm's (backend, variant) on the problem, through the op's public API."""
    return kernel_fn(bp, dtype_name, backend, variant)

  def inputs(self, bp, dtype_name: str, n_rot: int, seed: int) -> list:
    """`arity` operands per input set, `n_rot` sets, flat."""
    return make_inputs(bp, dtype_name, n_rot, seed)

  def problem(self, bp, dtype_name: str):
    """The canonical problem jaxgemm's API makes of `bp` (what dispatch chooses for)."""
    return gemm_problem(bp, dtype_name)

  def slow_key(self, backend: str, variant: str) -> tuple:
    """The key of (backend, variant) in `ctx.slow` / `ctx.call_s` (interpreted speed)."""
    return slow_key(self.op, backend, variant)

  def tolerance(self, bp, dtype_name: str) -> float:
    """The correctness gate's bound on the relative Frobenius error (`TOLERANCE`)."""
    return TOLERANCE[dtype_name]

  def check_fn(self, bp, dtype_name: str) -> Callable | None:
    """The function whose results the kernels are checked against, where that is not
    XLA's timed program itself (None: XLA's outputs are the reference)."""
    return None

  def before_kernels(self, ctx: "Context", bp, dtype_name: str, bufs, refs, ref_compiled,
                     n_rot: int, solo_ref_ms=None) -> tuple[list[dict], Callable | None]:
    """Rows measured after the reference and before the kernels (the moe suite's jax
    example kernel), and a function that completes each kernel row (or None)."""
    return [], None


GEMM = Measured()


def choice(bp: P.BenchProblem, dtype_name: str, backend: str,
           variant: str | None = None, ops: Measured = GEMM) -> dispatch.Choice | None:
  """The kernel jaxgemm runs for (backend, variant) on the problem, as its lowering picks
  it (tuned record, else heuristic); None if it cannot run the problem.

  variant None (and AUTO_VARIANT for AUTO) leaves the variant to jaxgemm, as a
  caller naming none does. The choice is information for the row: a kernel
  that cannot run says why when it is run.
  """
  try:
    return dispatch.choose(ops.problem(bp, dtype_name), backend,
                           None if backend == AUTO or variant == DEFAULT_VARIANT else variant)
  except Exception:  # noqa: BLE001
    return None


def default_variant(backend: str, bp: P.BenchProblem | None, dtype_name: str,
                    ops: Measured = GEMM) -> str:
  """The variant the backend picks for the problem when none is named, else its ladder's
  top (whose check then says why it cannot run the problem)."""
  picked = choice(bp, dtype_name, backend, ops=ops) if bp is not None else None
  return picked.variant if picked else registry.get_backend(backend, ops.op).variants[-1]


def describe_choice(c: dispatch.Choice) -> str:
  """'triton/persistent (table)': which kernel, and where the choice came from."""
  return f"{c.backend}/{c.variant} ({c.source})"


def _rank(backend: str, variant: str, op: str = "matmul"):
  """The variant's rung in the backend's ladder (0 = simplest)."""
  try:
    return list(jaxgemm.variants(backend, op)).index(variant)
  except (ValueError, KeyError):
    return ""


@jax.jit
def _norm(x):
  return jnp.linalg.norm(x.astype(jnp.float32).ravel())


def ref_norm(out) -> float:
  """The smallest Frobenius norm over a result's arrays (one array, or a tuple: the
  epilogue suites' forward output and gradients)."""
  return min(float(_norm(x)) for x in jax.tree.leaves(out))


def rel_error(outs, refs) -> float:
  """Largest relative Frobenius error over the rotated outputs, and over the arrays of
  each where a call returns several (nan if any is)."""
  outs, refs = jax.tree.leaves(outs), jax.tree.leaves(refs)
  if len(outs) != len(refs):
    raise ValueError(f"{len(outs)} output arrays against the reference's {len(refs)}")
  errs = [float(tuning.relative_error(o, r)) for o, r in zip(outs, refs)]
  return float("nan") if any(not math.isfinite(e) for e in errs) else max(errs)


# ---------------------------------------------------------------- the run

@dataclasses.dataclass
class Context:
  """What every measurement of a run shares."""

  platform: str                     # "gpu" or "cpu"
  device_kind: str
  timer: Timer
  iters: int
  dtype_name: str
  provenance: dict[str, Any]
  emit: Callable[[dict], None]      # writes one CSV row
  log: Callable[[str], None] = print
  seed: int = 0
  max_rotate: int = MAX_ROTATE
  copy_bw_gbps: float | None = None
  cpu_call_budget_s: float = 1.0    # interpreted calls slower than this are not timed
  cpu_max_gflop: float = 0.05       # bigger problems are skipped on a CPU
  run_id: str = ""
  slow: dict = dataclasses.field(default_factory=dict)  # (backend, variant) -> s per call
  call_s: dict = dataclasses.field(default_factory=dict)  # (backend, variant) -> slowest first call
  best_seen: set = dataclasses.field(default_factory=set)  # (backend, default variant) pairs
  exclude: tuple = ()               # --exclude patterns
  kernel_timeout_s: float = 0       # 0: no watchdog
  on_hang: Callable | None = None   # writes the report before a hung run exits
  verbose: bool = False
  time_budget_s: float = 0          # 0: none; else no new problem starts after this
  t_start: float = dataclasses.field(default_factory=time.perf_counter)

  def out_of_time(self) -> bool:
    return bool(self.time_budget_s) and time.perf_counter() - self.t_start > self.time_budget_s

  @property
  def on_gpu(self) -> bool:
    return self.platform == "gpu"

  @property
  def peak(self) -> float | None:
    return peak_tflops(self.device_kind, self.dtype_name) if self.on_gpu else None


def base_row(ctx: Context, suite: str, kind: str, backend: str, variant: str,
             bp: P.BenchProblem | None = None, dtype_name: str | None = None) -> dict:
  dtype_name = dtype_name or ctx.dtype_name
  row = {
      "run_id": ctx.run_id, "suite": suite, "kind": kind,
      "problem": bp.name if bp else "", "backend": backend, "variant": variant,
      "dtype": dtype_name, "precision": P.DTYPES[dtype_name][1] or "DEFAULT",
      "status": "", "timer": ctx.timer.label, "iters": "",
      "input_dist": INPUT_DIST, "seed": ctx.seed,
      "peak_tflops": (problem_peak(ctx, bp, dtype_name) if bp is not None else ctx.peak) or "",
      "copy_bw_gbps": ctx.copy_bw_gbps or "",
  }
  if bp is not None:
    row.update(bp.csv_fields(dtype_name))
  row.update(ctx.provenance)
  return row


def _metrics(ctx: Context, bp: P.BenchProblem, dtype_name: str, stats: dict,
             ref_median_ms: float | None) -> dict:
  t = stats["median_ms"] * 1e-3
  tflops = bp.flops / t / 1e12
  gbps = bp.min_bytes(dtype_name) / t / 1e9
  out = {
      "time_ms_median": stats["median_ms"], "time_ms_p10": stats["p10_ms"],
      "time_ms_p90": stats["p90_ms"], "time_ms_iqr": stats["iqr_ms"],
      "time_ms_min": stats["min_ms"], "iters": stats["n"],
      "tflops": tflops, "gbps": gbps,
  }
  peak = problem_peak(ctx, bp, dtype_name)
  if peak:
    out["pct_peak"] = 100 * tflops / peak
  if ctx.copy_bw_gbps:
    out["pct_copy_bw"] = 100 * gbps / ctx.copy_bw_gbps
  if peak and ctx.copy_bw_gbps:
    ridge = peak * 1e12 / (ctx.copy_bw_gbps * 1e9)   # flop/byte where the roofline bends
    out["memory_bound"] = int(bp.flops / bp.min_bytes(dtype_name) < ridge)
  if ref_median_ms:
    out["xla_time_ms"] = ref_median_ms
    out["speedup_vs_xla"] = ref_median_ms / stats["median_ms"]
  return out


def _compile_and_run(fn, bufs, n_rot, arity=2):
  """(compiled, outputs, compile_s, first_run_s)."""
  t0 = time.perf_counter()
  compiled = jax.jit(rotated(fn, n_rot, arity)).lower(*bufs).compile()
  t1 = time.perf_counter()
  outs = jax.block_until_ready(compiled(*bufs))
  t2 = time.perf_counter()
  return compiled, outs, t1 - t0, t2 - t1


HOST_GEN_MAX_ELEMS = 2**22   # smaller input sets are drawn on the host (no compile)


def make_inputs(bp: P.BenchProblem, dtype_name: str, n_rot: int, seed: int):
  """[a0, b0, a1, b1, ...]: independent standard-normal operands in the problem's dtype.

  Drawn in float32 and rounded to the dtype; small sets on the host (numpy's
  default_rng: no per-shape compile), large ones on the device (jax.random).
  """
  shapes = [s for _ in range(n_rot) for s in (bp.a_shape(), bp.b_shape())]
  return normal_inputs(shapes, P.dtype_of(dtype_name), seed)


def normal_inputs(shapes, dt, seed: int) -> list:
  """Independent standard-normal arrays of `shapes` in dtype `dt` (make_inputs' draw)."""
  if sum(math.prod(s) for s in shapes) <= HOST_GEN_MAX_ELEMS:
    rng = np.random.default_rng(seed)
    return [jax.device_put(rng.standard_normal(s, dtype=np.float32).astype(dt))
            for s in shapes]

  @jax.jit
  def gen(key):
    return [jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32).astype(dt)
            for i, s in enumerate(shapes)]

  return jax.block_until_ready(gen(jax.random.key(seed)))


def choose_kernels(bp: P.BenchProblem, backends: list[str], variants_policy,
                   dtype_name: str, slow=(), best_seen: set | None = None,
                   ops: Measured = GEMM) -> list[tuple[str, str, str]]:
  """(backend, variant, note) triples to run on `bp`.

  variants_policy: "ladder" (every variant on ladder problems, each backend's
  best -- the variant it picks for the problem when none is named --
  elsewhere), "best", "all", or a list of variant names. The pseudo-backend
  AUTO, when among `backends`, adds (AUTO, AUTO_VARIANT) under every policy.
  `slow` holds (backend, variant) pairs too slow to run here (interpreted, on
  a CPU): the best is then replaced by the highest rung below it that is not
  slow, and the note says so. A backend with no kernels for the op (`ops.op`)
  gets one row, `unsupported`, saying so.
  """
  out = []
  for b in backends:
    if b == AUTO:   # one kernel whatever the policy: the default has no variants to pick
      out.append((AUTO, AUTO_VARIANT, ""))
      continue
    if b not in jaxgemm.backends(ops.op):
      out.append((b, "-", f"{UNSUPPORTED_PREFIX}backend {b!r} has no {ops.op} kernels here "
                          f"(jaxgemm.backends({ops.op!r}) = {jaxgemm.backends(ops.op)})"))
      continue
    vs = list(jaxgemm.variants(b, ops.op))
    if isinstance(variants_policy, (list, tuple)):
      out.extend((b, v, "") for v in vs if v in variants_policy)
    elif variants_policy == "all" or (variants_policy == "ladder" and bp.ladder):
      out.extend((b, v, "") for v in vs)
    else:
      best = default_variant(b, bp, dtype_name, ops)
      if best_seen is not None:
        best_seen.add(ops.slow_key(b, best))
      if ops.slow_key(b, best) not in slow or best not in vs:
        out.append((b, best, ""))
        continue
      lower = [v for v in reversed(vs[:vs.index(best)]) if ops.slow_key(b, v) not in slow]
      if lower:
        out.append((b, lower[0], f"CPU: best variant {best!r} is too slow interpreted "
                                 f"({slow[ops.slow_key(b, best)]:.1f} s per call); ran "
                                 f"{lower[0]!r}"))
      else:
        out.append((b, best, ""))   # run_problem records it as skipped, saying why
  return out


def run_problem(ctx: Context, bp: P.BenchProblem, kernels: list[tuple[str, str]],
                make_fn: Callable | None = None, ops: Measured = GEMM) -> list[dict]:
  """XLA's own op (dot) and every kernel on one problem; returns (and emits) the rows.

  ops: what is measured (`GEMM`: matmul's problems; `moe.RAGGED_DOT`: ragged_dot's);
  make_fn: (problem, dtype name, backend, variant) -> the kernel's function
  (default `ops.kernel_fn`).
  """
  make_fn = make_fn or ops.kernel_fn
  dtype_name = bp.dtype or ctx.dtype_name
  rows = []

  def emit(row):
    rows.append(row)
    ctx.emit(row)

  if not ctx.on_gpu and bp.flops > ctx.cpu_max_gflop * 1e9:
    row = base_row(ctx, bp.suite, "gemm", REF, ops.ref_variant(bp), bp, dtype_name)
    row.update(status=STATUS_SKIPPED,
               note=f"skipped on CPU: {bp.flops / 1e9:.2f} GFLOP is above "
                    f"--cpu-max-gflop={ctx.cpu_max_gflop}")
    emit(row)
    return rows

  try:
    bp = ops.prepare(ctx, bp, dtype_name)
  except Exception as e:  # noqa: BLE001 (record and go on)
    row = base_row(ctx, bp.suite, "gemm", REF, ops.ref_variant(bp), bp, dtype_name)
    row.update(status=STATUS_ERROR, note=short_error(e))
    emit(row)
    return rows
  set_bytes = bp.min_bytes(dtype_name)
  n_rot = rotation(set_bytes, l2_bytes(ctx.device_kind), ctx.max_rotate) if ctx.on_gpu else 1
  rot = {"rotate": n_rot, "working_set_mb": round(n_rot * set_bytes / 2**20, 3)}

  # ---- XLA's own op: reference result and baseline time.
  ref_row = base_row(ctx, bp.suite, "gemm", REF, ops.ref_variant(bp), bp, dtype_name)
  ref_row.update(rot)
  try:
    bufs = ops.inputs(bp, dtype_name, n_rot, ctx.seed)
    compiled, refs, c_s, f_s = _compile_and_run(ops.ref_fn(bp, dtype_name), bufs, n_rot,
                                                ops.arity_of(bp))
    norm = ref_norm(refs[0])
    if not math.isfinite(norm) or norm == 0:
      raise RuntimeError(f"XLA's result has norm {norm}: inputs or XLA broken")
    samples = [t / n_rot for t in ctx.timer.time(compiled, bufs, ctx.iters)]
    stats = summarize(samples)
    ref_row.update(status=STATUS_OK, compile_s=c_s, first_run_s=f_s,
                   timer=ctx.timer.label, error=0.0,
                   **_metrics(ctx, bp, dtype_name, stats, stats["median_ms"]))
    ref_compiled = compiled
    solo = (stats["median_ms"] if ops.pair_max_ref_ms is not None
            and stats["median_ms"] > ops.pair_max_ref_ms else None)
  except Exception as e:  # noqa: BLE001 (record and go on)
    ref_row.update(status=STATUS_ERROR, note=short_error(e))
    emit(ref_row)
    ctx.log(f"  {bp.name}: XLA reference failed: {short_error(e)}")
    return rows
  check = ops.check_fn(bp, dtype_name)
  if check is not None:
    checked = _compile_and_run(check, bufs, n_rot, ops.arity_of(bp))[1]
    # XLA's own result against the check's (its `error`): how far the reference is from it.
    ref_row["error"] = rel_error(refs, checked)
    refs = checked
  emit(ref_row)
  extra, finish = ops.before_kernels(ctx, bp, dtype_name, bufs, refs, ref_compiled, n_rot,
                                     solo)
  for row in extra:
    emit(row)

  for backend, variant, why in kernels:
    row = base_row(ctx, bp.suite, "gemm", backend, variant, bp, dtype_name)
    if why:
      row["note"] = why.removeprefix(UNSUPPORTED_PREFIX)
    if why.startswith(UNSUPPORTED_PREFIX):
      row.update(rot, status=STATUS_UNSUPPORTED)
      emit(row)
      continue
    # the config recorded is the one run
    picked = choice(bp, dtype_name, backend, variant, ops)
    tol = gate(ops.tolerance(bp, dtype_name), ref_row.get("error"))
    row.update(rot, tolerance=tol,
               config=picked.config.to_json() if picked else "",
               variant_rank=_rank(backend, variant, ops.op))
    key = ops.slow_key(backend, variant)
    if backend == AUTO and picked:
      row["chosen"] = describe_choice(picked)
      # auto runs another kernel on each problem: its speed is that kernel's.
      key = ops.slow_key(picked.backend, picked.variant)
    if excluded(ctx.exclude, backend, variant, bp.name):
      row.update(status=STATUS_SKIPPED, note="excluded by --exclude")
    elif not ctx.on_gpu and key in ctx.slow:
      row.update(status=STATUS_SKIPPED,
                 note=f"skipped on CPU: an earlier interpreted call of {key[0]}/{key[1]} "
                      f"took {ctx.slow[key]:.1f} s (budget {ctx.cpu_call_budget_s} s)")
    else:
      with Watchdog(ctx, row, f"{backend}/{variant} on {bp.name}"):
        _run_kernel(ctx, bp, dtype_name, row, make_fn, bufs, refs, n_rot, ref_compiled, key,
                    ops.arity_of(bp), solo, tol=tol)
      if backend == AUTO and row.get("compile_s") not in (None, ""):
        # The compile measured a problem with no record (jaxgemm.measure): what ran is
        # the measured pick, not the choice before it.
        ran = choice(bp, dtype_name, backend, variant, ops)
        if ran is not None and ran != picked:
          row.update(chosen=describe_choice(ran), config=ran.config.to_json())
    if finish is not None:
      finish(row)
    emit(row)
  del bufs, refs, ref_compiled
  return rows


# A kernel's result may be as far from the check's as XLA's own is, and this much more:
# the gate catches wrong kernels, and one as accurate as XLA's program is not wrong. In
# the held-out run at 91d9da4 (H100, seed 453428995) XLA's own fwd+bwd of
# relu(x @ w + b) at 11761x311x24 in fp16 read 0.0135 against the float64 check, over
# the 0.005 gate, and auto (running XLA's forward) 0.0136.
REF_ERROR_FACTOR = 1.25


def gate(tolerance: float, xla_error) -> float:
  """The correctness bound of a kernel's row: the dtype's `tolerance`, or
  `REF_ERROR_FACTOR` times XLA's own error against the check where that is larger.

  >>> gate(0.005, 0.0135)
  0.016875
  >>> gate(0.005, 0.0)
  0.005
  """
  try:
    xla_error = float(xla_error)
  except (TypeError, ValueError):
    return tolerance
  return max(tolerance, REF_ERROR_FACTOR * xla_error) if math.isfinite(xla_error) else tolerance


def _run_kernel(ctx: Context, bp, dtype_name, row, make_fn, bufs, refs, n_rot, ref_compiled,
                key, arity=2, solo_ref_ms=None, tol=None):
  """Compile, run, check against XLA, then time one kernel (paired with XLA's
  dot, `ref_compiled`); fills `row`.

  key: the (backend, variant) whose interpreted speed on a CPU this call measures.
  solo_ref_ms: time the kernel alone, and compare it with this (the reference's
  median at the problem's start) instead of pairing.
  tol: the correctness gate's bound (default: the dtype's, `TOLERANCE`).
  """
  backend, variant = row["backend"], row["variant"]
  tol = TOLERANCE[dtype_name] if tol is None else tol
  try:
    fn = make_fn(bp, dtype_name, backend, variant)
    compiled, outs, c_s, f_s = _compile_and_run(fn, bufs, n_rot, arity)
  except Exception as e:  # noqa: BLE001
    unsupported = is_not_implemented(e)
    row.update(status=STATUS_UNSUPPORTED if unsupported else STATUS_ERROR, note=short_error(e))
    if not unsupported and ctx.verbose:
      traceback.print_exc()
    return
  row.update(compile_s=c_s, first_run_s=f_s)
  ctx.call_s[key] = max(ctx.call_s.get(key, 0.0), f_s / n_rot)
  try:
    err = rel_error(outs, refs)
    del outs
    row["error"] = err
    if not (err <= tol):   # also catches nan
      row.update(status=STATUS_FAIL,
                 note=f"wrong result: relative Frobenius error {err:.3g} "
                      f"> tolerance {tol:g} against the reference; not timed")
      return
    budget = ctx.cpu_call_budget_s
    if not ctx.on_gpu and budget < f_s / n_rot <= 3 * budget:
      # The first interpreted call may hold one-time set-up: judge by a second one.
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*bufs))
      f_s = min(f_s, time.perf_counter() - t0)
      ctx.call_s[key] = f_s / n_rot
    if not ctx.on_gpu and f_s / n_rot > budget:
      ctx.slow[key] = f_s / n_rot
      row.update(status=STATUS_SKIPPED,
                 note=f"correct, but not timed: one interpreted call took "
                      f"{f_s:.1f} s (CPU budget {budget:g} s per call)")
      return
    if solo_ref_ms is not None:   # a reference too slow to pair (`Measured.pair_max_ref_ms`)
      stats = summarize([t / n_rot for t in ctx.timer.time(compiled, bufs, ctx.iters)])
      row.update(status=STATUS_OK, timer=ctx.timer.label,
                 **_metrics(ctx, bp, dtype_name, stats, solo_ref_ms))
      row["note"] = "; ".join(filter(None, [row.get("note"), (
          f"timed alone: XLA's reference takes {solo_ref_ms:.3g} ms a call, compared with "
          "its median at the problem's start")]))
      return
    kernel_ms, ref_ms = time_paired(ctx.timer, compiled, ref_compiled, bufs, ctx.iters)
    stats = summarize([t / n_rot for t in kernel_ms])
    ref_median = summarize([t / n_rot for t in ref_ms])["median_ms"]
    row.update(status=STATUS_OK, timer=ctx.timer.label,
               **_metrics(ctx, bp, dtype_name, stats, ref_median))
  except Exception as e:  # noqa: BLE001
    row.update(status=STATUS_UNSUPPORTED if is_not_implemented(e) else STATUS_ERROR,
               note=short_error(e))


def excluded(patterns, backend: str, variant: str, problem: str) -> bool:
  """--exclude: 'backend/variant' or 'backend/variant@problem', shell-style globs."""
  for pat in patterns or ():
    who, _, prob = pat.partition("@")
    if "/" not in who:
      who += "/*"
    if fnmatch.fnmatchcase(f"{backend}/{variant}", who) and fnmatch.fnmatchcase(problem, prob or "*"):
      return True
  return False


class Watchdog:
  """Ends a run whose kernel hangs, keeping what was measured.

  A kernel that never returns (a deadlocked GPU kernel, an interpreter stuck
  in a callback) cannot be interrupted from Python. After `ctx.kernel_timeout_s`
  this records the kernel as an `error` row saying it hung, lets the run
  write its report (`ctx.on_hang`), and exits the process with status 3.
  """

  def __init__(self, ctx: Context, row: dict, what: str, factor: float = 1.0):
    self.ctx, self.row, self.what, self.factor = ctx, row, what, factor
    self._timer = None

  def _fire(self):
    t = self.ctx.kernel_timeout_s * self.factor
    msg = (f"{self.what} did not finish within {t:g} s (--kernel-timeout): hung? "
           "Recorded as an error; rerun with --exclude to skip it.")
    sys.stdout.write(f"\nTIMEOUT: {msg}\n")
    sys.stdout.flush()
    self.row.update(status=STATUS_ERROR, note=f"timeout: {msg}")
    try:
      self.ctx.emit(self.row)
      if self.ctx.on_hang is not None:
        self.ctx.on_hang()
    finally:
      sys.stdout.flush()
      os._exit(3)

  def __enter__(self):
    if self.ctx.kernel_timeout_s:
      self._timer = threading.Timer(self.ctx.kernel_timeout_s * self.factor, self._fire)
      self._timer.daemon = True
      self._timer.start()
    return self

  def __exit__(self, *exc):
    if self._timer is not None:
      self._timer.cancel()
    return False


def setup_triton_cache():
  """Triton needs a writable cache dir; some images set TRITON_CACHE_DIR=''."""
  try:
    import triton  # noqa: PLC0415
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and not knobs.cache.dir:
      d = Path(__file__).resolve().parent.parent / ".triton-cache"
      d.mkdir(exist_ok=True)
      knobs.cache.dir = str(d)
  except Exception:  # noqa: BLE001 (no triton, or an older one: nothing to do)
    pass


def measure_copy_bandwidth(timer: Timer, platform: str, iters: int) -> tuple[float, str]:
  """GB/s of a large device-to-device copy (read + write of 1 GiB on a GPU)."""
  n = 2**28 if platform == "gpu" else 2**22     # float32 elements: 1 GiB / 16 MiB
  x = jax.block_until_ready(jax.random.normal(jax.random.key(1), (n,), jnp.float32))
  f = jax.jit(lambda x: -x).lower(x).compile()   # one elementwise kernel: read n, write n
  jax.block_until_ready(f(x))
  stats = summarize(timer.time(f, (x,), iters))
  gbps = 2 * 4 * n / (stats["median_ms"] * 1e-3) / 1e9
  del x
  return gbps, f"negate of {4 * n / 2**20:.0f} MiB float32 (read + write), median of {iters}"


# ---------------------------------------------------------------- progress

class Progress:
  """A progress bar per suite: tqdm when importable, else a printed line."""

  def __init__(self, total: int, desc: str, stream=sys.stdout):
    self.total, self.desc, self.n, self.stream = total, desc, 0, stream
    self._bar = None
    self._t0 = time.perf_counter()
    try:
      from tqdm import tqdm  # noqa: PLC0415 (optional)
      self._bar = tqdm(total=total, desc=desc, unit="run", file=stream, leave=True)
    except ImportError:
      pass

  def update(self, what: str = ""):
    self.n += 1
    if self._bar is not None:
      self._bar.set_postfix_str(what[:40])
      self._bar.update(1)
      return
    el = time.perf_counter() - self._t0
    width = 24
    filled = int(width * self.n / max(self.total, 1))
    self.stream.write(f"  [{self.desc}] [{'#' * filled}{'.' * (width - filled)}] "
                      f"{self.n}/{self.total} {el:6.1f}s {what}\n")
    self.stream.flush()

  def write(self, msg: str):
    if self._bar is not None:
      self._bar.write(msg)
    else:
      self.stream.write(msg + "\n")
      self.stream.flush()

  def close(self):
    if self._bar is not None:
      self._bar.close()


@dataclasses.dataclass(frozen=True)
class SuiteOptions:
  """What a suite's runner (`run_suite` of the module its `entry.Suite.runner` names) takes
  from the command line besides the run's `Context`."""

  quick: bool = False
  only: tuple[str, ...] = ()          # --only's globs of problem names
  training_steps: int | None = None   # --training-steps
  out_dir: Path | None = None         # the run's folder

  def runs(self, name: str) -> bool:
    """Whether --only lets the problem (or training step) `name` run."""
    return not self.only or any(fnmatch.fnmatch(name, g) for g in self.only)


def run_suite(ctx: "Context", suite: str, probs: list, backends: list[str], variants_policy,
              options: SuiteOptions) -> list[dict]:
  """A GEMM suite of matmul's (bench/ops/matmul.py): every problem (`run_gemm_suite`)."""
  return run_gemm_suite(ctx, suite, probs, backends, variants_policy)


def run_gemm_suite(ctx: Context, suite: str, probs: list[P.BenchProblem], backends: list[str],
                   variants_policy, make_fn: Callable | None = None,
                   ops: Measured = GEMM) -> list[dict]:
  """Every problem of a suite (`ops`: of matmul, or another op's `Measured`)."""
  bar = Progress(len(probs), suite)
  log = ctx.log
  ctx.log = bar.write
  rows = []
  try:
    for bp in probs:
      if ctx.out_of_time():
        row = base_row(ctx, bp.suite, "gemm", REF, ops.ref_variant(bp), bp,
                       bp.dtype or ctx.dtype_name)
        row.update(status=STATUS_SKIPPED, note=f"not run: --time-budget {ctx.time_budget_s:g} s spent")
        ctx.emit(row)
        rows.append(row)
        bar.update(f"{bp.name} (out of time)")
        continue
      kernels = ops.kernels(bp, backends, variants_policy, bp.dtype or ctx.dtype_name,
                            slow={} if ctx.on_gpu else ctx.slow, best_seen=ctx.best_seen)
      r = run_problem(ctx, bp, kernels, make_fn, ops)
      rows.extend(r)
      bar.write(one_line(bp, r))
      bar.update(bp.name)
  finally:
    ctx.log = log
    bar.close()
  return rows


def one_line(bp: P.BenchProblem, rows: list[dict]) -> str:
  """A problem's result in one printed line."""
  parts = []
  for r in rows:
    who = REF if r["backend"] == REF else f"{r['backend']}/{r['variant']}"
    if r["status"] == STATUS_OK:
      t = r["tflops"]
      t = f"{t:.1f}" if t >= 1 else f"{t:.3g}"
      if r["backend"] == REF:
        parts.append(f"{who} {t} TFLOP/s")
      else:
        s = r["speedup_vs_xla"]
        parts.append(f"{who} {t} ({s:.2f}x)" if s >= 0.1 else f"{who} {t} ({s:.2g}x)")
    else:
      parts.append(f"{who} {r['status'].upper()}")
  return f"    {bp.name:<28} {bp.size_label():>20} " + " | ".join(parts)
