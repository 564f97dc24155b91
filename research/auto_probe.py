"""Which kernels backend="auto" runs in the training suite's step (a GPU probe).

    PYTHONPATH=.gpu-site python3 research/auto_probe.py   # from the repository root

Prints dispatch's choice for each of the step's GEMMs (forward and backward)
and counts the Mosaic GPU kernels in the compiled step. On the H200 with the
shipped table (2026-11-22): three of the fifteen GEMMs on Pallas, 6 Mosaic
custom calls (two layers), the rest XLA.
"""
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench, research
import functools, re
import jax, jax.numpy as jnp
from bench import training as T
from bench.tune import training_problems
from jaxgemm import dispatch
for p in training_problems("bf16"):
  print(p.describe(), "->", dispatch.choose(p, "auto").describe()[:40])
cfg = T.GPU_MODEL
mm = T.make_mm("auto", T.DEFAULT_VARIANT, "bf16")
step = T.make_step(cfg, mm, jnp.bfloat16)
params = T.init_params(cfg, 0); opt = T.adam_init(params)
tok, tgt = next(T.batches(cfg, 0))
hlo = step.lower(params, opt, tok, tgt).compile().as_text()
print("mosaic custom calls in the auto step:", len(re.findall(r'custom_call_target="mosaic_gpu[^"]*"', hlo)))
