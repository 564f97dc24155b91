"""GPU probe: FP8 GEMMs reading a (K, N) weight in place with float16 tensor-core math.

Question (docs/results-fp8.md, "128 rows"): the 128-row per-tensor GEMM
(128x4096x14336, B stored (K, N)) runs 1.01x XLA's scaled form against a 2x target.
The default pays an XLA transpose of the 58.7 MB fp8 weight (FP8 wgmma reads shared
memory only K-major); reading B in place with fp8 wgmma, Triton transposes each tile in
registers outside its cp.async pipeline (0.19-0.62x, ../fp8-block-wide/run8). Here the
kernel converts the fp8 tiles to float16 (exact) and runs f16 wgmma, which reads an
N-major B from shared memory: the sm_90 PTX keeps cp.async (48-64) and has no prmt.
At 128 rows the GEMM is bound by B's bytes (58.7 MB: ~18 us at 3.35 TB/s), and f16's
half rate costs ~15 us of tensor-core time, so the slower math can hide under the loads.

Part 1 sweeps configs at 128 rows; part 2 takes the best one's shape over M = 128..2048
(where does the aligned fp8 default take over?). Every config is timed paired with XLA's
scaled form (CUPTI) and checked against the default's output (the same products, fp32
sums in another order).

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
"""
import dataclasses
import os
import sys
import traceback

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from jaxgemm import registry, timing  # noqa: E402
from jaxgemm.kernels.triton.scaled_matmul import scaled  # noqa: E402
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: E402

E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
K, N = 4096, 14336
timer = timing.Timer("gpu")
backend = registry.get_backend("triton", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)
scaled.dot_f16 = lambda problem: PROBE_F16[0]
PROBE_F16 = [False]


def operands(m, kind):
  keys = jax.random.split(jax.random.key(m), 2)
  x = jax.random.normal(keys[0], (m, K), F32)
  w = jax.random.normal(keys[1], (K, N), F32) / np.sqrt(K)
  block = None if kind == "tensor" else (1, 128)
  a8, sa = jaxgemm.quantize(x, E4M3, block=block)
  b8, sb = jaxgemm.quantize(w, E4M3, block=None if kind == "tensor" else (128, 128))
  return a8, b8, sa, sb


def xla_scaled(kind):
  if kind == "tensor":
    return jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32)
                                         * (sa * sb)).astype(BF16))
  return jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, backend="xla"))


def time_config(name, m, kind, config, f16, args, xla, ref_out):
  PROBE_F16[0] = f16
  try:
    f = jax.jit(lambda a, b, sa, sb, c=config: jaxgemm.scaled_matmul(
        a, b, sa, sb, backend="triton", variant="blocked", config=c))
    out = np.asarray(f(*args).astype(F32))
    diff = float(np.max(np.abs(out - ref_out)) / np.max(np.abs(ref_out)))
    mine, theirs = timing.time_paired(timer, f, xla, args, 40)
    mine, theirs = float(np.median(mine)), float(np.median(theirs))
    tflops = 2 * m * K * N / (mine * 1e-3) / 1e12
    print(f"m{m:5d} {kind:6s} {name:40s} {mine * 1e3:8.1f} us {tflops:7.1f} TFLOP/s  xla "
          f"{theirs * 1e3:8.1f} us  ratio {theirs / mine:5.2f}x  diff {diff:.1e}", flush=True)
    return mine
  except Exception as e:  # noqa: BLE001
    print(f"m{m:5d} {kind:6s} {name:40s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    traceback.print_exc(limit=2)
    return float("inf")
  finally:
    PROBE_F16[0] = False


def sweep(m, kind, grid):
  args = operands(m, kind)
  xla = xla_scaled(kind)
  xla(*args).block_until_ready()
  problem = ScaledMatmulProblem(1, m, N, K, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind=kind)
  base = backend.default_config(problem, "blocked")
  ref = jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(
      a, b, sa, sb, backend="triton", variant="blocked", config=base))
  ref_out = np.asarray(ref(*args).astype(F32))
  results = {"default (aligned fp8)": time_config("default (aligned fp8)", m, kind, base,
                                                  False, args, xla, ref_out)}
  for bm, bn, bk, warps, stages in grid:
    c = dataclasses.replace(base, block_m=min(bm, m), block_n=bn, block_k=bk, num_warps=warps,
                            num_stages=stages, align_operands=False)
    try:
      backend.check(problem, "blocked", c)
    except Exception:  # noqa: BLE001 (shared memory or the rules: skip)
      continue
    name = f"in place f16 {c.block_m}x{bn}x{bk} w{warps} s{stages}"
    results[name] = time_config(name, m, kind, c, True, args, xla, ref_out)
  return results


FULL = [(bm, bn, bk, w, s) for bm in (64, 128) for bn in (64, 128, 256) for bk in (64, 128)
        for w in (4, 8) for s in (3, 5)]
res = sweep(128, "tensor", FULL)
best = sorted((t, n) for n, t in res.items() if n.startswith("in place"))[:3]
print("best at 128 rows:", best, flush=True)
shapes = []
for _, name in best:
  bm, bn, bk = (int(v) for v in name.split()[3].split("x"))
  w, s = int(name.split()[4][1:]), int(name.split()[5][1:])
  shapes.append((bm, bn, bk, w, s))
sweep(128, "block", shapes)
for m in (256, 512, 1024, 2048):
  sweep(m, "tensor", shapes + [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3)])
