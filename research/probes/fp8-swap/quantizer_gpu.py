"""GPU check of cast_transpose_p after its block modes lost the placeholder operand:
quantize_pair through the primitive (backend="triton") against XLA's, bit for bit, every
block-mode pair, under jit; and a block-recipe FP8 layer's value and gradients with the
Triton quantizer against XLA's quantizer."""
import sys

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from jaxgemm.ops.scaled_matmul.quantize import quantize_pair  # noqa: E402
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe  # noqa: E402

print(jax.devices()[0].device_kind, flush=True)
x = jax.random.normal(jax.random.key(0), (1024, 2048), jnp.bfloat16)
blocks = {"row": (1, 128), "tile": (128, 128)}
for modes in (("row", "row"), ("row", "tile"), ("tile", "row"), ("tile", "tile")):
  got = jax.jit(lambda x: quantize_pair(x, jnp.float8_e4m3fn, blocks[modes[0]],
                                        blocks[modes[1]], backend="triton"))(x)
  want = jax.jit(lambda x: quantize_pair(x, jnp.float8_e4m3fn, blocks[modes[0]],
                                         blocks[modes[1]], backend="xla"))(x)
  # XLA:GPU's fp32 division is not correctly rounded (tests/test_cast_transpose.py), so
  # count fp8 values one step apart rather than demand equality.
  diffs = [int(np.sum(np.asarray(g.astype(jnp.float32)) != np.asarray(w.astype(jnp.float32))))
           for g, w in zip(got, want)]
  print(modes, [g.shape for g in got], "values differing:", diffs, flush=True)

w = jax.random.normal(jax.random.key(1), (2048, 4096), jnp.bfloat16) / 45
for backend in ("triton", "xla"):
  recipe = Fp8Recipe("block", quantize_backend=backend)
  f = jax.jit(jax.value_and_grad(lambda x, w: jaxgemm.matmul(x, w, fp8=recipe)
                                 .astype(jnp.float32).sum(), argnums=(0, 1)))
  val, (gx, gw) = f(x, w)
  print(backend, float(val), float(jnp.linalg.norm(gx.astype(jnp.float32))),
        float(jnp.linalg.norm(gw.astype(jnp.float32))), flush=True)
