"""The FP8 training step's time by recipe variant (issue 28, fused quantization): CUPTI kernel
sums of one step of the bench's FP8 model (`bench.training.GPU_FP8_MODEL`; --cpu: the small
CPU model, a smoke run that prints losses instead).

Runs (--runs, comma-separated; each the bench's `auto` backend for the GEMMs):
  bf16        XLA's bf16 step (the reference)
  tensor      the named per-tensor recipe (power-of-two scales)
  tensor-f32  the same with float32 scales (the recipe before power-of-two scales)
  tensor-tq   per tensor, quantize_backend="triton" (one cast-transpose kernel a tensor)
  block       the named block recipe
  block-tq    block scales, quantize_backend="triton"

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file> [--runs ...]
[--top N] (also list each run's N longest kernels)
"""
import collections
import dataclasses
import re
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from bench import training as T  # noqa: E402
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe  # noqa: E402

CPU = "--cpu" in sys.argv
RUNS = "bf16,tensor,tensor-f32,tensor-tq,block,block-tq"
TOP = 0
for i, a in enumerate(sys.argv):
  if a == "--runs":
    RUNS = sys.argv[i + 1]
  if a == "--top":
    TOP = int(sys.argv[i + 1])
cfg = T.fp8_model(not CPU, quick=True)
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; model {cfg.describe()}",
      flush=True)


def recipe_of(run):
  scaling, *mods = run.split("-")
  recipe = Fp8Recipe.named(scaling)
  if "f32" in mods:
    recipe = dataclasses.replace(recipe, scale_dtype="float32")
  if "tq" in mods:
    recipe = dataclasses.replace(recipe, quantize_backend="triton")
  return recipe


def make_mm(run):
  if run == "bf16":
    return jnp.matmul
  recipe = recipe_of(run)
  return lambda x, w: jaxgemm.matmul(x, w, fp8=recipe)


def kind(name):
  n = name.lower()
  if "cast_transpose" in n:
    return "cast-transpose kernel"
  if "triton" in n or "mosaic" in n or "_kernel" in n and "fusion" not in n:
    return "triton/mosaic kernel"
  if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "sm90")):
    return "cuBLAS GEMM"
  for word in ("reduce", "transpose", "convert"):
    if word in n:
      return f"XLA {word} fusion"
  return "XLA other fusion" if "fusion" in n else "other"


def profile(label, compiled, args, reps=3):
  from jax.experimental.mosaic.gpu import profiler  # noqa: PLC0415
  totals, kernels = [], None
  for _ in range(reps):
    out, timings = profiler.measure(compiled, aggregate=False)(*args)
    jax.block_until_ready(out)
    del out
    totals.append(sum(t for _, t in timings))
    kernels = kernels or timings
  total = float(np.median(totals))
  classes = collections.defaultdict(lambda: [0.0, 0])
  for name, t in kernels:
    classes[kind(name)][0] += t
    classes[kind(name)][1] += 1
  print(f"\n== {label}: {total:.3f} ms a step (median of {reps} CUPTI kernel sums), "
        f"{len(kernels)} kernels", flush=True)
  for c, (t, n) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
    print(f"   {c:28s} {t:8.3f} ms  ({n} kernels)")
  if TOP:   # --top N: the N longest kernels of one step, by name
    for name, t in sorted(kernels, key=lambda kv: -kv[1])[:TOP]:
      print(f"     {t:7.3f} ms  [{kind(name)}] {name[:110]}")
  return total


params = T.init_params(cfg, 0)
opt = T.adam_init(params)
tokens, targets = next(T.batches(cfg, 0))
args = (params, opt, tokens, targets)
results = {}
for run in RUNS.split(","):
  t0 = time.time()
  step = T.make_step(cfg, make_mm(run), jnp.bfloat16)
  try:
    compiled = step.lower(*args).compile()
  except Exception as e:  # noqa: BLE001
    print(f"{run}: compile FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
    continue
  print(f"{run}: compiled in {time.time() - t0:.1f} s", flush=True)
  if CPU:
    _, _, loss = jax.block_until_ready(compiled(*args))
    print(f"   loss {float(loss):.6f}", flush=True)
    continue
  results[run] = profile(run, compiled, args)
  del compiled
ref = results.get("bf16")
for run, ms in results.items():
  print(f"{run:12s} {ms:8.3f} ms" + (f"  {ref / ms:.3f}x the bf16 XLA step" if ref else ""))
