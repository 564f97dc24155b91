"""Where the FP8 training step's time goes (issue 28): CUPTI kernel times of one step, by kernel.

For the FP8 step's model (`bench.training.GPU_FP8_MODEL`, or the CPU model with
--cpu for a smoke run) it compiles XLA's bf16 step and `jaxgemm.matmul(x, w,
fp8=recipe, backend=B)` steps for the recipes and backends given, then measures
one step with `jax.experimental.mosaic.gpu.profiler.measure(aggregate=False)`
(every kernel the step launches, by name) a few times, and prints each step's
total and its kernels grouped into classes (cuBLAS GEMMs, Triton / Mosaic
kernels, XLA fusions by kind) and the top kernels by time.

With --variants base,amax2,kmajor,kmajor+amax2 the per-tensor recipe's runs also
go through changed quantization paths, patched into
`jaxgemm.ops.scaled_matmul.training` (the probe's question: what of the ~4 ms the
tensor recipe's quantization adds can go):
  amax2   per-tensor amax as a row-wise max then a max of the rows, in x's dtype
          (max is exact in any float type), instead of one f32 reduction;
  kmajor  every GEMM gets K-major operands: the forward takes W8^T with
          trans_b=True, the VJP saves X8^T and runs the wgrad on (X8^T, dY8^T),
          so no transpose is left to the kernel's pre-pass or to XLA's cuBLAS call.
  bf16out the xla backend's per-tensor form (the mixed dgrad and wgrad under `auto`) with
          its dot writing bf16 and the scale multiplied in bf16 (one rounding only if
          XLA folds it into cuBLASLt's alpha: xla_forms.py's `bf16_out` tells).
--runs takes the recipes "tensor", "block" and "tensor-e4m3" (per tensor with e4m3
gradients: same-dtype dgrad and wgrad, which `auto` runs on Pallas).
With --dump DIR each run's kernels (name, ms) and optimized HLO go to DIR.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
  [--runs auto:tensor,auto:block,...] [--variants base,...] [--dump DIR]
"""
import collections
import re
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
from bench import training as T  # noqa: E402
from bench.runner import REF, REF_VARIANT  # noqa: E402

CPU = "--cpu" in sys.argv
RUNS = "auto:tensor,auto:block"
VARIANTS = "base"
DUMP = None
for i, a in enumerate(sys.argv):
  if a == "--runs":
    RUNS = sys.argv[i + 1]
  if a == "--variants":
    VARIANTS = sys.argv[i + 1]
  if a == "--dump":
    DUMP = sys.argv[i + 1]
cfg = T.fp8_model(not CPU, quick=True)
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; model {cfg.describe()}",
      flush=True)


def classify(name: str) -> str:
  n = name.lower()
  if "triton" in n or n.startswith("scaled_matmul_kernel") or "_kernel" in n and "fusion" not in n:
    return "triton/mosaic kernel"
  if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "sm90")):
    return "cuBLAS GEMM"
  if "reduce" in n or "reduction" in n:
    return "XLA reduction fusion"
  if "transpose" in n:
    return "XLA transpose fusion"
  if "fusion" in n or "loop" in n or "input" in n:
    return "XLA loop fusion"
  return "other: " + re.sub(r"[_\d]+$", "", name)[:40]


def profile(label, compiled, args, reps=3, dump=None):
  from jax.experimental.mosaic.gpu import profiler  # noqa: PLC0415
  totals, per_kernel = [], None
  for _ in range(reps):
    out, timings = profiler.measure(compiled, aggregate=False)(*args)
    jax.block_until_ready(out)
    del out
    totals.append(sum(t for _, t in timings))
    if per_kernel is None:
      per_kernel = timings
  total = float(np.median(totals))
  classes = collections.defaultdict(lambda: [0.0, 0])
  names = collections.defaultdict(lambda: [0.0, 0])
  for name, t in per_kernel:
    c = classes[classify(name)]
    c[0] += t
    c[1] += 1
    k = names[name[:90]]
    k[0] += t
    k[1] += 1
  if dump:
    import os  # noqa: PLC0415
    os.makedirs(dump, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9_.+=-]", "_", label)
    with open(f"{dump}/{tag}.kernels.txt", "w") as f:
      f.writelines(f"{t:.4f} {name}\n" for name, t in per_kernel)
    with open(f"{dump}/{tag}.hlo.txt", "w") as f:
      f.write(compiled.as_text())
  print(f"\n== {label}: {total:.3f} ms a step (median of {reps}, CUPTI kernel sum), "
        f"{len(per_kernel)} kernels", flush=True)
  for c, (t, n) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
    print(f"   {c:34s} {t:8.3f} ms {100 * t / total:5.1f}%  ({n} kernels)")
  print("   top kernels:")
  for name, (t, n) in sorted(names.items(), key=lambda kv: -kv[1][0])[:40]:
    print(f"     {t:8.3f} ms x{n:<3d} {name}")
  return total


import jaxgemm.ops.scaled_matmul.training as FT  # noqa: E402
from jaxgemm.ops.scaled_matmul.quantize import quantize as _quantize  # noqa: E402

import jaxgemm  # noqa: E402
from jax import lax  # noqa: E402
from jaxgemm.ops.scaled_matmul import xla as scaled_xla  # noqa: E402

