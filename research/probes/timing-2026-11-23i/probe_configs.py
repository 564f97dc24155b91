"""Probe (GPU): Pallas configs on the missed shapes, timed with 10 ms blocks.

With `jaxgemm.timing.time_paired` alternating 10 ms blocks, XLA's dot against
itself reads 1.000x +- 0.001 (probe_pairing.py), so config differences of a few
tenths of a percent are now visible. C: each (shape, variant, config change)
against XLA's dot, 40 calls a side, two reps (the second in reverse order);
T: the same for 128x256 tiles.
stream_k "forced" lifts MAX_STREAM_K_SHARE so the split happens where the
planner declines it. S: the table's kernel and XLA's dot under sustained load:
blocks of 150 back-to-back calls (R K K R), the medians of each block's last 100.

  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/timing-2026-11-23i/probe_configs.py [C|T][S]
(probe_configs.log: CS; probe_tiles.log: T.)
"""
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemm
from research.probe_helpers import BE, operands, prob
from jaxgemm import dispatch
from jaxgemm.kernels.pallas import warp_specialized as ws
from jaxgemm.timing import Timer, time_paired

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp")
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "CS"   # C or T, and S
ITERS = 40
SHAPES = {"8192x4096x14336": (8192, 4096, 14336), "8192x14336x4096": (8192, 14336, 4096),
          "8192^3": (8192, 8192, 8192), "4096x8192x57344": (4096, 8192, 57344)}
# (shape, label, variant, config changes, force the stream-K split)
T128x256 = {"tile_m": 128, "tile_n": 256}
T128x256_CM2 = T128x256 | {"cluster_m": 2, "cluster_n": 1}
CASES = [
    ("8192x4096x14336", "clusters", "clusters", {}, False),
    ("8192x4096x14336", "clusters minor_m", "clusters", {"grid_minor_m": True}, False),
    ("8192x4096x14336", "clusters gg16", "clusters", {"grid_group": 16}, False),
    ("8192x4096x14336", "sk split1", "stream_k", {}, False),
    ("8192x4096x14336", "sk split2", "stream_k", {"split_rounds": 2}, False),
    ("8192x4096x14336", "sk split2 gg4", "stream_k", {"split_rounds": 2, "grid_group": 4}, False),
    ("8192x4096x14336", "sk split2 gg16", "stream_k", {"split_rounds": 2, "grid_group": 16}, False),
    ("8192x4096x14336", "sk split2 minor_m", "stream_k", {"split_rounds": 2, "grid_minor_m": True}, False),
    ("8192x4096x14336", "sk split2 epi32", "stream_k", {"split_rounds": 2, "epi_tile_n": 32}, False),
    ("8192x4096x14336", "sk split2 epi128 st3", "stream_k",
     {"split_rounds": 2, "epi_tile_n": 128, "max_concurrent_steps": 3}, False),
    ("8192x14336x4096", "clusters", "clusters", {}, False),
    ("8192x14336x4096", "clusters gg4", "clusters", {"grid_group": 4}, False),
    ("8192x14336x4096", "clusters gg16", "clusters", {"grid_group": 16}, False),
    ("8192x14336x4096", "clusters minor_m", "clusters", {"grid_minor_m": True}, False),
    ("8192x14336x4096", "clusters epi32", "clusters", {"epi_tile_n": 32}, False),
    ("8192x14336x4096", "clusters tk128 st2", "clusters", {"tile_k": 128, "max_concurrent_steps": 2}, False),
    ("8192x14336x4096", "sk split1 forced", "stream_k", {}, True),
    ("8192x14336x4096", "sk split2 forced", "stream_k", {"split_rounds": 2}, True),
    ("8192x14336x4096", "ws", "warp_specialized", {}, False),
    ("8192^3", "sk split1", "stream_k", {}, False),
    ("8192^3", "clusters", "clusters", {}, False),
    ("8192^3", "sk split1 gg16", "stream_k", {"grid_group": 16}, False),
    ("4096x8192x57344", "ws", "warp_specialized", {}, False),
    ("4096x8192x57344", "ws minor_m", "warp_specialized", {"grid_minor_m": True}, False),
    ("4096x8192x57344", "clusters", "clusters", {}, False),
    ("4096x8192x57344", "clusters minor_m", "clusters", {"grid_minor_m": True}, False),
    ("4096x8192x57344", "sk split1", "stream_k", {}, False),
    ("4096x8192x57344", "sk split2", "stream_k", {"split_rounds": 2}, False),
]
# T (probe_tiles.log): 128x256 tiles (each consumer 64 rows x 256 columns: one A block
# and a wider B per wgmma, a sixth less SMEM read per MAC than 256x128), the clusters
# along M or N.
TILE_CASES = [
    ("8192x4096x14336", "sk split2", "stream_k", {"split_rounds": 2}, False),
    ("8192x4096x14336", "sk split2 128x256 cm2", "stream_k", T128x256_CM2 | {"split_rounds": 2}, False),
    ("8192x4096x14336", "sk split2 128x256 cn2", "stream_k", T128x256 | {"split_rounds": 2}, False),
    ("8192x4096x14336", "sk split1 128x256 cm2", "stream_k", T128x256_CM2, False),
    ("8192x4096x14336", "clusters 128x256 cm2", "clusters", T128x256_CM2, False),
    ("8192x14336x4096", "clusters", "clusters", {}, False),
    ("8192x14336x4096", "clusters 128x256 cm2", "clusters", T128x256_CM2, False),
    ("8192x14336x4096", "clusters 128x256 cn2", "clusters", T128x256, False),
    ("8192x14336x4096", "ws 128x256", "warp_specialized", {"tile_m": 128, "tile_n": 256}, False),
    ("8192x14336x4096", "clusters gg6", "clusters", {"grid_group": 6}, False),
    ("8192x14336x4096", "clusters gg12", "clusters", {"grid_group": 12}, False),
    ("8192^3", "sk split1", "stream_k", {}, False),
    ("8192^3", "sk split1 128x256 cm2", "stream_k", T128x256_CM2, False),
    ("8192^3", "sk split1 128x256 cn2", "stream_k", T128x256, False),
    ("8192^3", "clusters 128x256 cm2", "clusters", T128x256_CM2, False),
    ("4096x8192x57344", "sk split1", "stream_k", {}, False),
    ("4096x8192x57344", "sk split1 128x256 cm2", "stream_k", T128x256_CM2, False),
    ("4096x8192x57344", "clusters 128x256 cm2", "clusters", T128x256_CM2, False),
    ("4096x8192x57344", "ws 128x256", "warp_specialized", {"tile_m": 128, "tile_n": 256}, False),
]
timer = Timer("gpu")
results = []


