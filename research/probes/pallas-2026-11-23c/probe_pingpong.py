"""Probe (GPU): rung 6, `pingpong` (consumers on alternate whole tiles), against
the cooperative `clusters` / `stream_k` defaults and XLA's dot.

C: correctness of pingpong (default config and variations): odd shapes,
   transposes, batches, exact C, f32 out, one K step, cluster_m=2; two fresh
   input sets each vs XLA's f32 dot; bit-for-bit repeatable.
T: CUPTI medians of 20, each kernel timed twice, XLA first and last.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23c/probe_pingpong.py CT
"""
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.probe_helpers import BE, guard, kernel, operands, prob, relerr, timeit, xla2d_fn, xla_fn

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "CT"


def variations(p):
  d = BE.default_config(p, "pingpong")
  return {"default": d,
          "minor_m": dataclasses.replace(d, grid_minor_m=True),
          "cm2": dataclasses.replace(d, cluster_m=2, cluster_n=1),
          "s5": dataclasses.replace(d, max_concurrent_steps=5),
          "g16": dataclasses.replace(d, grid_group=16)}


if "C" in sections:
  print("== C: correctness of pingpong ==", flush=True)
  cases = [((1, 512, 384, 320), False, False, jnp.bfloat16, None),
           ((1, 4095, 4093, 4097), False, False, jnp.bfloat16, None),
           ((2, 1000, 520, 777), True, False, jnp.float16, None),
           ((1, 700, 1030, 333), False, True, jnp.bfloat16, None),
           ((3, 256, 264, 200), True, True, jnp.float16, None),
           ((1, 128, 2048, 1024), False, False, jnp.bfloat16, None),
           ((1, 33, 40, 24), False, True, jnp.bfloat16, None),
           ((1, 300, 500, 64), False, False, jnp.bfloat16, None),      # one K step
           ((2, 1000, 1001, 999), False, False, jnp.bfloat16, jnp.float32),
           ((1, 8192, 14336, 4096), False, False, jnp.bfloat16, None),
           ((2, 3000, 2500, 1024), True, True, jnp.bfloat16, None)]
  bad = 0
  for shape, ta, tb, dt, out in cases:
    p = prob(*shape, ta, tb, dt, out)
    for name, cfg in variations(p).items():
      if name not in ("default", "cm2"):
        continue
      def check(p=p, cfg=cfg, name=name):
        global bad
        BE.check(p, "pingpong", cfg)
        f = kernel(p, "pingpong", cfg)
        errs, same = [], True
        for seed in (31, 32):
          a, b = operands(p, seed)
          c1 = f(a, b)
          errs.append(relerr(c1, xla_fn(p)(a, b)))
          same &= bool(np.array_equal(np.asarray(c1), np.asarray(f(a, b))))
        ok = max(errs) < 1e-2 and same and c1.shape == (p.batch, p.m, p.n)
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} pingpong/{name:8s} {p.describe():46s} "
              f"relerr={max(errs):.2e} repeatable={same}", flush=True)
      guard(f"pingpong/{name} {p.describe()}", check)
  print(f"C: {bad} bad, t={time.time() - T0:.0f}s", flush=True)

if "T" in sections:
  print("== T: TFLOP/s (CUPTI median of 20), ratio vs XLA's dot in this process ==", flush=True)
  problems = [("8192^3", prob(1, 8192, 8192, 8192)),
              ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
              ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
              ("4096^3", prob(1, 4096, 4096, 4096)),
              ("bwd A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True)),
              ("bwd A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True)),
              ("4095x4097x4093", prob(1, 4095, 4093, 4097))]
  for name, p in problems:
    a, b = operands(p, 1)
    tx = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla                  {p.flops / tx / 1e9:7.1f}", flush=True)
    fns = {"clusters": kernel(p, "clusters", BE.default_config(p, "clusters")),
           "stream_k": kernel(p, "stream_k", BE.default_config(p, "stream_k"))}
    for vname, cfg in variations(p).items():
      fns[f"pingpong/{vname}"] = kernel(p, "pingpong", cfg)
    for rep in (1, 2):
      for label, f in fns.items():
        def run(label=label, f=f, rep=rep):
          t = timeit(f, a, b)
          print(f"{name:18s} {label:20s} {p.flops / t / 1e9:7.1f} {tx / t:6.3f}x  "
                f"{t * 1e3:8.1f} us  (rep {rep})", flush=True)
        guard(f"{name} {label}", run)
    tx2 = timeit(xla2d_fn(p), a, b)
    print(f"{name:18s} xla again            {p.flops / tx2 / 1e9:7.1f}", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
