"""The 128-row FP8 GEMM (issue 28's 128x4096x14336, target 2x XLA's scaled form): Triton
configs with the (K, N) weight read in place (align_operands=False: a register transpose
in the kernel) against the default relayout pass, per-tensor and block scales.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
Here (tiny shape, interpreter): python <this file> --cpu
"""
import dataclasses
import sys

import numpy as np
import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm import registry, timing
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem

CPU = "--cpu" in sys.argv
E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
M, K, N = (16, 256, 384) if CPU else (128, 4096, 14336)
ITERS = 2 if CPU else 50
timer = timing.Timer("cpu" if CPU else "gpu")
backend = registry.get_backend("triton", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)
keys = jax.random.split(jax.random.key(0), 2)
x = jax.random.normal(keys[0], (M, K), F32)
w = jax.random.normal(keys[1], (K, N), F32) / np.sqrt(K)
for kind, (xb, wb) in {"tensor": (None, None), "block": ((1, 128), (128, 128))}.items():
  a8, sa = jaxgemm.quantize(x, E4M3, xb)
  b8, sb = jaxgemm.quantize(w, E4M3, wb)
  args = (a8, b8, sa, sb)
  ref = jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32) * (sa * sb))
                .astype(BF16)) if kind == "tensor" else jax.jit(
      lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, backend="xla"))
  exact = np.asarray(jaxgemm.scaled_matmul(*args, backend="xla", out_dtype=F32))
  problem = ScaledMatmulProblem(1, M, N, K, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind=kind)
  base = backend.default_config(problem, "blocked")
  configs = [base]
  for bm, bn, warps, stages in ((64, 128, 4, 4), (64, 64, 4, 4), (64, 128, 4, 6),
                                (64, 256, 8, 3), (128, 128, 8, 4), (64, 64, 4, 8)):
    configs.append(dataclasses.replace(base, block_m=min(bm, M), block_n=bn, num_warps=warps,
                                       num_stages=stages))
  runs = [(c, align) for c in configs for align in (True, False)]
  seen = []
  for config, align in runs:
    config = dataclasses.replace(config, align_operands=align)
    if config in seen:
      continue
    seen.append(config)
    try:
      backend.check(problem, "blocked", config)
      f = jax.jit(lambda a, b, sa, sb, c=config: jaxgemm.scaled_matmul(
          a, b, sa, sb, backend="triton", variant="blocked", config=c))
      out = np.asarray(f(*args).astype(F32))
      err = float(np.linalg.norm(out - exact) / np.linalg.norm(exact))
      ref(*args).block_until_ready()
      mine, theirs = timing.time_paired(timer, f, ref, args, ITERS)
      mine, theirs = float(np.median(mine)), float(np.median(theirs))
      tf = 2 * M * K * N / (mine * 1e-3) / 1e12
      print(f"{kind:6s} {config.block_m}x{config.block_n}x{config.block_k} w{config.num_warps} "
            f"s{config.num_stages} align={align!s:5s} err {err:.2e} {mine * 1e3:8.2f} us "
            f"{tf:7.1f} TFLOP/s  ref {theirs * 1e3:8.2f} us  {theirs / mine:5.2f}x", flush=True)
    except Exception as e:  # noqa: BLE001 (a probe: report and go on)
      print(f"{kind:6s} {config} align={align}: FAILED {type(e).__name__}: {str(e)[:200]}",
            flush=True)
