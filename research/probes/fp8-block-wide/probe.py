"""GPU probe: block scales on 128x192 tiles in the Pallas FP8 kernel.

Question (docs/performance-notes.md, "FP8 GEMMs", "Fifth session"): per tensor, 128x192
tiles ran 1.12x the 128x128 tiles' rate on an H100 (research/probes/fp8-clusters/run1);
block scales were held to 128-wide tiles (one b_scale column block a tile) and ran
1029-1073 TFLOP/s at 8192^3, short of the 1250 target. A 192-wide tile now keeps its
promoted sum as three (64, 64) arrays, each with one b_scale value (`scaled.scale_chunk`),
K steps one at a time. Does it pay as it did per tensor, and with which cluster?

Each config is timed paired (`timing.time_paired`, CUPTI) against the 128x128 tile without
clusters (the reference, the same for every row of a shape), with its relative error
against the exact dequantized product and whether its output equals the reference's bit
for bit (the same math per element, so it must). B stored (N, K) (the kernel alone) and
(K, N) (the op's plain layout, with its transpose pass) for the likely defaults.

PROBE_SET=under (run6, at 02a8fb9): the default config (128x192, cluster along M) with the
step's scales read from SMEM while its wgmma runs (`scaled.SCALES_UNDER_WGMMA`, a switch of
that commit), paired against the same config reading them after the wgmma, B stored (N, K)
only. It measured 1.026-1.032x, and the kernel now always reads them under the wgmma: the
switch is gone, and this set runs only at that commit.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
"""
import dataclasses
import os
import sys
import time
import traceback

import numpy as np
import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm import registry, timing
from jaxgemm.kernels.pallas.scaled_matmul import scaled
from jaxgemm.ops.scaled_matmul import pallas as scaled_pallas
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem

T0 = time.time()
CPU = "--cpu" in sys.argv
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", 500))
E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
ITERS = 2 if CPU else 30
PROBLEMS = ([(256, 256, 400)] if CPU else
            [(8192, 8192, 8192), (8192, 4096, 14336), (4096, 4096, 4096)])
TMA = scaled_pallas.TMA_SCALES
PROBE_SET = os.environ.get("PROBE_SET", "tiles")
if PROBE_SET == "under" and not hasattr(scaled, "SCALES_UNDER_WGMMA"):
  sys.exit("PROBE_SET=under needs commit 02a8fb9's SCALES_UNDER_WGMMA switch (since removed: "
           "the kernel always reads the scales under the wgmma)")
timer = timing.Timer("cpu" if CPU else "gpu")
backend = registry.get_backend("pallas", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)


def tflops(m, k, n, ms):
  return 2 * m * k * n / (ms * 1e-3) / 1e12


def configs(problem):
  if PROBE_SET == "under":
    default = backend.default_config(problem, TMA)
    return default, [("scales under the wgmma", default, False)]
  base = dataclasses.replace(backend.default_config(problem, TMA), tile_n=128, cluster_n=1)
  wide = dataclasses.replace(base, tile_n=192)
  fit = lambda c: scaled_pallas.fit_stages(problem, c, TMA)
  return fit(base), [
      ("128x128 cluster_n=2", fit(dataclasses.replace(base, cluster_n=2)), True),
      ("128x192", fit(wide), True),
      ("128x192 cluster_n=2", fit(dataclasses.replace(wide, cluster_n=2)), True),
      ("128x192 cluster_m=2", fit(dataclasses.replace(wide, cluster_m=2)), False),
      ("128x192 cluster_n=2 minor_m", fit(dataclasses.replace(wide, cluster_n=2,
                                                              grid_minor_m=True)), False),
  ]


for (m, k, n) in PROBLEMS:
  keys = jax.random.split(jax.random.key(m + k + n), 2)
  x = jax.random.normal(keys[0], (m, k), F32)
  w = jax.random.normal(keys[1], (k, n), F32) / np.sqrt(k)
  a8, sa = jaxgemm.quantize(x, E4M3, (1, 128))
  b8, sb = jaxgemm.quantize(w, E4M3, (128, 128))
  b8t, sbt = b8.T.copy(), sb.T.copy()
  sa_full = jnp.repeat(sa, 128, axis=1)[:, :k]
  sb_full = jnp.repeat(jnp.repeat(sb, 128, 0), 128, 1)[:k, :n]
  exact = np.asarray(jnp.dot(a8.astype(F32) * sa_full, b8.astype(F32) * sb_full,
                             precision="highest"))
  rel = lambda out: float(np.linalg.norm(np.asarray(out.astype(F32)) - exact)
                          / np.linalg.norm(exact))
  problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind="block")
  base, cands = configs(problem)
  for trans_b in ((True,) if PROBE_SET == "under" else (True, False)):
    args = (a8, b8t, sa, sbt) if trans_b else (a8, b8, sa, sb)
    def run(c, under=False, t=trans_b):
      scaled.SCALES_UNDER_WGMMA = under   # read at trace time: trace now
      f = jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(
          a, b, sa, sb, backend="pallas", variant=TMA, config=c, trans_b=t))
      text = f.lower(*args).as_text()
      return f, np.asarray(f(*args)), hash(text)
    ref, ref_out, ref_text = run(base)
    head = f"{m}x{k}x{n} block {'B (N,K)' if trans_b else 'B (K,N)'}"
    print(f"{head} reference {'default' if PROBE_SET == 'under' else '128x128'} err {rel(ref_out):.2e} stages "
          f"{base.max_concurrent_steps}", flush=True)
    for name, config, both_layouts in cands:
      if time.time() - T0 > DEADLINE_S:
        print("deadline reached", flush=True)
        break
      if not trans_b and not both_layouts:
        continue
      label = f"{head} {name:28s}"
      try:
        f, out, text = run(config, under=PROBE_SET == "under")
        mine, theirs = timing.time_paired(timer, f, ref, args, ITERS)
        mine, theirs = float(np.median(mine)), float(np.median(theirs))
        print(f"{label} err {rel(out):.2e} same-as-reference {np.array_equal(out, ref_out)} "
              f"program-differs {text != ref_text} "
              f"{mine:7.3f} ms {tflops(m, k, n, mine):7.1f} TFLOP/s  ref {theirs:7.3f} ms "
              f"{tflops(m, k, n, theirs):7.1f}  ratio {theirs / mine:5.3f}x  "
              f"stages {config.max_concurrent_steps}", flush=True)
      except Exception as e:  # noqa: BLE001 (a probe: report and go on)
        print(f"{label} FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
        traceback.print_exc(limit=3)
print(f"done in {time.time() - T0:.0f} s", flush=True)
