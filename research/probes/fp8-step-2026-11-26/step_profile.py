"""Where the FP8 training step's time goes (issue 28): CUPTI kernel times of one step, by kernel.

For the FP8 step's model (`bench.training.GPU_FP8_MODEL`, or the CPU model with
--cpu for a smoke run) it compiles XLA's bf16 step and `jaxgemm.matmul(x, w,
fp8=recipe, backend=B)` steps for the recipes and backends given, then measures
one step with `jax.experimental.mosaic.gpu.profiler.measure(aggregate=False)`
(every kernel the step launches, by name) a few times, and prints each step's
total and its kernels grouped into classes (cuBLAS GEMMs, Triton / Mosaic
kernels, XLA fusions by kind) and the top kernels by time.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
  [--runs auto:tensor,auto:block,...]
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
for i, a in enumerate(sys.argv):
  if a == "--runs":
    RUNS = sys.argv[i + 1]
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


def profile(label, compiled, args, reps=3):
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
  print(f"\n== {label}: {total:.3f} ms a step (median of {reps}, CUPTI kernel sum), "
        f"{len(per_kernel)} kernels", flush=True)
  for c, (t, n) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
    print(f"   {c:34s} {t:8.3f} ms {100 * t / total:5.1f}%  ({n} kernels)")
  print("   top kernels:")
  for name, (t, n) in sorted(names.items(), key=lambda kv: -kv[1][0])[:40]:
    print(f"     {t:8.3f} ms x{n:<3d} {name}")
  return total


params = T.init_params(cfg, 0)
opt = T.adam_init(params)
tokens, targets = next(T.batches(cfg, 0))
args = (params, opt, tokens, targets)
runs = [(REF, REF_VARIANT, None)]
runs += [(b, T.FP8_VARIANT_PREFIX + r, None) for b, r in (s.split(":") for s in RUNS.split(","))]
results = {}
for backend, variant, _ in runs:
  t0 = time.time()
  mm = T.make_mm(backend, variant, "bf16")
  step = T.make_step(cfg, mm, jnp.bfloat16)
  try:
    compiled = step.lower(*args).compile()
  except Exception as e:  # noqa: BLE001
    print(f"{backend}/{variant}: compile FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    continue
  print(f"{backend}/{variant}: compiled in {time.time() - t0:.1f} s", flush=True)
  if CPU:
    jax.block_until_ready(compiled(*args))
    continue
  results[(backend, variant)] = profile(f"{backend}/{variant}", compiled, args)
  del compiled
ref = results.get((REF, runs[0][1]))
for k, v in results.items():
  print(f"{k[0]}/{k[1]}: {v:.3f} ms" + (f"  {ref / v:.3f}x the bf16 XLA step" if ref else ""))
