"""Probe (GPU): 8192x4096x14336 (the MLP up-projection) in 256x192 tiles, 3 stages.

Why: 256x128 tiles leave the last of 28 rounds 15% full (3584 CTA tiles on 132 SMs);
stream-K fills it but the run still reads 0.98x XLA, because each round is about 1%
slower than XLA's per-tile rate (README, "What is not done yet"). A 256x192 tile
(each consumer 128x192, 192 accumulator registers) moves a third less A per FLOP
from L2 and pays the epilogue's fixed drain over 1.5x the work, and 192 = 3 x 64
keeps the 128-byte swizzle (the 160-wide tile needed 64-byte swizzles and ran
slower: ../pallas-2026-11-23b/probe_tile160.log). It lowered at 4 stages only past
the SMEM limit (262208 bytes: ../pallas-2026-11-23b/probe_tile160_lower.log);
3 stages of (32 + 24) KB plus the epilogue slots fit. 14336 / 192 = 74.67, so the
last column of tiles is two-thirds full (0.45% of the work wasted).

PallasConfig allows only power-of-two tiles, so the probe sets tile_n past its
validation and calls the persistent kernel directly. Each config runs whole tiles
(sk=0) and with rung 5's last-round split (sk=1); XLA's dot and the table's
256x128 kernels are timed in the same process, with `jaxgemm.timing.time_paired`
(XLA, kernel, kernel, XLA; 40 calls each), two reps.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-24/probe_tile192.py [lower]
`lower` cross-lowers the configs for sm_90a on a CPU machine instead (no timing).
"""
import dataclasses
import statistics
import sys
import time

import jax

from research.probe_helpers import BE, guard, operands, prob, relerr, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import common, warp_specialized as ws
from jaxgemm.timing import Timer, time_paired

T0 = time.time()
LOWER = len(sys.argv) > 1 and sys.argv[1] == "lower"
print("jax", jax.__version__, jax.devices(), flush=True)


def config(**kw):
  cfg = BE.default_config(prob(1, 8192, 14336, 4096), "clusters")
  for k, v in kw.items():
    object.__setattr__(cfg, k, v)   # past PallasConfig's power-of-two check
  return cfg


CONFIGS = {
    "256x128 cn2 s4 (table)": config(),
    "256x192 cn2 s3": config(tile_n=192, max_concurrent_steps=3),
    "256x192 cm2 s3": config(tile_n=192, max_concurrent_steps=3, cluster_m=2, cluster_n=1),
    "256x192 cn1 s3": config(tile_n=192, max_concurrent_steps=3, cluster_n=1),
    "256x192 cn2 tk32 s6": config(tile_n=192, tile_k=32, max_concurrent_steps=6),
}


def fn(p, cfg, stream_k=False):
  return jax.jit(lambda a, b: ws.persistent_call(a, b, p, cfg, False, cfg.cluster_m,
                                                 cfg.cluster_n, stream_k=stream_k))


if LOWER:
  common.num_sms = lambda interpret: 132
  for p in (prob(1, 8192, 14336, 4096), prob(2, 1000, 999, 700, ta=True),
            prob(1, 300, 1500, 1000, tb=True)):
    a, b = (jax.ShapeDtypeStruct(s, p.dtype) for s in (p.a_shape, p.b_shape))
    for name, cfg in CONFIGS.items():
      for sk in (False, True):
        guard(f"{p.m}x{p.k}x{p.n} {name} sk={sk:d}", lambda cfg=cfg, name=name, sk=sk: (
            fn(p, cfg, sk).trace(a, b).lower(lowering_platforms=("cuda",)),
            print("lowered", p.m, p.k, p.n, name, f"sk={sk:d}", flush=True)))
  sys.exit()

ITERS = 40
# Correctness first, on the ragged and transposed shapes too (vs XLA's f32 dot).
for p in (prob(2, 1000, 999, 700, ta=True), prob(1, 300, 1500, 1000, tb=True),
          prob(1, 8191, 14335, 4093)):
  a, b = operands(p, 3)
  ref = xla_fn(p)(a, b)
  for name, cfg in CONFIGS.items():
    for sk in (False, True):
      def check(p=p, cfg=cfg, name=name, sk=sk):
        e = relerr(fn(p, cfg, sk)(a, b), ref)
        print(f"{p.batch}x{p.m}x{p.k}x{p.n} ta={p.trans_a:d} tb={p.trans_b:d} {name:24s} "
              f"sk={sk:d} relerr={e:.1e} {'OK' if e < 1e-2 else 'BAD'}", flush=True)
      guard(f"{p.m}x{p.k}x{p.n} {name} sk={sk:d}", check)

p = prob(1, 8192, 14336, 4096)
a, b = operands(p, 1)
ref = xla_fn(p)(a, b)
xla = xla2d_fn(p)
timer = Timer("gpu")
for rep in (1, 2):
  for name, cfg in CONFIGS.items():
    for sk in (False, True):
      def run(cfg=cfg, name=name, sk=sk, rep=rep):
        f = fn(p, cfg, sk)
        e = relerr(f(a, b), ref)
        k_ms, x_ms = time_paired(timer, f, xla, (a, b), ITERS)
        t_k, t_xla = statistics.median(k_ms), statistics.median(x_ms)
        print(f"8192x4096x14336 {name:24s} sk={sk:d} relerr={e:.1e} "
              f"kernel {t_k * 1e3:7.1f} us  xla {t_xla * 1e3:7.1f} us  "
              f"{t_xla / t_k:6.4f}x  {p.flops / t_k / 1e9:6.1f} TFLOP/s (rep {rep})", flush=True)
      guard(f"{name} sk={sk}", run)

# The down-projection (512 cluster tiles on 66 clusters: 7.76 rounds run as 8) with
# rung 5's last-round split forced past MAX_STREAM_K_SHARE (its 50 split tiles are
# 9.8% of the run; ../pallas-2026-11-23f/probe_tail.log read 2.3% faster and 0.9%
# slower than whole tiles in two reps).
ws.MAX_STREAM_K_SHARE = 1.0
p = prob(1, 8192, 4096, 14336)
a, b = operands(p, 1)
ref = xla_fn(p)(a, b)
xla = xla2d_fn(p)
cfg = BE.default_config(p, "clusters")
for rep in (1, 2, 3):
  for sk in (False, True):
    def run_down(sk=sk, rep=rep):
      f = fn(p, cfg, sk)
      e = relerr(f(a, b), ref)
      k_ms, x_ms = time_paired(timer, f, xla, (a, b), ITERS)
      t_k, t_xla = statistics.median(k_ms), statistics.median(x_ms)
      print(f"8192x14336x4096 256x128 cn2 s4 (table)   sk={sk:d} relerr={e:.1e} "
            f"kernel {t_k * 1e3:7.1f} us  xla {t_xla * 1e3:7.1f} us  "
            f"{t_xla / t_k:6.4f}x  {p.flops / t_k / 1e9:6.1f} TFLOP/s (rep {rep})", flush=True)
    guard(f"down sk={sk}", run_down)
print(f"done in {time.time() - T0:.0f}s", flush=True)
