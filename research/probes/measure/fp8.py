"""Which program `auto` measures and picks for per-tensor and block-scaled FP8 GEMMs.

    python research/probes/measure/fp8.py     # on a GPU; prints each measurement's line
"""

import os
import tempfile

os.environ.setdefault("JAXGEMM_AUTOTUNE_CACHE", os.path.join(tempfile.mkdtemp(), "a.json"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgemm  # noqa: E402
from jaxgemm import dispatch, measure  # noqa: E402

for m, k, n, block in [(8192, 4096, 14336, None), (4096, 4096, 4096, None),
                       (128, 4096, 14336, None), (128, 4096, 14336, "block"),
                       (256, 7168, 2048, "block")]:
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (m, k), jnp.float32)
  w = jax.random.normal(kw, (k, n), jnp.float32)
  if block:
    (xq, xs), (wq, ws) = jaxgemm.quantize(x, block=(1, 128)), jaxgemm.quantize(w, block=(128, 128))
  else:
    (xq, xs), (wq, ws) = jaxgemm.quantize(x), jaxgemm.quantize(w)
  f = lambda *a: jaxgemm.scaled_matmul(*a)
  jax.block_until_ready(jax.jit(f)(xq, wq, xs, ws))
  problem, = jaxgemm.problems_in(f, xq, wq, xs, ws, backward=False)
  print(m, k, n, block or "tensor", "->", dispatch.choose(problem, "auto").describe(),
        "| why not measured now:", measure.why_not_measured(problem, "auto", "cuda"), flush=True)
