"""GPU probe of the FP8 scaled_matmul kernels (issue 28): correctness and CUPTI time per config.

For each problem of the issue (MxKxN, e4m3 x e4m3 -> bf16) and scale kind
(tensor, block), and each registered kernel backend: the heuristic config and
the backend's tuning candidates (if it has any), each checked against XLA's
scaled form in fp32 (relative Frobenius error of the bf16 result), then timed
(CUPTI median, `jaxgemm.timing.time_paired` against XLA's scaled form in the
same run). XLA's FP8 dot without scales (`jnp.dot(a8, b8,
preferred_element_type=bf16)`) and the bf16 dot of the same values are timed
too, for the issue's columns.

With block scales the pallas backend's candidates include the other variant
(warp_specialized_tma_scales is the default there since 2026-11-26; scales through
the TMA ring, K steps in overlapped pairs); it runs also with B stored (N, K) and
without the pairs (scaled.OVERLAP_PROMOTION = False), labelled "no-overlap". (Per-tensor
K steps in pairs, and 2 or 4 K steps per promotion, were kernel switches at commit
7617a85, measured slower: research/probes/fp8-step-2026-11-26/run1, run2.)

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file> [--quick]
(PROBE_BACKENDS=pallas for the Pallas kernels only, PROBE_DEADLINE_S to run longer)
Here (tiny shapes, interpreter, wall clock): python <this file> --cpu
"""
import os
import sys
import time
import traceback

T0 = time.time()
CPU = "--cpu" in sys.argv
QUICK = "--quick" in sys.argv
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", 420))

import numpy as np
import jax
import jax.numpy as jnp

if not CPU:
  import jax_triton  # noqa: F401 (sets TRITON_CACHE_DIR="" at import)
  import triton
  try:
    triton.knobs.cache.dir = "/tmp/triton-cache"
  except AttributeError:
    os.environ["TRITON_CACHE_DIR"] = "/tmp/triton-cache"

import jaxgemm
from jaxgemm import registry, timing
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem

E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
ITERS = 3 if CPU else 30
PROBLEMS = ([(64, 256, 192), (16, 256, 128)] if CPU else
            [(8192, 8192, 8192), (8192, 4096, 14336), (4096, 4096, 4096), (128, 4096, 14336)])
if QUICK and not CPU:
  PROBLEMS = PROBLEMS[2:]
ONLY = [b for b in os.environ.get("PROBE_BACKENDS", "").split(",") if b]
# PROBE_PROBLEMS="8192x8192x8192,...": those of PROBLEMS only (MxKxN); PROBE_DEFAULT_ONLY=1:
# of each backend's tuning candidates only other variants' (the default config's known).
_ONLY_PROBLEMS = [p for p in os.environ.get("PROBE_PROBLEMS", "").split(",") if p]
if _ONLY_PROBLEMS:
  PROBLEMS = [p for p in PROBLEMS if "x".join(map(str, p)) in _ONLY_PROBLEMS]
DEFAULT_ONLY = bool(os.environ.get("PROBE_DEFAULT_ONLY"))
BLOCKS = {"tensor": (None, None), "block": ((1, 128), (128, 128))}
timer = timing.Timer("cpu" if CPU else "gpu")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}, "
      f"backends {jaxgemm.backends('scaled_matmul')}", flush=True)


def _fits(backend, problem, candidate):
  try:
    backend.check(problem, *candidate)
    return True
  except (ValueError, NotImplementedError) as e:
    print(f"candidate {candidate[1]} refused: {str(e)[:160]}", flush=True)
    return False


def sweep(backend_name, problem, base):
  """Tiles beyond the backend's own candidates (the probe's question: which tile wins)."""
  import dataclasses  # noqa: PLC0415
  variant, config = base
  if backend_name != "triton" or problem.m < 1024:
    return []
  tiles = [dict(block_m=128, block_n=256, num_warps=8, num_stages=3),
           dict(block_m=256, block_n=128, num_warps=8, num_stages=3),
           dict(block_m=128, block_n=128, num_warps=8, num_stages=6),
           dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=6),
           dict(block_m=128, block_n=128, num_warps=4, num_stages=4),
           dict(block_m=128, block_n=128, num_warps=8, num_stages=4, group_m=16)]
  return [(variant, dataclasses.replace(config, **t)) for t in tiles]


def tflops(m, k, n, ms):
  return 2 * m * k * n / (ms * 1e-3) / 1e12


def timed(f, args):
  f(*args).block_until_ready()
  return float(np.median(timer.time(f, args, ITERS)))


def paired(f, ref, args):
  f(*args).block_until_ready()
  ref(*args).block_until_ready()
  mine, theirs = timing.time_paired(timer, f, ref, args, ITERS)
  return float(np.median(mine)), float(np.median(theirs))


