"""XLA's per-tensor scaled FP8 GEMM written three ways (the FP8 step's dgrad and wgrad run
it: `auto` keeps XLA for mixed e5m2 x e4m3 pairs). The step's profile showed each such
GEMM writing fp32 and a separate convert pass to bf16 (run4: ~1.1 ms of the step).

  f32_then_scale  (dot(a8, b8, f32, HIGHEST) * (sa * sb)).astype(bf16)   the xla backend's
  dequant_f32     dot(a8.astype(f32) * sa, b8.astype(f32) * sb, f32, HIGHEST).astype(bf16)
  dequant_bf16    dot(a8.astype(bf16) * sa, b8.astype(bf16) * sb, bf16, HIGHEST)
  bf16_out        dot(a8, b8, bf16, HIGHEST) * (sa * sb).astype(bf16): one rounding if XLA
                  folds the scale into cuBLASLt's alpha (not yet run on a GPU)

For each: the custom call XLA emits (target, result type), the error against the exact
dequantized product, and the CUPTI time. Then (--step) the FP8 step's profile with the
xla backend's per-tensor form replaced by `dequant_f32`.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file> [--step]
"""
import os
import re
import sys

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from jaxgemm import timing  # noqa: E402
from jaxgemm.ops.scaled_matmul import xla as scaled_xla  # noqa: E402

CPU = jax.default_backend() == "cpu"
F32, BF16 = jnp.float32, jnp.bfloat16
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
timer = timing.Timer("cpu" if CPU else "gpu")
HI = lax.Precision.HIGHEST


def forms(dims):
  def f32_then_scale(a, b, sa, sb):
    return (lax.dot_general(a, b, dims, precision=HI, preferred_element_type=F32)
            * (sa * sb)).astype(BF16)

  def dequant_f32(a, b, sa, sb):
    return lax.dot_general(a.astype(F32) * sa, b.astype(F32) * sb, dims, precision=HI,
                           preferred_element_type=F32).astype(BF16)

  def dequant_bf16(a, b, sa, sb):
    return lax.dot_general(a.astype(BF16) * sa.astype(BF16), b.astype(BF16) * sb.astype(BF16),
                           dims, precision=HI, preferred_element_type=BF16)
  def bf16_out(a, b, sa, sb):
    return (lax.dot_general(a, b, dims, precision=HI, preferred_element_type=BF16)
            * (sa * sb).astype(BF16))
  return {"f32_then_scale": f32_then_scale, "dequant_f32": dequant_f32,
          "dequant_bf16": dequant_bf16, "bf16_out": bf16_out}


# (name, m, k, n, a dtype, b dtype, a stored, b stored, dims): the step's layer at d 4096, ff
# 14336, 8192 tokens, operands K-major as cuBLAS reads them.
s = (64, 256, 128) if CPU else (8192, 14336, 4096)
w = (64, 128, 256) if CPU else (4096, 8192, 14336)
CASES = [("dgrad", *s, E5M2, E4M3, (s[0], s[1]), (s[2], s[1]), (((1,), (1,)), ((), ()))),
         ("wgrad", *w, E4M3, E5M2, (w[0], w[1]), (w[2], w[1]), (((1,), (1,)), ((), ())))]
for name, m, k, n, adt, bdt, ashape, bshape, dims in CASES:
  ka, kb = jax.random.split(jax.random.key(m + n))
  a8, sa = jaxgemm.quantize(jax.random.normal(ka, ashape, F32), adt)
  b8, sb = jaxgemm.quantize(jax.random.normal(kb, bshape, F32), bdt)
  exact = np.asarray(lax.dot_general(a8.astype(F32) * sa, b8.astype(F32) * sb, dims,
                                     precision=HI), np.float64)
  base = None
  for label, f in forms(dims).items():
    fj = jax.jit(f)
    hlo = fj.lower(a8, b8, sa, sb).compile().as_text()
    calls = sorted({(re.search(r'custom_call_target="([^"]+)"', ln).group(1),
                     ln.split("=")[1].split("custom-call")[0].strip()[:60])
                    for ln in hlo.splitlines() if "custom_call_target" in ln})
    out = np.asarray(fj(a8, b8, sa, sb).astype(F32), np.float64)
    err = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    ms = float(np.median(timer.time(fj, (a8, b8, sa, sb), 3 if CPU else 30)))
    base = base or ms
    tf = 2 * m * k * n / (ms * 1e-3) / 1e12
    print(f"{name} {label:15s} err {err:.2e} {ms:7.3f} ms {tf:7.1f} TFLOP/s "
          f"({base / ms:.3f}x the first) calls {calls}", flush=True)

if "--step" in sys.argv:
  def product(problem, a, b, a_scale, b_scale, _orig=scaled_xla.scaled_product):
    if problem.scale_kind != "tensor" or problem.precision is not None:
      return _orig(problem, a, b, a_scale, b_scale)
    dims = scaled_xla._dims(problem)
    return lax.dot_general(a.astype(F32) * a_scale, b.astype(F32) * b_scale, dims,
                           precision=HI, preferred_element_type=F32).astype(problem.out_dtype)
  scaled_xla.scaled_product = product
  sys.argv = [sys.argv[0], "--runs", "auto:tensor"] + (["--cpu"] if CPU else [])
  here = os.path.dirname(os.path.abspath(__file__))
  exec(compile(open(f"{here}/step_profile.py").read(), "step_profile.py", "exec"))
