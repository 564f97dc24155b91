"""Probe (GPU): 8192x4096x14336 (the MLP up-projection) in 256x160 tiles, as cuBLAS
picks a 160-wide tile there (probe_cublas.log: nvjet ..._128x160_64x5_2x1_...).

256x128 cluster tiles leave the last of 28 rounds 15% full (1792 tiles on 66 clusters);
256x160 (each consumer 128x160, 160 accumulator registers) makes 1440 cluster tiles, 21.8
rounds. PallasConfig allows only power-of-two tiles, so the probe sets tile_n past its
validation and calls the kernel directly (`warp_specialized.persistent_call`).

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23b/probe_tile160.py [lower]
`lower` cross-lowers the configs for sm_90a on a CPU machine instead (no timing).
"""
import dataclasses
import sys
import time

import jax
from jax.experimental.pallas import mosaic_gpu as plgpu

from research.probe_helpers import BE, guard, operands, prob, relerr, timeit, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import common, warp_specialized as ws

T0 = time.time()
LOWER = len(sys.argv) > 1 and sys.argv[1] == "lower"
print("jax", jax.__version__, jax.devices(), flush=True)


def config(**kw):
  cfg = BE.default_config(prob(1, 8192, 14336, 4096), "clusters")
  cfg = dataclasses.replace(cfg, tile_n=128)
  for k, v in kw.items():
    object.__setattr__(cfg, k, v)   # past PallasConfig's power-of-two check
  return cfg


CONFIGS = {
    "256x128 cn2 (default)": config(),
    "256x160 cn2 epi32 tk32 s8": config(tile_n=160, epi_tile_n=32, tile_k=32,
                                        max_concurrent_steps=8),
    "256x160 cn2 epi32 tk32 s6": config(tile_n=160, epi_tile_n=32, tile_k=32,
                                        max_concurrent_steps=6),
    # Both operands in 64-byte swizzle (A's 64-wide K rows would get 128 bytes).
    "256x160 cn2 epi32 sw64": config(tile_n=160, epi_tile_n=32),
}
_smem_transforms = common.smem_transforms


def sw64_transforms(minor_elems, dtype):
  return (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))


def traced(label, f, *args):
  """Calls f once (tracing it), with 64-byte swizzles everywhere for 'sw64' configs."""
  common.smem_transforms = sw64_transforms if "sw64" in label else _smem_transforms
  try:
    return f(*args)
  finally:
    common.smem_transforms = _smem_transforms
if LOWER:   # what Mosaic GPU's layout inference refuses (see the log)
  CONFIGS.update({
      "256x160 cn2 epi32 (A in 128-byte swizzle)": config(tile_n=160, epi_tile_n=32),
      "256x160 cn2 epi160 s2": config(tile_n=160, epi_tile_n=160, max_concurrent_steps=2),
      "256x192 cn2 epi64": config(tile_n=192, epi_tile_n=64),
      "256x160 cn2 epi32 tk32": config(tile_n=160, epi_tile_n=32, tile_k=32),
  })


def fn(p, cfg, stream_k=False):
  return jax.jit(lambda a, b: ws.persistent_call(a, b, p, cfg, False, cfg.cluster_m,
                                                 cfg.cluster_n, stream_k=stream_k))


if LOWER:
  common.num_sms = lambda interpret: 132
  p = prob(1, 8192, 14336, 4096)
  a, b = (jax.ShapeDtypeStruct(s, p.dtype) for s in (p.a_shape, p.b_shape))
  for name, cfg in CONFIGS.items():
    guard(name, lambda cfg=cfg, name=name: (
        traced(name, lambda: fn(p, cfg).trace(a, b).lower(lowering_platforms=("cuda",))),
        print("lowered", name)))
  sys.exit()

problems = [("8192x4096x14336", prob(1, 8192, 14336, 4096)),
            ("1x(300x1000 @ 1000x1500) NT", prob(1, 300, 1500, 1000, tb=True)),
            ("2x(1000x700 @ 700x999) TN", prob(2, 1000, 999, 700, ta=True))]
for name, p in problems:
  a, b = operands(p, 1)
  ref = xla_fn(p)(a, b)
  big = p.m >= 8192
  tx = timeit(xla2d_fn(p), a, b) if big else None
  if big:
    print(f"{name:30s} xla {p.flops / tx / 1e9:7.1f}", flush=True)
  for rep in ((1, 2) if big else (1,)):
    for label, cfg in CONFIGS.items():
      for sk in (False, True):
        def run(label=label, cfg=cfg, sk=sk, rep=rep):
          f = fn(p, cfg, sk)
          e = relerr(traced(label, f, a, b), ref)
          msg = f"{name:30s} {label:28s} sk={sk:d} relerr={e:.1e} {'OK ' if e < 1e-2 else 'BAD'}"
          if big:
            t = timeit(f, a, b)
            msg += f" {p.flops / t / 1e9:7.1f} {tx / t:6.3f}x {t * 1e3:8.1f} us (rep {rep})"
          print(msg, flush=True)
        guard(f"{name} {label} sk={sk}", run)
  if big:
    print(f"{name:30s} xla again {p.flops / timeit(xla2d_fn(p), a, b) / 1e9:7.1f}", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
