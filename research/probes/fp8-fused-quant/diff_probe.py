"""Where the xla and Triton quantize_pair differ on the GPU (run8b: block modes not bit-equal;
bit-equal on the CPU): per output, the scales' and q's mismatch counts and the largest gap
in fp8 steps, and whether each backend equals the float32 math done in numpy
(scale = amax * f32(1/max), q = rne(x * f32(1 / scale))).

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp
import ml_dtypes

sys.path.insert(0, ".")
from jaxgemm.ops.scaled_matmul.quantize import quantize_pair  # noqa: E402

E4M3 = jnp.float8_e4m3fn
x = jax.random.normal(jax.random.key(0), (1024, 2048), jnp.float32)
x = (x * jnp.exp2(jax.random.uniform(jax.random.key(1), (1024, 1), minval=-8, maxval=8))
     ).astype(jnp.bfloat16)
x32 = np.asarray(x, np.float32)
# numpy's float32 reference of quantize(x, block=(1, 128))
amax = np.abs(x32).reshape(1024, 16, 128).max(-1)
scale = (amax * np.float32(1 / 448)).astype(np.float32)
inv = (np.float32(1) / scale).astype(np.float32)
q_np = np.clip(x32 * np.repeat(inv, 128, axis=1), -448, 448).astype(ml_dtypes.float8_e4m3fn)
names = ("q", "scale", "q_t", "scale_t")
outs = {b: jax.jit(lambda x, b=b: quantize_pair(x, E4M3, (1, 128), (1, 128), backend=b))(x)
        for b in ("xla", "triton")}
for name, a, b in zip(names, outs["xla"], outs["triton"]):
  a, b = np.asarray(a), np.asarray(b)
  if a.dtype.itemsize == 1:
    gap = np.abs(a.view(np.uint8).astype(int) - b.view(np.uint8).astype(int))
  else:
    gap = (a != b).astype(int)
  print(f"{name:8s} mismatches {int((gap > 0).sum())} of {gap.size}, largest gap {int(gap.max())}")
for backend, out in outs.items():
  print(f"{backend}: q equals numpy's float32 math: "
        f"{np.array_equal(np.asarray(out[0]).view(np.uint8), q_np.view(np.uint8))}, "
        f"scales equal: {np.array_equal(np.asarray(out[1]), scale)}")
