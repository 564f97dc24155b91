"""Where the FP8 suite's XLA bf16 reference step ran out of memory (H100 at batch 8,
2026-11-25; H200 at batch 4 beside three other jobs, 2026-11-26): what XLA plans for the
step (compiled.memory_analysis) and what a call uses (memory_stats; run with
XLA_PYTHON_CLIENT_PREALLOCATE=false so that the peak is the program's).

  PYTHONPATH=$PWD/.gpu-site XLA_PYTHON_CLIENT_PREALLOCATE=false python3 research/probes/h200x4-2026-11-26/fp8_step_memory.py
"""
import dataclasses
import sys

import jax
import jax.numpy as jnp

from jaxgemm.bench import training as T

GB = 1e9
batch = int(sys.argv[1]) if len(sys.argv) > 1 else T.GPU_FP8_MODEL.batch
cfg = dataclasses.replace(T.GPU_FP8_MODEL, batch=batch, steps=2)
dev = jax.devices()[0]
print(dev, cfg.describe())


def stats(label):
  s = dev.memory_stats() or {}
  print(f"  {label}: in use {s.get('bytes_in_use', 0) / GB:.2f} GB, peak "
        f"{s.get('peak_bytes_in_use', 0) / GB:.2f} GB, limit {s.get('bytes_limit', 0) / GB:.1f} GB",
        flush=True)


for backend, variant in ((T.REF, T.REF_VARIANT), ("auto", "fp8=tensor")):
  print(f"{backend}/{variant}", flush=True)
  step = T.make_step(cfg, T.make_mm(backend, variant, "bf16"), jnp.bfloat16)
  params = T.init_params(cfg, 0)
  opt = T.adam_init(params)
  tok, tgt = next(T.batches(cfg, 0))
  stats("inputs placed")
  compiled = step.lower(params, opt, tok, tgt).compile()
  m = compiled.memory_analysis()
  print(f"  plan: arguments {m.argument_size_in_bytes / GB:.2f} GB, outputs "
        f"{m.output_size_in_bytes / GB:.2f}, temporaries {m.temp_size_in_bytes / GB:.2f}, "
        f"aliased {m.alias_size_in_bytes / GB:.2f}", flush=True)
  stats("compiled")
  try:
    jax.block_until_ready(compiled(params, opt, tok, tgt))
    stats("after one step")
  except Exception as e:  # noqa: BLE001
    print(f"  step failed: {type(e).__name__}: {str(e)[:300]}")
    stats("after the failure")
  del step, params, opt, compiled
