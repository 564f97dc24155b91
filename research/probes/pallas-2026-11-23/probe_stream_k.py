"""Probe (GPU): rung 5, `stream_k`, against rung 4, `clusters`, and XLA's dot.

S: correctness of stream_k where the split applies (the issue's shapes, both
   transposes, batches, an exact-C shape, fp16), two fresh input sets each,
   vs XLA's f32 dot; and determinism: the same inputs twice give the same bits.
T: CUPTI time of the issue's problems, clusters and stream_k interleaved and
   each timed twice (the spread of the two is the noise), XLA's dot first.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23/probe_stream_k.py
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.probe_helpers import BE, guard, operands, pallas_fn, prob, relerr, timeit, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import common, warp_specialized as ws

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "ST"


def schedule(p, v="stream_k"):
  cfg = BE.default_config(p, v)
  cl = cfg.tile_m * cfg.cluster_m, cfg.tile_n * cfg.cluster_n
  tiles = p.batch * common.cdiv(p.m, cl[0]) * common.cdiv(p.n, cl[1])
  k = common.round_up(p.k, common.col_multiple(p.dtype))
  workers = min(common.num_sms(False) // (cfg.cluster_m * cfg.cluster_n), tiles)
  return ws.plan_stream_k(tiles, workers, common.cdiv(k, cfg.tile_k))


if "S" in sections:
  print("== S: stream_k correctness and determinism ==", flush=True)
  cases = [((1, 8192, 8192, 8192), False, False, jnp.bfloat16),
           ((1, 8192, 14336, 4096), False, False, jnp.bfloat16),
           ((1, 8192, 4096, 14336), False, False, jnp.bfloat16),
           ((1, 4096, 4096, 4096), True, False, jnp.bfloat16),
           ((1, 4096, 4096, 4096), False, True, jnp.bfloat16),
           ((2, 3000, 2500, 1024), True, True, jnp.bfloat16),
           ((1, 4095, 4093, 4096), False, False, jnp.bfloat16),
           ((3, 1000, 1000, 512), False, False, jnp.float16)]
  bad = 0
  for shape, ta, tb, dt in cases:
    p = prob(*shape, ta, tb, dt)

    def check(p=p):
      global bad
      f = pallas_fn(p, "stream_k", BE.default_config(p, "stream_k"))
      errs, same = [], True
      for seed in (21, 22):
        a, b = operands(p, seed)
        c1 = f(a, b)
        errs.append(relerr(c1, xla_fn(p)(a, b)))
        same &= bool(np.array_equal(np.asarray(c1), np.asarray(f(a, b))))
      ok = max(errs) < 1e-2 and same
      bad += not ok
      print(f"{'OK ' if ok else 'BAD'} {p.describe():46s} relerr={max(errs):.2e} "
            f"deterministic={same} {schedule(p)}", flush=True)
    guard(p.describe(), check)
  print(f"S: {bad} bad, t={time.time() - T0:.0f}s", flush=True)

if "T" in sections:
  print("== T: TFLOP/s (CUPTI median of 20), ratio vs XLA's dot in this process ==", flush=True)
  problems = [("8192^3", prob(1, 8192, 8192, 8192)),
              ("4096^3", prob(1, 4096, 4096, 4096)),
              ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
              ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
              ("bwd A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True)),
              ("bwd A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True))]
  for name, p in problems:
    a, b = operands(p, 1)
    tx = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla       {p.flops / tx / 1e9:7.1f}   {schedule(p)}", flush=True)
    fns = {v: pallas_fn(p, v, BE.default_config(p, v)) for v in ("clusters", "stream_k")}
    for rep in (1, 2):
      for v, f in fns.items():
        def run(v=v, f=f, rep=rep):
          t = timeit(f, a, b)
          print(f"{name:18s} {v:9s} {p.flops / t / 1e9:7.1f} {tx / t:6.3f}x  {t * 1e3:8.1f} us"
                f"  (rep {rep})", flush=True)
        guard(f"{name} {v}", run)
    # XLA again at the end: its own drift over the problem's timings.
    tx2 = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla again {p.flops / tx2 / 1e9:7.1f}", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