_BASE = (FT._forward, FT._backward, FT.quantize)
_BASE_PRODUCT = scaled_xla.scaled_product


def _quantize_amax2(x, dtype=jnp.float8_e4m3fn, block=None):
  if block is not None:
    return _quantize(x, dtype, block)
  f32 = jnp.float32
  fmax = float(jnp.finfo(dtype).max)
  x2 = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)
  amax = jnp.max(jnp.max(jnp.abs(x2), axis=-1)).astype(f32)
  s = amax * np.float32(1 / fmax)
  s = jnp.where((s >= float(jnp.finfo(f32).tiny)) | ~jnp.isfinite(s), s, f32(1))
  return jnp.clip(x.astype(f32) * (1 / s), -fmax, fmax).astype(dtype), s


def _forward_kmajor(recipe, out_dtype, x_dtype, w_dtype, x, w):
  if recipe.scaling != "tensor":
    return _BASE[0](recipe, out_dtype, x_dtype, w_dtype, x, w)
  x8, sx = FT.quantize(x, recipe.dtype, None)
  w8, sw = FT.quantize(w, recipe.dtype, None)
  y = FT._gemm(recipe, x8, w8.T, sx, sw, out_dtype, trans_b=True)
  return y, ((x8.T, sx), w8, sw)


def _backward_kmajor(recipe, out_dtype, x_dtype, w_dtype, saved, dy):
  if recipe.scaling != "tensor":
    return _BASE[1](recipe, out_dtype, x_dtype, w_dtype, saved, dy)
  (x8t, sx), w8, sw = saved
  dy8, sdy = FT.quantize(dy, recipe.grad_dtype, None)
  dx = FT._gemm(recipe, dy8, w8, sdy, sw, x_dtype, trans_b=True)
  dw = FT._gemm(recipe, x8t, dy8.T, sx, sdy, w_dtype, trans_b=True)
  return dx, dw


def _scaled_product_bf16_out(problem, a, b, a_scale, b_scale):
  """The xla backend's per-tensor form with the dot writing out_dtype and the scale
  multiplied in it: one rounding if XLA folds the scale into cuBLASLt's alpha, two if not
  (the GEMM-level error tells: xla_forms.py)."""
  if problem.scale_kind != "tensor" or problem.precision is not None:
    return _BASE_PRODUCT(problem, a, b, a_scale, b_scale)
  out = problem.out_dtype
  y = lax.dot_general(a, b, scaled_xla._dims(problem), precision=lax.Precision.HIGHEST,
                      preferred_element_type=out)
  return y * (a_scale * b_scale).astype(out)


def use_variant(name):
  fwd, bwd, q = _BASE
  scaled_xla.scaled_product = (_scaled_product_bf16_out if "bf16out" in name
                               else _BASE_PRODUCT)
  if "kmajor" in name:
    fwd, bwd = _forward_kmajor, _backward_kmajor
  if "amax2" in name:
    q = _quantize_amax2
  FT._forward, FT._backward, FT.quantize = fwd, bwd, q
  FT._fp8_matmul.defvjp(fwd, bwd)


params = T.init_params(cfg, 0)
opt = T.adam_init(params)
tokens, targets = next(T.batches(cfg, 0))
args = (params, opt, tokens, targets)
runs = [(REF, REF_VARIANT, None)]
runs += [(b, T.FP8_VARIANT_PREFIX + r, q) for b, r in (s.split(":") for s in RUNS.split(","))
         for q in VARIANTS.split(",") if q == "base" or r.startswith("tensor")]


def make_mm(backend, variant):
  """The bench's mm, or for "fp8=tensor-e4m3" the per-tensor recipe with e4m3 gradients
  (same-dtype dgrad and wgrad: `auto` sends them to the Pallas kernel, which writes bf16)."""
  if variant == T.FP8_VARIANT_PREFIX + "tensor-e4m3":
    recipe = FT.Fp8Recipe("tensor", grad_dtype="float8_e4m3fn")
    return lambda x, w: jaxgemm.matmul(x, w, fp8=recipe, backend=backend)
  return T.make_mm(backend, variant, "bf16")


results = {}
for backend, variant, quant in runs:
  use_variant(quant or "base")
  t0 = time.time()
  mm = make_mm(backend, variant)
  if quant and quant != "base":
    variant = f"{variant}[{quant}]"
  step = T.make_step(cfg, mm, jnp.bfloat16)
  try:
    compiled = step.lower(*args).compile()
  except Exception as e:  # noqa: BLE001
    print(f"{backend}/{variant}: compile FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    continue
  print(f"{backend}/{variant}: compiled in {time.time() - t0:.1f} s", flush=True)
  if CPU:
    new_params, _, loss = jax.block_until_ready(compiled(*args))
    moved = sum(float(jnp.sum(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(new_params), jax.tree.leaves(params)))
    print(f"   loss {float(loss):.6f}, parameters moved by {moved:.6f}", flush=True)
    continue
  results[(backend, variant)] = profile(f"{backend}/{variant}", compiled, args, dump=DUMP)
  del compiled
ref = results.get((REF, runs[0][1]))
for k, v in results.items():
  print(f"{k[0]}/{k[1]}: {v:.3f} ms" + (f"  {ref / v:.3f}x the bf16 XLA step" if ref else ""))
