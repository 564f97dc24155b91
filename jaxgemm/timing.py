"""Timers: CUPTI kernel time on a GPU, wall clock as a labelled fallback.

`Timer.time(compiled, args, iters)` runs an already compiled, already warmed
up function `iters` more times and returns the per-iteration times in
milliseconds. On a GPU these are CUPTI's kernel times summed over the kernels
one call launches (`jax.experimental.mosaic.gpu.profiler.measure`, which does
one more warm-up call of its own before it starts recording); launch gaps
and host overhead are not in them. Elsewhere, or if CUPTI cannot be used,
they are wall-clock times of `block_until_ready(f(*args))`, and the timer's
label says so on every row. `time_paired` times a kernel interleaved with a
reference (XLA's dot), as the benchmark and the autotuner compare them.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from typing import Callable, ContextManager

import jax
import numpy as np

CUPTI = "cupti"


def platform_of(device=None) -> str:
  """'gpu' for CUDA/ROCm devices (whatever jax calls them), else the platform name.

  device: a jax.Device (default: jax's first device).
  """
  p = (device or jax.devices()[0]).platform
  return "gpu" if p in ("gpu", "cuda", "rocm") else p
WALL = "wallclock"

# L2 per device kind: inputs of a problem smaller than about twice this rotate
# among copies, so that a timed call does not find its operands in L2.
L2_BYTES = {"H200": 60 * 2**20, "H100": 50 * 2**20}
DEFAULT_L2_BYTES = 60 * 2**20
MAX_ROTATE = 32


def l2_bytes(device_kind: str) -> int:
  """The L2 size of a device kind (`jax.Device.device_kind`); 60 MiB if unknown."""
  for d, b in L2_BYTES.items():
    if d in device_kind:
      return b
  return DEFAULT_L2_BYTES


def rotation(set_bytes: int, l2_bytes: int, max_rotate: int = MAX_ROTATE) -> int:
  """How many input sets to rotate among so that they do not sit in L2.

  A problem whose operands and output take less than about twice the L2 cycles
  through enough independent copies to cover twice the L2 (capped).
  """
  if set_bytes <= 0 or set_bytes >= 2 * l2_bytes:
    return 1
  return max(1, min(max_rotate, math.ceil(2 * l2_bytes / set_bytes)))


def rotated(fn: Callable, n: int, arity: int = 2) -> Callable:
  """f(a0, b0, a1, b1, ...) -> (fn(a0, b0), fn(a1, b1), ...), for one jit: a
  timed call of f runs `n` problems, one per input set of `arity` operands."""
  def f(*bufs):
    return tuple(fn(*bufs[arity * i:arity * (i + 1)]) for i in range(n))
  return f


def summarize(samples_ms) -> dict[str, float]:
  """Median and spread of a list of times (ms)."""
  x = np.asarray(samples_ms, dtype=np.float64)
  p10, p25, p50, p75, p90 = np.percentile(x, [10, 25, 50, 75, 90])
  return {"median_ms": float(p50), "p10_ms": float(p10), "p90_ms": float(p90),
          "iqr_ms": float(p75 - p25), "min_ms": float(x.min()), "n": int(x.size)}


def _wall(f, args, iters):
  out = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    out.append((time.perf_counter() - t0) * 1e3)
  return out


def _as_list(timings, iters) -> list[float]:
  """measure()'s timings as `iters` floats (ms); it returns a float for one."""
  if timings is None:
    raise RuntimeError("CUPTI recorded no kernel launches (nothing ran on the GPU?)")
  if isinstance(timings, (int, float)):
    timings = [timings]
  out = []
  for t in timings:
    if isinstance(t, (list, tuple)):      # per-kernel (name, ms) pairs
      t = sum(x[1] if isinstance(x, (list, tuple)) else x for x in t)
    out.append(float(t))
  if len(out) != iters:
    raise RuntimeError(f"CUPTI returned {len(out)} timings for {iters} iterations")
  return out


class Timer:
  """Picks CUPTI on a GPU (if its profiler imports), else wall clock.

  device_lock: a context manager factory held around everything the autotuner runs on
  the device (XLA's compile, which autotunes on it, every call and every timing), so that
  processes sharing one GPU compile their kernels side by side and time one at a time
  (research/sweep/sweep.py's workers); none by default.
  """

  def __init__(self, platform: str, force_wall: bool = False,
               device_lock: Callable[[], ContextManager] | None = None):
    self.platform = platform
    self.owns_device = device_lock or contextlib.nullcontext
    self._measure = None
    self._takes_iterations = False
    self._worked = False
    self.fallback_reason = ""
    if platform == "gpu" and not force_wall:
      try:
        from jax.experimental.mosaic.gpu import profiler  # noqa: PLC0415
        self._measure = profiler.measure
        params = inspect.signature(profiler.measure).parameters
        self._takes_iterations = "iterations" in params
      except Exception as e:  # noqa: BLE001 (any import failure means: no CUPTI)
        self.fallback_reason = f"CUPTI profiler unavailable: {type(e).__name__}: {e}"
    elif platform == "gpu":
      self.fallback_reason = "wall clock forced (--wallclock)"
    elif platform != "gpu":
      self.fallback_reason = f"no GPU ({platform})"

  @property
  def label(self) -> str:
    if self._measure is not None:
      return CUPTI
    return f"{WALL} ({self.fallback_reason})" if self.fallback_reason else WALL

  @property
  def is_device_timer(self) -> bool:
    return self._measure is not None

  def time(self, f, args, iters: int, chunk: int | None = None) -> list[float]:
    """`iters` per-call times (ms) of f(*args); f is warmed up by the caller.

    chunk: at most this many calls per CUPTI measurement. `measure` keeps every call's
    outputs alive until it returns, so a function with large outputs (a training step
    returns the parameters and optimizer state: 5.2 GB for the fp8 suite's model) is
    measured a few calls at a time; 20 at once ran an 80 GB H100 and a 139 GB H200 out
    of memory (the 4 x H200 runs' run2 at 6b50250).
    """
    if self._measure is None:
      return _wall(f, args, iters)
    if chunk and chunk < iters:
      out = []
      while len(out) < iters:
        out += self.time(f, args, min(chunk, iters - len(out)))
      return out
    try:
      if self._takes_iterations:
        _, timings = self._measure(f, iterations=iters)(*args)
        out = _as_list(timings, iters)
      else:
        # Older profilers time one call per measure() (plus a warm-up each).
        out = []
        for _ in range(iters):
          _, t = self._measure(f)(*args)
          out.extend(_as_list(t, 1))
      self._worked = True
      return out
    except RuntimeError as e:
      msg = str(e)
      about_this_function = any(w in msg for w in ("divisible", "consistent", "no kernel"))
      if "not supported" in msg or (not self._worked and not about_this_function):
        # CUPTI itself is unusable here: wall clock for the rest of the run, labelled.
        self.fallback_reason = f"CUPTI failed: {type(e).__name__}: {msg[:120]}"
        self._measure = None
        return _wall(f, args, iters)
      raise


# Each side of a paired timing runs in blocks of about this much GPU time. The
# H200 caps its power: after 15-70 ms of back-to-back GEMMs its clocks step
# down (4096x8192x57344: 4.7 ms a call for 15 calls, then 5.5-6.0), and blocks
# of ten such calls span the steps. So timed, XLA's dot against itself read
# 0.935x in the default run -23h and 0.97-1.01x in the probe; in 10 ms blocks
# 1.000x +- 0.001 on five shapes, three reps each
# (the paired-timing probe at 0834948, H200).
PAIR_BLOCK_MS = 10.0


def time_paired(timer: Timer, kernel, reference, args, iters: int,
                block_ms: float = PAIR_BLOCK_MS, chunk: int | None = None) -> tuple[list, list]:
  """(kernel's, reference's) per-call times (ms), `iters` each, interleaved.

  Both are already compiled and warmed up; both are called on `args`.

  Timed in alternating blocks, reference-kernel-kernel-reference and again,
  so a drift of the GPU's clocks during a problem weighs on both alike. Timed
  one after the other, the one timed first is favoured: in the Pallas probes
  XLA's dot, timed again after a dozen kernels, read 0.4-2% slower on the
  8192-sized problems (8192x14336x4096: 826.2 then 810.5 TFLOP/s, the Pallas exact-store and
  stream-K probe at 0834948; 8192x4096x14336:
  820.6 then 749.6, the ping-pong probe at 0834948).
  A block holds about `block_ms` of the reference's time (one untimed call of
  it first sizes them), from one call up to iters / 2, so calls of a few
  milliseconds alternate every few calls (`PAIR_BLOCK_MS`); `chunk` caps the
  calls of one measurement as in `Timer.time`.
  """
  estimate_ms = timer.time(reference, args, 1)[0]
  block = max(1, min(iters // 2, chunk or iters, round(block_ms / max(estimate_ms, 1e-6))))
  timed = {0: [], 1: []}                      # 0: the kernel, 1: the reference
  order = (1, 0, 0, 1)
  turn = 0
  while min(len(timed[0]), len(timed[1])) < iters:
    who = order[turn % 4]
    turn += 1
    calls = min(block, iters - len(timed[who]))
    if calls > 0:
      timed[who] += timer.time(reference if who else kernel, args, calls)
  return timed[0], timed[1]
