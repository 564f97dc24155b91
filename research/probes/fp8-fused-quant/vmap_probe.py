"""Whether a vmapped FP8 matmul equals its entries bit for bit on the GPU, by quantizer and GEMM backend
(tests/test_fp8_training.py::test_vmap_quantizes_each_entry failed on an H100 for the block
and float32-scale recipes). Usage there: PYTHONPATH=$PWD/.gpu-site python3 <this file>"""
import dataclasses, sys
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
import jax, jax.numpy as jnp, numpy as np
import jaxgemm
from jaxgemm import Fp8Recipe
F32 = np.float32
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((3, 16, 256)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((256, 192)) / 16, jnp.bfloat16)
for name, base in (("block", Fp8Recipe.named("block")),
                   ("tensor-f32", Fp8Recipe("tensor", grad_dtype="float8_e5m2", scale_dtype="float32")),
                   ("tensor", Fp8Recipe.named("tensor"))):
  for qb in ("xla", "triton"):
    for gemm in ("xla", "auto"):
      r = dataclasses.replace(base, quantize_backend=qb)
      f = lambda x, w: jaxgemm.matmul(x, w, fp8=r, backend=gemm)
      out = jax.vmap(f, in_axes=(0, None))(x, w)
      d = max(float(jnp.max(jnp.abs(out[i].astype(F32) - f(x[i], w).astype(F32)))) for i in range(3))
      g = jax.vmap(jax.grad(lambda w, x: f(x, w).astype(F32).sum()), in_axes=(None, 0))(w, x)
      dg = float(jnp.max(jnp.abs(g[2].astype(F32) - jax.grad(lambda w: f(x[2], w).astype(F32).sum())(w).astype(F32))))
      print(f"{name:<11} quantizer {qb:<6} gemm {gemm:<5} vmap-x max diff {d:.3g}  vmap-grad max diff {dg:.3g}", flush=True)
