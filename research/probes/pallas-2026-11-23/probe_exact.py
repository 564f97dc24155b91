"""Probe (GPU): the persistent rungs storing C at its true shape (no XLA slice).

E: correctness of warp_specialized / clusters on shapes whose C is not
   TMA-describable (odd N, N = 8 mod 64, M not a multiple of 8, f32 out), on
   two fresh input sets each (a buffer left from the first call must not
   hide an element the second call does not write), vs XLA's f32 dot.
T: CUPTI time of the unaligned 4095x4097x4093 problem, the new kernel against
   the previous commit's (padded C + XLA slice; a copy under scratch/), and
   XLA's dot; then the aligned targets, new vs old, to show the refactor
   (pipeline refs pre-sliced to the tile) costs nothing there.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23/probe_exact.py
"""
import functools
import sys
import time

import jax
import jax.numpy as jnp

from research.probe_helpers import BE, guard, operands, pallas_fn, prob, relerr, timeit, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import common, warp_specialized as ws

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
try:
  from scratch.old_pallas import warp_specialized as old_ws
except ImportError:
  old_ws = None

sections = sys.argv[1] if len(sys.argv) > 1 else "ET"


def exact(p, v):
  cfg = BE.default_config(p, v)
  return (common.stores_exact(p, p.out_dtype)
          and ws.exact_store_fits(p.m, p.n, cfg.tile_m, cfg.tile_n,
                                  min(cfg.epi_tile_n, cfg.tile_n), p.out_dtype))


if "E" in sections:
  print("== E: correctness, C stored at its true shape ==", flush=True)
  cases = [((1, 4095, 4093, 4097), False, False, jnp.bfloat16, None),
           ((1, 4095, 4093, 4097), True, True, jnp.bfloat16, None),
           ((1, 4095, 4093, 4097), False, True, jnp.float16, None),
           ((1, 4095, 4093, 4097), True, False, jnp.bfloat16, None),
           ((2, 1000, 520, 777), True, False, jnp.float16, None),
           ((1, 700, 1030, 333), False, True, jnp.bfloat16, None),
           ((3, 256, 264, 200), True, True, jnp.float16, None),
           ((1, 190, 93, 40), False, False, jnp.bfloat16, None),
           ((1, 4096, 4100, 4096), False, False, jnp.bfloat16, None),
           ((1, 300, 130, 64), False, False, jnp.bfloat16, jnp.float32),
           ((1, 8190, 8190, 1000), False, False, jnp.bfloat16, None),
           ((4, 129, 1001, 515), False, True, jnp.bfloat16, None)]
  bad = 0
  for shape, ta, tb, dt, out in cases:
    p = prob(*shape, ta, tb, dt, out)
    for v in ("warp_specialized", "clusters"):
      def check(p=p, v=v):
        global bad
        f = pallas_fn(p, v, BE.default_config(p, v))
        errs = []
        for seed in (11, 12):
          a, b = operands(p, seed)
          errs.append(relerr(f(a, b), xla_fn(p)(a, b)))
        ok = max(errs) < 1e-2
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} {v:17s} {p.describe():44s} "
              f"{'exact ' if exact(p, v) else 'padded'} relerr={max(errs):.2e}", flush=True)
      guard(f"{v} {p.describe()}", check)
  print(f"E: {bad} bad, t={time.time() - T0:.0f}s", flush=True)


def old_fn(p, v):
  cfg = BE.default_config(p, v)
  cl = (cfg.cluster_m, cfg.cluster_n) if v == "clusters" else (1, 1)
  return jax.jit(lambda a, b: old_ws.persistent_call(a, b, p, cfg, False, *cl))


if "T" in sections:
  print("== T: timing (TFLOP/s, CUPTI median of 20; ratio vs XLA's dot here) ==", flush=True)
  problems = [("u4095x4097x4093", prob(1, 4095, 4093, 4097)),
              ("u8191x8193x8191", prob(1, 8191, 8191, 8193)),
              ("u2047x2049x2051", prob(1, 2047, 2051, 2049)),
              ("8192^3", prob(1, 8192, 8192, 8192)),
              ("4096^3", prob(1, 4096, 4096, 4096)),
              ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
              ("8192x14336x4096", prob(1, 8192, 4096, 14336))]
  for name, p in problems:
    a, b = operands(p, 1)
    tx = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla                  {p.flops / tx / 1e9:7.1f}", flush=True)
    ref = xla_fn(p)(a, b)
    for v in ("warp_specialized", "clusters"):
      for label, make in (("new", lambda: pallas_fn(p, v, BE.default_config(p, v))),
                          ("old", lambda: old_fn(p, v))):
        if label == "old" and old_ws is None:
          continue

        def run(make=make, label=label, v=v, p=p, a=a, b=b):
          f = make()
          e = relerr(f(a, b), ref)
          t = timeit(f, a, b)
          print(f"{name:18s} {v:17s} {label} {p.flops / t / 1e9:7.1f} {tx / t:6.3f}x "
                f"{t * 1e3:8.1f} us err={e:.1e}", flush=True)
        guard(f"{name} {v} {label}", run)
print(f"done in {time.time() - T0:.0f}s", flush=True)
