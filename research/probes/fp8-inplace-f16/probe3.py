"""GPU probe: split K for the 128-row GEMM read in place (f16 math).

At 128 rows the in-place kernel runs 112-224 programs, one per output tile, each
walking all 32 K blocks (49.5 us at 128x4096x14336 per tensor, run2, against a 2x
target of ~36 us; B's bytes alone take ~14 us). Splitting K (`config.split_k`: each
program takes whole 128-wide K blocks and stores a scaled fp32 partial, which XLA
sums) gives 2-4x the programs without more reads of A. Tiles x splits, per tensor and
block scales, each paired with XLA's scaled form (CUPTI) and checked against the
unsplit default's output. Runs at 4b9c81b, the commit with the split (reverted after run5:
no split beat the unsplit default by enough to matter, most lost).
"""
import dataclasses
import sys

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from jaxgemm import registry, timing  # noqa: E402
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: E402

E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
timer = timing.Timer("gpu")
backend = registry.get_backend("triton", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)
M, K, N = 128, 4096, 14336
for kind in ("tensor", "block"):
  keys = jax.random.split(jax.random.key(0), 2)
  x = jax.random.normal(keys[0], (M, K), F32)
  w = jax.random.normal(keys[1], (K, N), F32) / np.sqrt(K)
  a8, sa = jaxgemm.quantize(x, E4M3, block=None if kind == "tensor" else (1, 128))
  b8, sb = jaxgemm.quantize(w, E4M3, block=None if kind == "tensor" else (128, 128))
  args = (a8, b8, sa, sb)
  if kind == "tensor":
    xla = jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32)
                                        * (sa * sb)).astype(BF16))
  else:
    xla = jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, backend="xla"))
  problem = ScaledMatmulProblem(1, M, N, K, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind=kind)
  base = backend.default_config(problem, "blocked")
  ref = None
  for bn, warps, stages in ((64, 4, 3), (128, 8, 3), (128, 4, 3), (64, 4, 4), (256, 8, 3)):
    for split in (1, 2, 3, 4, 6, 8):
      c = dataclasses.replace(base, block_n=bn, num_warps=warps, num_stages=stages,
                              split_k=split)
      name = f"{kind} 128x{bn}x128 w{warps} s{stages} split {split}"
      try:
        backend.check(problem, "blocked", c)
        f = jax.jit(lambda a, b, sa, sb, c=c: jaxgemm.scaled_matmul(
            a, b, sa, sb, backend="triton", variant="blocked", config=c))
        out = np.asarray(f(*args).astype(F32))
        ref = out if ref is None else ref
        diff = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        mine, theirs = timing.time_paired(timer, f, xla, args, 40)
        mine, theirs = float(np.median(mine)), float(np.median(theirs))
        print(f"{name:40s} {mine * 1e3:7.1f} us {2 * M * K * N / mine / 1e9:7.1f} TFLOP/s  "
              f"xla {theirs * 1e3:7.1f} us  ratio {theirs / mine:5.2f}x  diff {diff:.1e}",
              flush=True)
      except Exception as e:  # noqa: BLE001
        print(f"{name:40s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
