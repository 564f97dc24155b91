"""GPU probe: the Pallas FP8 kernel on 2-CTA clusters (TMA multicast) and with 128x192 tiles.

Question (docs/performance-notes.md, "FP8 GEMMs"): the per-tensor kernel reaches 61-65% of
the FP8 peak with 128x128 CTA tiles, which load 32 KiB from L2 per 4.2 MFLOP: ~9.5 TB/s of
L2 -> SMEM traffic at 1250 TFLOP/s. Does sharing one operand tile in a 2-CTA cluster (25%
fewer bytes) or a 128x192 tile (17% fewer bytes a flop; 192 of a consumer's registers for
its two fp32 arrays) move it? Each config against XLA's scaled form in the same run
(`timing.time_paired`, CUPTI), B stored (N, K) (the kernel alone: no relayout pass) and
for the default and cluster configs also (K, N) (the op's plain layout), with the
relative error against the exact dequantized product and whether the output equals the
default config's bit for bit (the same math, so it must).

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
"""
import dataclasses
import os
import sys
import time
import traceback

import numpy as np
import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm import registry, timing
from jaxgemm.kernels.pallas.scaled_matmul import scaled
from jaxgemm.ops.scaled_matmul import pallas as scaled_pallas
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem

T0 = time.time()
CPU = "--cpu" in sys.argv
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", 500))
E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
ITERS = 2 if CPU else 30
PROBLEMS = ([(256, 256, 384)] if CPU else
            [(8192, 8192, 8192), (8192, 4096, 14336), (4096, 4096, 4096)])
KINDS = os.environ.get("PROBE_KINDS", "tensor,block").split(",")
BLOCKS = {"tensor": (None, None), "block": ((1, 128), (128, 128))}
# 128x192: two (64, 192) fp32 arrays a consumer, 192 registers a thread (the overlap
# variant holds three (64, 128) arrays, as many, and compiles at CONSUMER_REGISTERS).
scaled.MAX_ACC_ELEMENTS = scaled_pallas._MAX_ACC_ELEMENTS = 2 * 64 * 192
timer = timing.Timer("cpu" if CPU else "gpu")
backend = registry.get_backend("pallas", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)


def tflops(m, k, n, ms):
  return 2 * m * k * n / (ms * 1e-3) / 1e12


def forced(config, **fields):
  config = dataclasses.replace(config)
  for name, value in fields.items():
    object.__setattr__(config, name, value)
  return config


def configs(problem):
  variant = backend.default_variant(problem)
  base = backend.default_config(problem, variant)
  out = [("default", base, True), ("cluster_n=2", dataclasses.replace(base, cluster_n=2), True),
         ("cluster_m=2", dataclasses.replace(base, cluster_m=2), True),
         ("cluster_n=2 minor_m", dataclasses.replace(base, cluster_n=2, grid_minor_m=True), False),
         ("cluster_m=2 minor_m", dataclasses.replace(base, cluster_m=2, grid_minor_m=True), False)]
  if problem.scale_kind == "tensor":
    # PallasConfig takes power-of-two tiles only: set past its check. 40 KiB a stage:
    # 4 stages beside the bf16 epilogue's 32 KiB.
    wide = forced(base, tile_n=192, max_concurrent_steps=4)
    wide_m = forced(base, tile_n=192, max_concurrent_steps=4, cluster_m=2)
    out += [("128x192", wide, False), ("128x192 cluster_m=2", wide_m, False),
            ("default 5 stages", dataclasses.replace(base, max_concurrent_steps=5), False)]
  return variant, out


for (m, k, n) in PROBLEMS:
  keys = jax.random.split(jax.random.key(m + k + n), 2)
  x = jax.random.normal(keys[0], (m, k), F32)
  w = jax.random.normal(keys[1], (k, n), F32) / np.sqrt(k)
  for kind in KINDS:
    xb, wb = BLOCKS[kind]
    a8, sa = jaxgemm.quantize(x, E4M3, xb)
    b8, sb = jaxgemm.quantize(w, E4M3, wb)
    b8t, sbt = b8.T.copy(), (sb if kind == "tensor" else sb.T.copy())
    head = f"{m}x{k}x{n} {kind}"
    sa_full = sa if kind == "tensor" else jnp.repeat(sa, 128, axis=1)[:, :k]
    sb_full = sb if kind == "tensor" else jnp.repeat(jnp.repeat(sb, 128, 0), 128, 1)[:k, :n]
    exact = np.asarray(jnp.dot(a8.astype(F32) * sa_full, b8.astype(F32) * sb_full,
                               precision="highest"))
    rel = lambda out: float(np.linalg.norm(np.asarray(out.astype(F32)) - exact)
                            / np.linalg.norm(exact))
    problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                  scale_kind=kind)
    variant, cands = configs(problem)
    firsts = {}
    for trans_b in (True, False):
      args = (a8, b8t, sa, sbt) if trans_b else (a8, b8, sa, sb)
      xla = jax.jit(lambda a, b, sa, sb, t=trans_b: jaxgemm.scaled_matmul(
          a, b, sa, sb, backend="xla", trans_b=t))
      xla(*args).block_until_ready()
      for name, config, both_layouts in cands:
        if time.time() - T0 > DEADLINE_S:
          print("deadline reached", flush=True)
          break
        if not trans_b and not both_layouts:
          continue
        label = f"{head:22s} {'B (N,K)' if trans_b else 'B (K,N)'} {name:22s}"
        try:
          f = jax.jit(lambda a, b, sa, sb, c=config, t=trans_b: jaxgemm.scaled_matmul(
              a, b, sa, sb, backend="pallas", variant=variant, config=c, trans_b=t))
          out = np.asarray(f(*args))
          same = firsts.setdefault(trans_b, out)
          mine, theirs = timing.time_paired(timer, f, xla, args, ITERS)
          mine, theirs = float(np.median(mine)), float(np.median(theirs))
          print(f"{label} err {rel(out):.2e} same-as-default {np.array_equal(out, same)} "
                f"{mine:7.3f} ms {tflops(m, k, n, mine):7.1f} TFLOP/s  xla {theirs:7.3f} ms "
                f"{tflops(m, k, n, theirs):7.1f}  ratio {theirs / mine:5.2f}x  "
                f"stages {config.max_concurrent_steps}", flush=True)
        except Exception as e:  # noqa: BLE001 (a probe: report and go on)
          print(f"{label} FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
          traceback.print_exc(limit=3)
print(f"done in {time.time() - T0:.0f} s", flush=True)
