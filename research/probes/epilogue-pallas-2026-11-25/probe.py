"""Pallas fused epilogues and GLU on the GPU: compile, check, time against XLA.

    python research/probes/epilogue-pallas-2026-11-25/probe.py [check] [time]

check: small and ragged problems of every epilogue switch on both rungs,
against the jnp program of the same semantics (fp32 epilogue) run by XLA.
time: 4096^3 and 8192x4096x14336 (MxKxN) bf16: gelu+bias, silu, bias+residual,
glu silu, each against XLA's jitted jnp program of the same expression, both
as a user writes it in bf16 (`gelu(x @ w + b)`) and with the fp32 epilogue
(the op's semantics); CUPTI kernel time, paired (jaxgemm.timing.time_paired).
"""

from __future__ import annotations

import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import timing
from jaxgemm.kernels.pallas.matmul import warp_specialized
from jaxgemm.ops.fused_matmul import pallas as fp
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.glu import pallas as gp
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul.pallas import PallasConfig, PallasMatmul
from jaxgemm.ops.matmul.problem import GemmProblem

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float32)
FUSED, GLU, MATMUL = fp.PallasFusedMatmul(), gp.PallasGlu(), PallasMatmul()


def log(*a):
  print(*a, flush=True)


def operands(shapes, dtype, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


def err(out, ref):
  outs = out if isinstance(out, tuple) else (out,)
  refs = ref if isinstance(ref, tuple) else (ref,)
  worst = 0.0
  for o, r in zip(outs, refs):
    o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
    worst = max(worst, float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30)))
  return worst


def check_case(backend, problem, variant, config=None):
  config = config or backend.default_config(problem, variant)
  backend.check(problem, variant, config)
  shapes = (problem.a_shape, problem.b_shape) + (
      (problem.b_shape,) if isinstance(problem, GluProblem) else ()) + problem.extra_shapes
  ops = operands(shapes, problem.dtype)
  t = time.time()
  out = jax.jit(backend.impl(problem, variant, config, "cuda"))(*ops)
  jax.block_until_ready(out)
  ref_fn = fp.reference if isinstance(problem, FusedMatmulProblem) else gp.reference
  ref = jax.jit(lambda *o: ref_fn(problem, *o))(*ops)
  e = err(out, ref)
  log(f"  {'OK ' if e < 2e-2 else 'BAD'} {variant:17s} {problem.describe():60s} "
      f"rel err {e:.2e}  ({time.time() - t:.1f} s)")
  return e


def run_checks():
  log("== check (vs the jnp program of the same semantics, on the GPU)")
  fm = lambda m, n, k, **kw: FusedMatmulProblem(kw.pop("batch", 1), m, n, k, BF16,
                                                kw.pop("out", BF16), F32, **kw)
  cases = [
      (fm(512, 512, 512, activation="gelu", bias="shared"), "warp_specialized"),
  ]
  for p, v in cases:   # the bias read decides BIAS_LOAD; fall back to "tile"
    try:
      check_case(FUSED, p, v)
    except Exception as e:  # noqa: BLE001
      log(f"  bias row read FAILED ({type(e).__name__}: {str(e)[:400]}); BIAS_LOAD=tile")
      warp_specialized.BIAS_LOAD = "tile"
      check_case(FUSED, p, v)
  log(f"  BIAS_LOAD={warp_specialized.BIAS_LOAD}")
  more = [
      (fm(512, 512, 512, activation="silu"), "clusters"),
      (fm(512, 512, 512, bias="shared", residual=True), "clusters"),
      (fm(1000, 1024, 1000, activation="gelu_exact", bias="batched", residual=True,
          save_preactivation=True, batch=2), "warp_specialized"),
      (fm(4095, 4097, 1000, activation="tanh", bias="shared", residual=True,
          save_preactivation=True), "clusters"),
      (fm(512, 512, 512, activation="relu", trans_a=True, trans_b=True, out=F32), "clusters"),
      (fm(512, 384, 512, activation="sigmoid", bias="shared"), "warp_specialized"),
      (fm(512, 512, 512, gate="out", gate_activation="gelu"), "clusters"),
      (fm(1000, 1024, 1000, gate="out", gate_activation="silu", trans_b=True),
       "warp_specialized"),
      (fm(512, 512, 512, gate="lhs", gate_activation="tanh"), "clusters"),
  ]
  for p, v in more:
    try:
      check_case(FUSED, p, v)
    except Exception:  # noqa: BLE001
      log(f"  FAIL {v} {p.describe()}\n{traceback.format_exc()[-1500:]}")
  gl = lambda m, n, k, **kw: GluProblem(kw.pop("batch", 1), m, n, k, BF16, BF16, F32, **kw)
  for p, v in [(gl(512, 512, 512, activation="silu"), "dual"),
               (gl(1000, 1024, 1000, activation="gelu", bias="shared", save_preactivation=True,
                   batch=2), "dual_clusters"),
               (gl(512, 512, 512, activation="silu", trans_b=True), "dual_clusters")]:
    try:
      check_case(GLU, p, v)
    except Exception:  # noqa: BLE001
      log(f"  FAIL {v} {p.describe()}\n{traceback.format_exc()[-1500:]}")