def xla_ref(a, b):
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())))


def compile_case(p, variant, changes, force, args):
  cfg = dataclasses.replace(BE.default_config(p, variant), **changes)
  BE.check(p, variant, cfg)
  saved = ws.MAX_STREAM_K_SHARE
  ws.MAX_STREAM_K_SHARE = 1.0 if force else saved
  try:
    f = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="pallas", variant=variant,
                                            config=cfg)).lower(*args).compile()
  finally:
    ws.MAX_STREAM_K_SHARE = saved
  return f, cfg


for shape, (m, k, n) in SHAPES.items():
  p = prob(1, m, n, k)
  a, b = operands(p)
  args = (a[0], b[0])
  ref = jax.jit(xla_ref).lower(*args).compile()
  want = ref(*args).astype(jnp.float32)
  cases = [c for c in (CASES if "C" in sections else TILE_CASES) if c[0] == shape]
  if "C" in sections or "T" in sections:
    compiled = []
    for _, label, variant, changes, force in cases:
      try:
        f, cfg = compile_case(p, variant, changes, force, args)
        err = float(jnp.linalg.norm(f(*args).astype(jnp.float32) - want) / jnp.linalg.norm(want))
        if not err < 1e-2:
          print(f"{shape:16s} {label:24s} WRONG relerr {err:.2e}", flush=True)
          continue
        compiled.append((label, f, err))
      except Exception as e:  # noqa: BLE001
        print(f"{shape:16s} {label:24s} ERR {type(e).__name__}: {str(e)[:300]}", flush=True)
    for rep in range(2):
      for label, f, err in (compiled if rep == 0 else compiled[::-1]):
        k_ms, r_ms = time_paired(timer, f, ref, args, ITERS)
        ratio = float(np.median(r_ms) / np.median(k_ms))
        results.append({"shape": shape, "label": label, "rep": rep, "ratio": ratio,
                        "kernel_ms": float(np.median(k_ms)), "xla_ms": float(np.median(r_ms))})
        print(f"{shape:16s} {label:24s} rep {rep}: {ratio:.4f}x  kernel {np.median(k_ms)*1e3:8.1f} us"
              f"  xla {np.median(r_ms)*1e3:8.1f} us  relerr {err:.1e}", flush=True)
  if "S" in sections:
    variant = dispatch.choose(p, "pallas").variant
    f = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="pallas")).lower(*args).compile()
    jax.block_until_ready(f(*args))
    blocks = {"kernel": [], "xla": []}
    for who in ("xla", "kernel", "kernel", "xla"):
      t = timer.time(ref if who == "xla" else f, args, 150)
      blocks[who].append(float(np.median(t[50:])))
    ratio = np.mean(blocks["xla"]) / np.mean(blocks["kernel"])
    results.append({"shape": shape, "label": f"sustained pallas/{variant}", "blocks": blocks,
                    "ratio": float(ratio)})
    print(f"{shape:16s} sustained pallas/{variant}: {ratio:.4f}x  block medians (us) "
          f"xla {[round(x * 1e3) for x in blocks['xla']]} kernel "
          f"{[round(x * 1e3) for x in blocks['kernel']]}", flush=True)
  del a, b, args, want
  print(f"t={time.time() - T0:.0f}s", flush=True)

json.dump(results, open(f"{OUT}/{'configs' if 'C' in sections else 'tiles'}.json", "w"))
print(f"done t={time.time() - T0:.0f}s", flush=True)