for (m, k, n) in PROBLEMS:
  keys = jax.random.split(jax.random.key(m + k + n), 2)
  x = jax.random.normal(keys[0], (m, k), F32)
  w = jax.random.normal(keys[1], (k, n), F32) / np.sqrt(k)
  for kind, (xb, wb) in BLOCKS.items():
    if time.time() - T0 > DEADLINE_S:
      print("deadline reached", flush=True)
      break
    a8, sa = jaxgemm.quantize(x, E4M3, xb)
    b8, sb = jaxgemm.quantize(w, E4M3, wb)
    args = (a8, b8, sa, sb)
    xla_scaled = jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb,
                                                                     backend="xla"))
    head = f"{m}x{k}x{n} {kind}"
    # The exact product of the dequantized operands, up to fp32 rounding (products of
    # fp8 values and scales rounded once, sums over K at fp32: ~sqrt(K) 2**-24).
    sa_full = sa if kind == "tensor" else jnp.repeat(sa, 128, axis=1)[:, :k]
    sb_full = sb if kind == "tensor" else jnp.repeat(jnp.repeat(sb, 128, 0), 128, 1)[:k, :n]
    exact = np.asarray(jnp.dot(a8.astype(F32) * sa_full, b8.astype(F32) * sb_full,
                               precision="highest"))
    rel = lambda out: float(np.linalg.norm(np.asarray(out.astype(F32)) - exact)
                            / np.linalg.norm(exact))
    ref = np.asarray(xla_scaled(*args).astype(F32))
    print(f"{head:28s} xla scaled form err vs exact {rel(xla_scaled(*args)):.2e}", flush=True)
    if kind == "tensor":
      fp8_dot = jax.jit(lambda a, b, sa, sb: jnp.dot(a, b, preferred_element_type=BF16))
      a16, b16 = a8.astype(BF16), b8.astype(BF16)
      bf16_dot = jax.jit(lambda a, b, sa, sb: jnp.dot(a16, b16))
      hi = jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32,
                                                 precision="highest") * (sa * sb)).astype(BF16))
      print(f"{head:28s} xla scaled form at HIGHEST err vs exact {rel(hi(*args)):.2e}")
      if m == PROBLEMS[-1][0] or CPU:
        for name, f in (("fp8 dot", fp8_dot), ("scaled", xla_scaled), ("scaled HIGHEST", hi),
                        ("bf16 of fp8 values", jax.jit(lambda a, b, sa, sb: jnp.dot(
                            a.astype(BF16), b.astype(BF16))))):
          hlo = f.lower(*args).compile().as_text()
          calls = [ln.strip()[:300] for ln in hlo.splitlines() if "custom_call_target" in ln]
          print(f"HLO {name}: {calls or 'no custom call'}", flush=True)
      for name, f in (("xla fp8 dot (no scales)", fp8_dot), ("xla bf16 dot", bf16_dot),
                      ("xla scaled form HIGHEST", hi)):
        ms = timed(f, args)
        print(f"{head:28s} {name:34s} {ms:8.3f} ms {tflops(m, k, n, ms):7.1f} TFLOP/s",
              flush=True)
    problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                  scale_kind=kind)
    for backend_name in jaxgemm.backends("scaled_matmul"):
      if backend_name == "xla" or (ONLY and backend_name not in ONLY):
        continue
      backend = registry.get_backend(backend_name, "scaled_matmul")
      variant = backend.default_variant(problem)
      configs = [(variant, backend.default_config(problem, variant))]
      if not QUICK:
        configs += [c for c in backend.tuning_candidates(problem)
                    if c not in configs and _fits(backend, problem, c)
                    and (not DEFAULT_ONLY or c[0] != variant)]
        configs += [c for c in sweep(backend_name, problem, configs[0]) if c not in configs]
      # B stored (N, K) too: the layout FP8 wgmma reads as it is (no relayout pass).
      runs = [(v, c, False, None) for v, c in configs] + [(*configs[0], True, None)]
      tma = [(v, c) for v, c in configs if v == "warp_specialized_tma_scales"]
      # The TMA-scales variant also in the kernel's own layout, and without its pairs.
      runs += [(v, c, True, None) for v, c in tma] + [(v, c, True, False) for v, c in tma]
      for variant, config, trans_b, overlap in runs:
        if time.time() - T0 > DEADLINE_S:
          break
        if backend_name == "pallas":
          from jaxgemm.kernels.pallas.scaled_matmul import scaled as pallas_scaled
          pallas_scaled.OVERLAP_PROMOTION = overlap is not False   # read at trace time
        label = (f"{backend_name}:{variant}{' trans_b' if trans_b else ''}"
                 f"{' no-overlap' if overlap is False else ''} {config}")
        try:
          def f(a, b, sa, sb, v=variant, c=config, bn=backend_name, t=trans_b):
            if t:
              b, sb = b.T, (sb if kind == "tensor" else sb.T)
            return jaxgemm.scaled_matmul(a, b, sa, sb, backend=bn, variant=v, config=c,
                                         trans_b=t)
          call_args = args if not trans_b else (a8, b8.T.copy(), sa,
                                                 sb if kind == "tensor" else sb.T.copy())
          if trans_b:   # stored transposed before the call: time only the kernel
            f = jax.jit(lambda a, b, sa, sb, v=variant, c=config, bn=backend_name:
                        jaxgemm.scaled_matmul(a, b, sa, sb, backend=bn, variant=v, config=c,
                                              trans_b=True))
          else:
            f = jax.jit(f)
          out = f(*call_args)
          err = rel(out)
          mine, xla_ms = (timed(f, call_args), timed(xla_scaled, args)) if trans_b else \
              paired(f, xla_scaled, args)
          print(f"{head:28s} {label[:120]}\n{'':28s} err {err:.2e}  {mine:8.3f} ms "
                f"{tflops(m, k, n, mine):7.1f} TFLOP/s  xla scaled {xla_ms:8.3f} ms "
                f"{tflops(m, k, n, xla_ms):7.1f}  ratio {xla_ms / mine:5.2f}x", flush=True)
        except Exception as e:  # noqa: BLE001 (a probe: report and go on)
          print(f"{head:28s} {label[:120]}\n{'':28s} FAILED {type(e).__name__}: "
                f"{str(e)[:400]}", flush=True)
          traceback.print_exc(limit=2)
print(f"done in {time.time() - T0:.0f} s", flush=True)
