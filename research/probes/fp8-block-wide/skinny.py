"""GPU probe: the 128-row per-tensor FP8 GEMM (128x4096x14336, B stored (K, N)) with the
weight read in place.

Question (docs/results-fp8.md, "128 rows"): the default (Triton, align_operands=True) runs
1.01x XLA's scaled form against a 2x target, paying an XLA transpose of the 58.7 MB (K, N)
fp8 weight before a kernel that reads it K-major. Triton can instead read B N-major and
transpose it in registers on its way to wgmma (align_operands=False; `scaled.laid_out`'s
PTX notes). The memory floor is ~18 us (58.7 MB at 3.35 TB/s); 2x XLA is ~35 us. Each
config is timed paired with XLA's scaled form (`timing.time_paired`, CUPTI) and checked
against the default's output (the same math: equal up to fp32 summation order).

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
"""
import dataclasses
import sys
import traceback

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from jaxgemm import registry, timing  # noqa: E402
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: E402

E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
M, K, N = 128, 4096, 14336
timer = timing.Timer("gpu")
backend = registry.get_backend("triton", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)
keys = jax.random.split(jax.random.key(0), 2)
x = jax.random.normal(keys[0], (M, K), F32)
w = jax.random.normal(keys[1], (K, N), F32) / np.sqrt(K)
a8, sa = jaxgemm.quantize(x, E4M3)
b8, sb = jaxgemm.quantize(w, E4M3)
args = (a8, b8, sa, sb)
xla = jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32)
                                    * (sa * sb)).astype(BF16))
xla(*args).block_until_ready()
problem = ScaledMatmulProblem(1, M, N, K, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                              scale_kind="tensor")
base = backend.default_config(problem, "blocked")
print(f"default {base}", flush=True)
cands = [("default (aligned)", base)]
for bn in (64, 128, 256):
  for bk in (64, 128):
    for warps in (4, 8):
      for stages in (3, 4, 6):
        c = dataclasses.replace(base, block_m=64, block_n=bn, block_k=bk, num_warps=warps,
                                num_stages=stages, align_operands=False)
        try:
          backend.check(problem, "blocked", c)
        except Exception:  # noqa: BLE001 (shared memory or the rules: skip)
          continue
        cands.append((f"in place 64x{bn}x{bk} w{warps} s{stages}", c))
ref_out = None
for name, config in cands:
  try:
    f = jax.jit(lambda a, b, sa, sb, c=config: jaxgemm.scaled_matmul(
        a, b, sa, sb, backend="triton", variant="blocked", config=c))
    out = np.asarray(f(*args).astype(F32))
    ref_out = out if ref_out is None else ref_out
    diff = float(np.max(np.abs(out - ref_out)) / np.max(np.abs(ref_out)))
    mine, theirs = timing.time_paired(timer, f, xla, args, 50)
    mine, theirs = float(np.median(mine)), float(np.median(theirs))
    print(f"{name:34s} {mine * 1e3:7.1f} us  xla {theirs * 1e3:7.1f} us  ratio "
          f"{theirs / mine:5.2f}x  max diff vs default {diff:.1e}", flush=True)
  except Exception as e:  # noqa: BLE001
    print(f"{name:34s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    traceback.print_exc(limit=2)
