"""Pallas development probe (GPU only): correctness + CUPTI timing of every rung vs XLA's dot.

Not the benchmark (that is `python -m bench`): the sweeps that chose the
Pallas defaults. Its log is research/probes/h200-pallas-ladder-2026-11-22-probe3.log,
made with `make gpu-env && cd /tmp && python3 <repo>/bench/pallas_probe.py all 200` (its
helpers now live in `research/probe_helpers.py`: run it as
`python3 research/pallas_probe.py all 200` from the repository root; the lines below
put the root on sys.path).
"""
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench, research
import time
import jax, jax.numpy as jnp
from jaxgemm.ops.matmul import pallas as P
from research.probe_helpers import (BE, ITERS, operands as ops, pallas_fn, prob, relerr, timeit,
                                    xla2d_fn, xla_fn)
T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)

mode = sys.argv[1] if len(sys.argv) > 1 else "all"
variants = P.VARIANTS
if mode in ("all", "check"):
  print("== correctness (default configs) vs XLA f32-acc ==", flush=True)
  for shape, ta, tb, dt in [((1, 512, 384, 320), False, False, jnp.bfloat16),
                            ((1, 4095, 4093, 4097), False, False, jnp.bfloat16),
                            ((2, 1000, 520, 777), True, False, jnp.float16),
                            ((1, 700, 1030, 333), False, True, jnp.bfloat16),
                            ((3, 256, 264, 200), True, True, jnp.float16),
                            ((1, 128, 2048, 1024), False, False, jnp.bfloat16)]:
    p = prob(*shape, ta, tb, dt)
    a, b = ops(p)
    ref = xla_fn(p)(a, b)
    for v in variants:
      try:
        cfg = BE.default_config(p, v); BE.check(p, v, cfg)
        e = relerr(pallas_fn(p, v, cfg)(a, b), ref)
        print(f"{'OK ' if e < 1e-2 else 'BAD'} {v:17s} {p.describe():40s} relerr={e:.2e}", flush=True)
      except Exception as ex:
        print(f"ERR {v:17s} {p.describe()}: {type(ex).__name__}: {str(ex)[:1500]}", flush=True)

PROBLEMS = [("8192^3", prob(1, 8192, 8192, 8192)), ("4096^3", prob(1, 4096, 4096, 4096)),
            ("4095x4097x4093", prob(1, 4095, 4093, 4097)),
            ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
            ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
            ("bwd A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True)),
            ("bwd A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True)),
            ("128x8192x8192", prob(1, 128, 8192, 8192))]
if mode in ("all", "time"):
  print("== timing: TFLOP/s (CUPTI median of %d), ratio vs XLA dot ==" % ITERS, flush=True)
  for name, p in PROBLEMS:
    a, b = ops(p, 1)
    try:
      tx = timeit(xla2d_fn(p), a, b)
      print(f"{name:18s} {'xla':17s} {p.flops / tx / 1e9:7.1f} TFLOP/s", flush=True)
    except Exception as ex:
      print(f"{name:18s} xla ERR {ex}", flush=True); continue
    ref = xla_fn(p)(a, b)
    for v in variants:
      try:
        cfg = BE.default_config(p, v)
        f = pallas_fn(p, v, cfg)
        e = relerr(f(a, b), ref)
        t = timeit(f, a, b)
        print(f"{name:18s} {v:17s} {p.flops / t / 1e9:7.1f} TFLOP/s  {tx / t:5.2f}x  err={e:.1e}  {cfg}", flush=True)
      except Exception as ex:
        print(f"{name:18s} {v:17s} ERR {type(ex).__name__}: {str(ex)[:800]}", flush=True)
    if time.time() - T0 > float(sys.argv[2] if len(sys.argv) > 2 else 400):
      print("time budget reached", flush=True); break
print(f"done in {time.time() - T0:.0f}s", flush=True)

if mode in ("all", "sweep"):
  print("== sweep ==", flush=True)
  C = P.PallasConfig
  sweeps = [
    ("128x8192x8192", prob(1, 128, 8192, 8192), [
      ("clusters", C(tile_m=128, tile_n=64, tile_k=128, max_concurrent_steps=4, cluster_n=2)),
      ("warp_specialized", C(tile_m=128, tile_n=64, tile_k=128, max_concurrent_steps=4)),
      ("pipelined", C(tile_m=128, tile_n=64, tile_k=128, max_concurrent_steps=5)),
    ]),
  ]
  for name, p, cfgs in sweeps:
    a, b = ops(p, 2)
    tx = timeit(xla2d_fn(p), a, b); ref = xla_fn(p)(a, b)
    print(f"{name:18s} xla {p.flops / tx / 1e9:7.1f}", flush=True)
    for v, cfg in cfgs:
      try:
        BE.check(p, v, cfg); f = pallas_fn(p, v, cfg); e = relerr(f(a, b), ref); t = timeit(f, a, b)
        print(f"{name:18s} {v:17s} {p.flops / t / 1e9:7.1f} {tx / t:5.2f}x err={e:.1e} {cfg}", flush=True)
      except Exception as ex:
        print(f"{name:18s} {v} ERR {type(ex).__name__}: {str(ex)[:300]} {cfg}", flush=True)
  print(f"sweep done at {time.time() - T0:.0f}s", flush=True)
