"""Session-3 GPU probe: where the Pallas misses come from.

A. unaligned 4095x4097x4093: pad / kernel / slice breakdown, and whether a
   16-byte (not 128-byte) column padding is accepted by Mosaic.
B. per-tile overhead: M=N=8192 with K swept (time = waves * (c + K * r)).
C. config sweep on 8192^3 and the two MLP shapes.
D. clusters on single-tile / fully-out-of-bounds-CTA problems (the refused case).
"""
import dataclasses, sys, time
import numpy as np, jax, jax.numpy as jnp
from jax import lax
from jaxgemm.backends import pallas as P
from jaxgemm.kernels.pallas import common, clusters as CL
from research.probe_helpers import (BE, guard, operands as ops, pallas_fn, prob, relerr, timeit,
                                    xla2d_fn, xla_fn)

T0 = time.time()
C = P.PallasConfig
print("jax", jax.__version__, jax.devices(), flush=True)


parts = sys.argv[1] if len(sys.argv) > 1 else "ABCD"

if "A" in parts:
  print("== A: unaligned breakdown ==", flush=True)
  p = prob(1, 4095, 4093, 4097)
  a, b = ops(p)
  tx = timeit(xla2d_fn(p), a, b)
  ref = xla_fn(p)(a, b)
  print(f"xla {tx*1e3:.1f} us", flush=True)
  cfg = BE.default_config(p, "clusters")
  f = pallas_fn(p, "clusters", cfg)
  t = timeit(f, a, b)
  print(f"clusters full {t*1e3:.1f} us {tx/t:.2f}x err={relerr(f(a,b), ref):.1e}", flush=True)
  pad_a = jax.jit(lambda a: jnp.pad(a, ((0, 0), (0, 1), (0, 63))))
  pad_b = jax.jit(lambda b: jnp.pad(b, ((0, 0), (0, 7), (0, 3))))
  pad_a8 = jax.jit(lambda a: jnp.pad(a, ((0, 0), (0, 1), (0, 7))))
  pad_a_dus = jax.jit(lambda a: lax.dynamic_update_slice(jnp.zeros((1, 4096, 4160), a.dtype), a, (0, 0, 0)))
  slice_c = jax.jit(lambda c: c[:, :4095, :4093])
  cp = jnp.ones((1, 4096, 4096), jnp.bfloat16)
  for name, fn, x in [("pad A ->4096x4160", pad_a, a), ("pad B ->4104x4096", pad_b, b),
                      ("pad A ->4096x4104", pad_a8, a), ("pad A dus", pad_a_dus, a),
                      ("slice C", slice_c, cp), ("copy C (x+0)", jax.jit(lambda c: c * 1), cp)]:
    guard(name, lambda: print(f"{name:20s} {timeit(fn, x)*1e3:.1f} us", flush=True))
  # The kernel alone on pre-padded operands.
  ap = jnp.pad(a, ((0, 0), (0, 1), (0, 63)))
  bp = jnp.pad(b, ((0, 0), (0, 63), (0, 3)))
  pp = prob(1, 4096, 4096, 4160)
  fk = pallas_fn(pp, "clusters", cfg)
  guard("kernel alone", lambda: print(f"kernel alone 4096x4160x4096 {timeit(fk, ap, bp)*1e3:.1f} us", flush=True))
  # Does Mosaic accept 16-byte column multiples?
  orig = common.col_multiple
  common.col_multiple = lambda dt: 8
  try:
    p2 = dataclasses.replace(p)
    f8 = jax.jit(lambda a, b: CL.clusters(a, b, p2, cfg))
    def go():
      c = f8(a, b)
      print(f"col_multiple=8: {timeit(f8, a, b)*1e3:.1f} us err={relerr(c, ref):.1e}", flush=True)
    guard("col_multiple=8", go)
  finally:
    common.col_multiple = orig

if "B" in parts:
  print("== B: K sweep M=N=8192 ==", flush=True)
  for k in (1024, 2048, 4096, 8192, 16384):
    p = prob(1, 8192, 8192, k)
    a, b = ops(p, 1)
    tx = timeit(xla2d_fn(p), a, b)
    cfg = BE.default_config(p, "clusters")
    t = timeit(pallas_fn(p, "clusters", cfg), a, b)
    print(f"K={k:6d} xla {tx*1e3:8.1f} us {p.flops/tx/1e9:6.1f}  clusters {t*1e3:8.1f} us "
          f"{p.flops/t/1e9:6.1f} {tx/t:.3f}x", flush=True)

if "C" in parts:
  print("== C: config sweep ==", flush=True)
  base = dict(tile_m=256, tile_n=128, tile_k=64, max_concurrent_steps=4, cluster_n=2)
  cfgs = [
      ("default", C(**base)),
      ("epi128 s3", C(**{**base, "max_concurrent_steps": 3}, epi_tile_n=128)),
      ("g4", C(**base, grid_group=4)),
      ("g16", C(**base, grid_group=16)),
      ("minor_m", C(**base, grid_minor_m=True)),
      ("128x256 cm2", C(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4, cluster_m=2)),
      ("128x256 cn2", C(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4, cluster_n=2)),
      ("256x128 cm2", C(tile_m=256, tile_n=128, tile_k=64, max_concurrent_steps=4, cluster_m=2)),
      ("tk128 s2", C(**{**base, "tile_k": 128, "max_concurrent_steps": 2})),
  ]
  for name, p in [("8192^3", prob(1, 8192, 8192, 8192)),
                  ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
                  ("8192x14336x4096", prob(1, 8192, 4096, 14336))]:
    a, b = ops(p, 2)
    tx = timeit(xla2d_fn(p), a, b)
    ref = xla_fn(p)(a, b)
    print(f"{name:16s} xla {p.flops/tx/1e9:6.1f}", flush=True)
    for cname, cfg in cfgs:
      def go():
        BE.check(p, "clusters", cfg)
        f = pallas_fn(p, "clusters", cfg)
        e = relerr(f(a, b), ref)
        t = timeit(f, a, b)
        print(f"{name:16s} {cname:12s} {p.flops/t/1e9:6.1f} {tx/t:.3f}x err={e:.1e}", flush=True)
      guard(f"{name} {cname}", go)
    print(f"t={time.time()-T0:.0f}s", flush=True)

if "D" in parts:
  print("== D: clusters on small / partly empty clusters ==", flush=True)
  for (m, k, n) in [(33, 40, 24), (64, 64, 64), (128, 64, 128), (200, 64, 128), (300, 200, 260),
                    (300, 200, 384), (257, 64, 64), (512, 256, 640)]:
    p = prob(1, m, n, k)
    a, b = ops(p, 3)
    ref = np.asarray(a, np.float64)[0] @ np.asarray(b, np.float64)[0]
    cfg = BE.default_config(p, "clusters")
    def go():
      c = jax.jit(lambda a, b: CL.clusters(a, b, p, cfg))(a, b)
      e = relerr(np.asarray(c)[0], ref)
      print(f"{m}x{k}x{n} {'OK ' if e < 1e-2 else 'BAD'} err={e:.1e} tm={cfg.tile_m} tn={cfg.tile_n} "
            f"tk={cfg.tile_k}", flush=True)
    guard(f"{m}x{k}x{n}", go)
print(f"done in {time.time()-T0:.0f}s", flush=True)
