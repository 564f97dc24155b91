"""Probe (GPU): the persistent rungs with one TMA ring across all of a CTA's tiles
(`ring.patch` beside this script, then applied to the working tree's
`kernels/pallas/warp_specialized.py`) against per-tile
`emit_pipeline_warp_specialized` pipelines (the kernel in main at eb1d282, copied
to an untracked `scratch/old_ws.py`), and XLA's dot.

To run it again: copy main's `kernels/pallas/warp_specialized.py` to
`scratch/old_ws.py`, then `git apply research/probes/pallas-2026-11-23b/ring.patch`.
The ring was not landed: see this directory's README.

C: correctness of the new kernel, rungs 3-5, odd shapes, transposes, batches,
   exact C, f32 out, one-K-step problems, forced stream-K splits; two fresh input
   sets each vs XLA's f32 dot; stream_k bit-for-bit deterministic.
T: CUPTI medians of 20: old and new interleaved, each timed twice, XLA first and last.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23b/probe_ring.py CT
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.probe_helpers import BE, guard, operands, prob, relerr, timeit, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import warp_specialized as new_ws

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "CT"
try:
  from scratch import old_ws
except ImportError:
  old_ws = None
VARIANTS = {"warp_specialized": False, "clusters": False, "stream_k": True}


def fn(mod, p, v, cfg=None):
  cfg = cfg or BE.default_config(p, v)
  cl = (cfg.cluster_m, cfg.cluster_n) if v != "warp_specialized" else (1, 1)
  return jax.jit(lambda a, b: mod.persistent_call(a, b, p, cfg, False, *cl,
                                                  stream_k=VARIANTS[v]))


if "C" in sections:
  print("== C: correctness of the ring kernel ==", flush=True)
  cases = [((1, 512, 384, 320), False, False, jnp.bfloat16, None),
           ((1, 4095, 4093, 4097), False, False, jnp.bfloat16, None),
           ((2, 1000, 520, 777), True, False, jnp.float16, None),
           ((1, 700, 1030, 333), False, True, jnp.bfloat16, None),
           ((3, 256, 264, 200), True, True, jnp.float16, None),
           ((1, 128, 2048, 1024), False, False, jnp.bfloat16, None),
           ((1, 33, 40, 24), False, True, jnp.bfloat16, None),
           ((1, 300, 500, 64), False, False, jnp.bfloat16, None),      # one K step
           ((2, 1000, 1001, 999), False, False, jnp.bfloat16, jnp.float32),
           ((1, 8192, 14336, 4096), False, False, jnp.bfloat16, None),  # stream-K splits
           ((2, 3000, 2500, 1024), True, True, jnp.bfloat16, None)]
  bad = 0
  for shape, ta, tb, dt, out in cases:
    p = prob(*shape, ta, tb, dt, out)
    for v in VARIANTS:
      def check(p=p, v=v):
        global bad
        f = fn(new_ws, p, v)
        errs, same = [], True
        for seed in (31, 32):
          a, b = operands(p, seed)
          c1 = f(a, b)
          errs.append(relerr(c1, xla_fn(p)(a, b)))
          same &= bool(np.array_equal(np.asarray(c1), np.asarray(f(a, b))))
        ok = max(errs) < 1e-2 and same and c1.shape == (p.batch, p.m, p.n)
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} {v:17s} {p.describe():46s} relerr={max(errs):.2e} "
              f"deterministic={same}", flush=True)
      guard(f"{v} {p.describe()}", check)
  print(f"C: {bad} bad, t={time.time() - T0:.0f}s", flush=True)

if "T" in sections:
  print("== T: TFLOP/s (CUPTI median of 20), ratio vs XLA's dot in this process ==", flush=True)
  problems = [("8192^3", prob(1, 8192, 8192, 8192)),
              ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
              ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
              ("4096^3", prob(1, 4096, 4096, 4096)),
              ("bwd A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True)),
              ("bwd A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True)),
              ("4095x4097x4093", prob(1, 4095, 4093, 4097)),
              ("128x8192x8192", prob(1, 128, 8192, 8192))]
  timed = sys.argv[2].split(",") if len(sys.argv) > 2 else ["clusters", "stream_k"]
  for name, p in problems:
    a, b = operands(p, 1)
    tx = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla            {p.flops / tx / 1e9:7.1f}  {BE.default_config(p, 'clusters')}",
          flush=True)
    fns = {}
    for v in timed:
      fns[f"{v}/new"] = fn(new_ws, p, v)
      if old_ws:
        fns[f"{v}/old"] = fn(old_ws, p, v)
    for rep in (1, 2):
      for label, f in fns.items():
        def run(label=label, f=f, rep=rep):
          t = timeit(f, a, b)
          print(f"{name:18s} {label:22s} {p.flops / t / 1e9:7.1f} {tx / t:6.3f}x  "
                f"{t * 1e3:8.1f} us  (rep {rep})", flush=True)
        guard(f"{name} {label}", run)
    tx2 = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla again      {p.flops / tx2 / 1e9:7.1f}", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
