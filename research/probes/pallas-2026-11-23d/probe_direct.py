"""Probe: the persistent rungs' epilogue, staged TMA stores vs registers straight to C.

Run on the H200 from the repository root (branch direct-store-probe, whose
`warp_specialized.PROBE_EPILOGUE` switch this script sets):
  make gpu-env; PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23d/probe_direct.py
`waits` times the TMA epilogue's parts instead (racy or partial variants: timing only);
`slots` one TMA-store slot per consumer with 64 x 128 pieces.
`lower` cross-lowers for sm_90a on a CPU machine instead (no timing).
probe_direct.log came from the first version of this script, which printed XLA's time only
at the start of each rep (the ratio was the same: against XLA before and after the kernel).
"""
import dataclasses
import sys
import time

import jax
import numpy as np

from research.probe_helpers import BE, kernel, operands, prob, relerr, timeit, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import warp_specialized as ws

MODE = sys.argv[1] if len(sys.argv) > 1 else "direct"   # direct, waits, slots, lower
LOWER = MODE == "lower"
T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)

PROBLEMS = [("8192^3", prob(1, 8192, 8192, 8192), "clusters"),
            ("8192x4096x14336", prob(1, 8192, 14336, 4096), "stream_k"),
            ("8192x14336x4096", prob(1, 8192, 4096, 14336), "clusters"),
            ("4096^3", prob(1, 4096, 4096, 4096), "clusters"),
            ("A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True), "clusters"),
            ("A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True), "clusters")]


def build(p, variant, cfg, epilogue):
  """The variant's kernel, jitted; traced (so built) with `epilogue` at its first call."""
  ws.PROBE_EPILOGUE = epilogue
  return kernel(p, variant, cfg)


for name, p, variant in PROBLEMS:
  d = BE.default_config(p, variant)
  if MODE == "slots":
    wide = dataclasses.replace(d, epi_tile_n=128)
    cases = [("tma", d, "tma"), ("oneslot epi128", wide, "oneslot"),
             ("oneslot epi64", d, "oneslot"), ("nostore", d, "nostore")]
  elif MODE == "waits":
    cases = [("tma", d, "tma"), ("nowait", d, "nowait"), ("nostore", d, "nostore"),
             ("one", d, "one"), ("tma epi32", dataclasses.replace(d, epi_tile_n=32), "tma")]
  else:
    cases = [("tma", d, "tma"), ("direct", d, "direct"),
             ("direct epi128", dataclasses.replace(d, epi_tile_n=128), "direct"),
             ("none", d, "none")]
  if LOWER:
    a = jax.ShapeDtypeStruct(p.a_shape, p.dtype)
    b = jax.ShapeDtypeStruct(p.b_shape, p.dtype)
    for label, cfg, epi in cases:
      try:
        build(p, variant, cfg, epi).trace(a, b).lower(lowering_platforms=("cuda",))
        print("lowered", name, label, flush=True)
      except Exception as ex:
        print("ERR", name, label, type(ex).__name__, str(ex)[:600], flush=True)
    continue
  a, b = operands(p, 1)
  ref = np.asarray(xla_fn(p)(a, b))
  fns = {}
  for label, cfg, epi in cases:
    f = build(p, variant, cfg, epi)
    try:
      out = f(a, b)      # compiles with this epilogue
      err = relerr(out, ref)
      fns[label] = (f, err)
    except Exception as ex:
      print(f"{name:16s} {label:14s} ERR {type(ex).__name__}: {str(ex)[:600]}", flush=True)
  x = xla2d_fn(p)
  for rep in range(2):
    # XLA before and after each kernel: its ratio is against their mean.
    tx = timeit(x, a, b)
    line = [f"{name:16s} rep{rep} xla {p.flops / tx / 1e9:6.1f}"]
    for label, (f, err) in fns.items():
      t = timeit(f, a, b)
      tx2 = timeit(x, a, b)
      line.append(f"{label} {p.flops / t / 1e9:6.1f} ({(tx + tx2) / 2 / t:.3f}x, err {err:.1e})"
                  f" xla {p.flops / tx2 / 1e9:6.1f}")
      tx = tx2
    print(" | ".join(line), flush=True)
  print(f"t={time.time() - T0:.0f}s", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
