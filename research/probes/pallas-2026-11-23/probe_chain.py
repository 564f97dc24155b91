"""Probe (GPU): chained per-tile pipelines, with and without stream-K.

probe_stream_k.log showed stream-K losing on long K (its segments run at
different K offsets, so the workers stop sharing operand tiles in L2) and
both rungs paying about 1 us per tile at tile boundaries. Here the
persistent kernel's per-tile pipelines are chained (`pipeline_state`: the
producer runs on into the next tile's loads; Mosaic GPU then needs the
stage released without delay), and each combination is timed twice,
interleaved, against XLA's dot in the same process:

  clusters        rung 4 as it stands (delayed release, unchained)
  clusters+chain  rung 4 with chained tiles
  stream_k        rung 5 as it stands
  stream_k+chain  rung 5 with its whole tiles chained

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23/probe_chain.py
"""
import time

import jax

from research.probe_helpers import BE, guard, operands, prob, relerr, timeit, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import warp_specialized as ws

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)

VARIANTS = {"clusters": dict(), "clusters+chain": dict(chain=True),
            "stream_k": dict(stream_k=True), "stream_k+chain": dict(stream_k=True, chain=True)}


def fn(p, flags):
  cfg = BE.default_config(p, "clusters")
  return jax.jit(lambda a, b: ws.persistent_call(a, b, p, cfg, False, cfg.cluster_m,
                                                 cfg.cluster_n, **flags))


problems = [("8192^3", prob(1, 8192, 8192, 8192)),
            ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
            ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
            ("4096^3", prob(1, 4096, 4096, 4096)),
            ("bwd A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True)),
            ("bwd A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True)),
            ("u4095x4096x4093", prob(1, 4095, 4093, 4096)),
            ("2x3000x1024x2500", prob(2, 3000, 2500, 1024, ta=True, tb=True))]
print("== TFLOP/s (CUPTI median of 20), ratio vs XLA's dot in this process ==", flush=True)
for name, p in problems:
  a, b = operands(p, 1)
  tx = timeit(xla2d_fn(p), a, b) if p.batch == 1 else None
  ref = xla_fn(p)(a, b)
  if tx:
    print(f"{name:18s} xla            {p.flops / tx / 1e9:7.1f}", flush=True)
  fns = {}
  for v, flags in VARIANTS.items():
    def build(v=v, flags=flags):
      f = fn(p, flags)
      e = relerr(f(a, b), ref)
      print(f"{name:18s} {v:14s} err={e:.1e}{'' if e < 1e-2 else '  BAD'}", flush=True)
      fns[v] = f
    guard(f"{name} {v}", build)
  for rep in (1, 2):
    for v, f in fns.items():
      def run(v=v, f=f, rep=rep):
        t = timeit(f, a, b)
        ratio = f"{tx / t:6.3f}x" if tx else ""
        print(f"{name:18s} {v:14s} {p.flops / t / 1e9:7.1f} {ratio} {t * 1e3:8.1f} us (rep {rep})",
              flush=True)
      guard(f"{name} {v}", run)
  if tx:
    print(f"{name:18s} xla again      {p.flops / timeit(xla2d_fn(p), a, b) / 1e9:7.1f}", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
