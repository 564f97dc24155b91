"""quantize_pair (x and x^T to fp8, with scales) by XLA and by the Triton cast-transpose
kernel, on the FP8 step's operand shapes: CUPTI time of the jitted call, its bandwidth
against the bytes it must move (bf16 read once, two fp8 writes, the scales), and whether
the two backends agree bit for bit.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
from jaxgemm.ops.scaled_matmul.quantize import quantize_pair  # noqa: E402

E4M3, E5M2, E8M0 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e8m0fnu
CPU = jax.default_backend() == "cpu"
SHAPES = [(256, 384)] if CPU else [(8192, 4096), (8192, 14336), (4096, 14336), (14336, 4096)]
# (label, dtype, block, block_t, scale_dtype): the recipes' operands.
MODES = [("tensor e4m3 pow2", E4M3, None, None, E8M0),
         ("tensor e5m2 pow2", E5M2, None, None, E8M0),
         ("x block", E4M3, (1, 128), (1, 128), jnp.float32),
         ("dy block", E4M3, (1, 128), (128, 128), jnp.float32),
         ("w block", E4M3, (128, 128), (128, 128), jnp.float32)]


def cupti_ms(f, *args, reps=5):
  if CPU:
    return float("nan")
  from jax.experimental.mosaic.gpu import profiler  # noqa: PLC0415
  times = []
  for _ in range(reps):
    out, t = profiler.measure(f)(*args)
    jax.block_until_ready(out)
    times.append(t)
  return float(np.median(times))


for rows, cols in SHAPES:
  x = jax.random.normal(jax.random.key(rows + cols), (rows, cols), jnp.float32)
  x = (x * jnp.exp2(jax.random.uniform(jax.random.key(1), (rows, 1), minval=-8, maxval=8))
       ).astype(jnp.bfloat16)
  for label, dtype, block, block_t, scale_dtype in MODES:
    outs, times = {}, {}
    for backend in ("xla", "triton"):
      f = jax.jit(lambda x, b=backend: quantize_pair(x, dtype, block, block_t,
                                                     scale_dtype=scale_dtype, backend=b))
      outs[backend] = jax.block_until_ready(f(x))
      times[backend] = cupti_ms(f, x)
    same = all(np.array_equal(np.asarray(a).view(np.uint8) if a.dtype.itemsize == 1
                              else np.asarray(a), np.asarray(b).view(np.uint8)
                              if b.dtype.itemsize == 1 else np.asarray(b))
               for a, b in zip(outs["xla"], outs["triton"]))
    moved = rows * cols * (2 + 1 + 1)   # bf16 in, q and q^T out (scales: < 1%)
    gbs = {b: moved / t / 1e6 for b, t in times.items()}
    print(f"{rows}x{cols} {label:17s} xla {times['xla']:7.3f} ms ({gbs['xla']:6.0f} GB/s)  "
          f"triton {times['triton']:7.3f} ms ({gbs['triton']:6.0f} GB/s)  "
          f"{times['xla'] / times['triton']:5.2f}x  bit-equal {same}", flush=True)
