"""Probe (GPU): rung 5's split of only the last, partial round ("tail", SPLIT_ROUNDS=1)
against the split over the last two rounds ("spread", SPLIT_ROUNDS=2, main before this
probe) and against rung 4, `clusters`, with XLA's dot timed interleaved with each.

S: correctness of the tail split on the issue's shapes, transposes, batches, an
   exact-C shape and fp16 (two fresh input sets each, vs XLA's f32 dot), and
   determinism (the same inputs twice give the same bits).
T: `jaxgemm.timing.time_paired` (XLA, kernel, kernel, XLA; 40 calls each), two reps.
   Both splits are forced (MAX_STREAM_K_SHARE = 1) to see where each pays.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23f/probe_tail.py [S][T]
"""
import contextlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.probe_helpers import BE, guard, operands, pallas_fn, prob, relerr, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import common, warp_specialized as ws
from jaxgemm.timing import Timer, time_paired

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "ST"
ITERS = 40


@contextlib.contextmanager
def split(rounds):
  saved = ws.SPLIT_ROUNDS, ws.MAX_STREAM_K_SHARE
  ws.SPLIT_ROUNDS, ws.MAX_STREAM_K_SHARE = rounds, 1.0
  try:
    yield
  finally:
    ws.SPLIT_ROUNDS, ws.MAX_STREAM_K_SHARE = saved


def schedule(p):
  cfg = BE.default_config(p, "stream_k")
  tiles = p.batch * common.cdiv(p.m, cfg.tile_m * cfg.cluster_m) * common.cdiv(
      p.n, cfg.tile_n * cfg.cluster_n)
  k = common.round_up(p.k, common.col_multiple(p.dtype))
  workers = min(common.num_sms(False) // (cfg.cluster_m * cfg.cluster_n), tiles)
  return ws.plan_stream_k(tiles, workers, common.cdiv(k, cfg.tile_k))


def compiled(p, variant, rounds, a, b):
  """The variant's function, traced and compiled under `split(rounds)`."""
  f = pallas_fn(p, variant, BE.default_config(p, variant))
  with split(rounds):
    plan = schedule(p)
    jax.block_until_ready(f(a, b))
  return f, plan


if "S" in sections:
  print("== S: tail split correctness and determinism ==", flush=True)
  cases = [((1, 8192, 8192, 8192), False, False, jnp.bfloat16),
           ((1, 8192, 14336, 4096), False, False, jnp.bfloat16),
           ((1, 8192, 4096, 14336), False, False, jnp.bfloat16),
           ((1, 8192, 4096, 8192), True, False, jnp.bfloat16),
           ((1, 8192, 4096, 8192), False, True, jnp.bfloat16),
           ((2, 3000, 2500, 1024), True, True, jnp.bfloat16),
           ((1, 8191, 4093, 4096), False, False, jnp.bfloat16),
           ((4, 2048, 2000, 1024), False, False, jnp.float16)]
  bad = 0
  for shape, ta, tb, dt in cases:
    p = prob(*shape, ta, tb, dt)

    def check(p=p):
      global bad
      a, b = operands(p, 21)
      f, plan = compiled(p, "stream_k", 1, a, b)
      errs, same = [], True
      for seed in (21, 22):
        a, b = operands(p, seed)
        c1 = f(a, b)
        errs.append(relerr(c1, xla_fn(p)(a, b)))
        same &= bool(np.array_equal(np.asarray(c1), np.asarray(f(a, b))))
      ok = max(errs) < 1e-2 and same and plan is not None
      bad += not ok
      print(f"{'OK ' if ok else 'BAD'} {p.describe():46s} relerr={max(errs):.2e} "
            f"deterministic={same} {plan}", flush=True)
    guard(p.describe(), check)
  print(f"S: {bad} bad, t={time.time() - T0:.0f}s", flush=True)

if "T" in sections:
  print("== T: paired ratio to XLA's dot (median of 40 each), TFLOP/s ==", flush=True)
  timer = Timer("gpu")
  problems = [("8192^3", prob(1, 8192, 8192, 8192)),
              ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
              ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
              ("4096x8192x57344", prob(1, 4096, 57344, 8192)),
              ("8192x4096x28672", prob(1, 8192, 28672, 4096)),
              ("6144^3", prob(1, 6144, 6144, 6144)),
              ("8192x1024x8192", prob(1, 8192, 8192, 1024))]
  for name, p in problems:
    def run(name=name, p=p):
      a, b = operands(p, 1)
      xla = xla2d_fn(p)
      jax.block_until_ready(xla(a, b))
      fns = {"clusters": compiled(p, "clusters", 1, a, b)[0]}
      for label, rounds in (("tail", 1), ("spread", 2)):
        fns[label], plan = compiled(p, "stream_k", rounds, a, b)
        print(f"{name:16s} {label:6s} plan {plan}", flush=True)
      for rep in (1, 2):
        for label, f in fns.items():
          k_ms, x_ms = time_paired(timer, f, xla, (a, b), ITERS)
          k, x = statistics.median(k_ms), statistics.median(x_ms)
          print(f"{name:16s} {label:8s} {p.flops / k / 1e9:7.1f} TFLOP/s  xla "
                f"{p.flops / x / 1e9:7.1f}  {x / k:6.3f}x  {k * 1e3:8.1f} us (rep {rep})",
                flush=True)
    guard(name, run)
    print(f"t={time.time() - T0:.0f}s", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