def run_timing(shapes):
  log(f"== time (CUPTI, paired with XLA; {jax.devices()[0].device_kind})")
  timer = timing.Timer("gpu")
  f32 = jnp.float32
  for m, k, n in shapes:
    x, w, w2, r = operands([(1, m, k), (1, k, n), (1, k, n), (1, m, n)], BF16)
    bias = operands([(n,)], BF16, seed=1)[0]
    flops = 2 * m * n * k
    cases = {
        "matmul": (None, lambda x, w: x @ w, lambda x, w: (x @ w), (x, w)),
        "gelu+bias": (dict(activation="gelu", bias="shared"),
                      lambda x, w, b: jax.nn.gelu(x @ w + b),
                      lambda x, w, b: jax.nn.gelu(jnp.matmul(x, w, preferred_element_type=f32)
                                                  + b.astype(f32)).astype(x.dtype),
                      (x, w, bias)),
        "silu": (dict(activation="silu"), lambda x, w: jax.nn.silu(x @ w),
                 lambda x, w: jax.nn.silu(jnp.matmul(x, w, preferred_element_type=f32)
                                          ).astype(x.dtype), (x, w)),
        "bias+residual": (dict(bias="shared", residual=True), lambda x, w, b, r: x @ w + b + r,
                          lambda x, w, b, r: (jnp.matmul(x, w, preferred_element_type=f32)
                                              + b.astype(f32) + r.astype(f32)).astype(x.dtype),
                          (x, w, bias, r)),
        "glu silu": ("glu", lambda x, w, v: jax.nn.silu(x @ w) * (x @ v),
                     lambda x, w, v: (jax.nn.silu(jnp.matmul(x, w, preferred_element_type=f32))
                                      * jnp.matmul(x, v, preferred_element_type=f32)
                                      ).astype(x.dtype), (x, w, w2)),
    }
    for name, (kind, user, semantic, args) in cases.items():
      try:
        if kind is None:
          p = GemmProblem(1, m, n, k, BF16, BF16, F32)
          backend, variant = MATMUL, "clusters"
        elif kind == "glu":
          p = GluProblem(1, m, n, k, BF16, BF16, F32, activation="silu")
          backend, variant = GLU, "dual_clusters"
          flops_case = 2 * flops
        else:
          p = FusedMatmulProblem(1, m, n, k, BF16, BF16, F32, **kind)
          backend, variant = FUSED, "clusters"
        flops_case = 2 * flops if kind == "glu" else flops
        cfg = backend.default_config(p, variant)
        kern = jax.jit(backend.impl(p, variant, cfg, "cuda"))
        xla_user, xla_sem = jax.jit(user), jax.jit(semantic)
        t = time.time()
        out = jax.block_until_ready(kern(*args))
        ref = jax.block_until_ready(xla_sem(*args))
        jax.block_until_ready(xla_user(*args))
        e = err(out, ref)
        compile_s = time.time() - t
        kt, ut = timing.time_paired(timer, kern, xla_user, args, 20)
        _, st = timing.time_paired(timer, kern, xla_sem, args, 20)
        km, um, sm = (float(np.median(v)) for v in (kt, ut, st))
        tf = lambda ms: flops_case / ms / 1e9
        log(f"  {m}x{k}x{n} {name:14s} pallas {variant} {km * 1e3:8.1f} us "
            f"({tf(km):6.1f} TFLOP/s) | XLA bf16 {um * 1e3:8.1f} us ({um / km:.3f}x) | "
            f"XLA fp32-epi {sm * 1e3:8.1f} us ({sm / km:.3f}x) | rel err {e:.1e} | "
            f"cfg {cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}/{cfg.max_concurrent_steps} "
            f"({compile_s:.0f} s compile)")
      except Exception:  # noqa: BLE001
        log(f"  FAIL {m}x{k}x{n} {name}\n{traceback.format_exc()[-1500:]}")


if __name__ == "__main__":
  what = sys.argv[1:] or ["check", "time"]
  log(f"jax {jax.__version__}, {jax.devices()}")
  if "check" in what:
    run_checks()
  if "time" in what:
    run_timing([(4096, 4096, 4096), (8192, 4096, 14336)])
