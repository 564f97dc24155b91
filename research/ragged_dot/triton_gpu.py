"""GPU probe of the Triton grouped kernels (issue 26): correctness and CUPTI timing.

Calls the backend's impl directly under jax.jit (no primitive needed):
correctness of ragged-M (plain, trans_rhs) and ragged-K against fp32
references built from lax.ragged_dot / masked einsums at HIGHEST; then the
forward of G=8,M=16384,K=4096,N=14336 and G=64,M=16384,K=2048,N=1408 (bf16,
Dirichlet(2) group sizes summing to M) over a few tile configs against
lax.ragged_dot and a dense dot of the same FLOPs, and the wgrad (ragged-K) and
dgrad (trans_rhs) forms of the first problem. Times are CUPTI kernel time per
call (the schedule table's few XLA ops included), median of `iters`.

On the GPU machine: PYTHONPATH=/tmp/site:$PWD python3 research/ragged_dot/triton_gpu.py
Here (tiny shapes, interpreter, wall clock): python research/ragged_dot/triton_gpu.py --cpu
"""
import os, sys, time, traceback

T0 = time.time()
CPU = "--cpu" in sys.argv
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", 270))

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

if not CPU:
  import jax_triton  # noqa: F401 (sets TRITON_CACHE_DIR="" at import)
  import triton
  try:
    triton.knobs.cache.dir = "/tmp/triton-cache"
  except AttributeError:
    os.environ["TRITON_CACHE_DIR"] = "/tmp/triton-cache"

from jaxgemm import timing
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem
from jaxgemm.ops.ragged_dot.triton import RaggedDotTritonConfig as C, TritonRaggedDot

BE = TritonRaggedDot()


def impl_on_sizes(problem, variant, config, platform):
  """The backend's impl, called with (B, G) group sizes (the primitive passes bounds)."""
  from jaxgemm.ops.ragged_dot import schedule as _schedule  # noqa: PLC0415
  f = BE.impl(problem, variant, config, platform)
  return lambda l, r, s: f(l, r, _schedule.group_bounds(s, problem.m))
PLATFORM = "cpu" if CPU else "cuda"
TIMER = timing.Timer("cpu" if CPU else "gpu")
BF16 = jnp.bfloat16
print("jax", jax.__version__, jax.devices()[0].device_kind, "timer", TIMER.label, flush=True)


def left():
  return DEADLINE_S - (time.time() - T0)


def dirichlet_sizes(key, g, m, alpha=2.0):
  p = np.random.default_rng(key).dirichlet([alpha] * g)
  s = np.floor(p * m).astype(np.int32)
  s[-1] += m - s.sum()
  return s


def problem(g, m, k, n, dtype, *, trans=False, rk=False, out=None, precision=None):
  dt = np.dtype(dtype)
  return RaggedDotProblem(1, g, m, k, n, dt, np.dtype(out or dt), np.dtype(np.float32),
                          trans_rhs=trans, ragged_contracting=rk, precision=precision)


def operands(p, seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  lhs = jax.random.normal(k1, p.lhs_shape, jnp.float32).astype(p.dtype)
  rhs = jax.random.normal(k2, p.rhs_shape, jnp.float32).astype(p.dtype)
  return lhs, rhs


def reference(p, lhs, rhs, sizes):
  """fp32 HIGHEST reference on the device."""
  a, w = lhs[0].astype(jnp.float32), rhs[0].astype(jnp.float32)
  gs = jnp.asarray(sizes, jnp.int32)
  if p.ragged_contracting:
    ends = jnp.minimum(jnp.cumsum(gs), p.m)
    rows = jnp.arange(p.m)[:, None]
    mask = ((rows >= ends - gs) & (rows < ends)).astype(jnp.float32)   # (M, G)
    return jnp.einsum("mg,mk,mn->gkn", mask, a, w, precision="highest")[None]
  if p.trans_rhs:
    w = jnp.swapaxes(w, -1, -2)
  return lax.ragged_dot(a, w, gs, precision=lax.Precision.HIGHEST)[None]


def ours(p, cfg):
  BE.check(p, "grouped", cfg)
  return jax.jit(impl_on_sizes(p, "grouped", cfg, PLATFORM))


def check(name, p, cfg, sizes, tol):
  try:
    lhs, rhs = operands(p, seed=len(name))
    gs = jnp.asarray(np.asarray(sizes, np.int32)[None])
    out = np.asarray(ours(p, cfg)(lhs, rhs, gs).astype(jnp.float32), np.float64)
    ref = np.asarray(reference(p, lhs, rhs, sizes), np.float64)
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
    print(f"check {name:40s} {p.describe():60s} rel_err={err:.2e} "
          f"{'OK' if err <= tol else 'FAIL'}", flush=True)
  except Exception:
    print(f"check {name} ERROR\n{traceback.format_exc()}", flush=True)


def timed(f, args, iters):
  f(*args).block_until_ready()
  t = TIMER.time(f, args, iters)
  return float(np.median(t))


def bench(name, p, configs, sizes, *, iters=10, xla=True, dense=True):
  lhs, rhs = operands(p)
  gs = jnp.asarray(np.asarray(sizes, np.int32)[None])
  flops = p.flops
  line = lambda what, ms: print(f"time {name:10s} {what:44s} {ms*1e3:10.1f} us "
                                f"{flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
  ref = None
  if xla and left() > 30:
    try:
      if p.ragged_contracting:
        dn = lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(((0,), (0,)), ((), ())),
            lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
        fx = jax.jit(lambda a, b, s: lax.ragged_dot_general(a[0], b[0], s[0], dn))
      else:
        fx = jax.jit(lambda a, b, s: lax.ragged_dot(
            a[0], jnp.swapaxes(b[0], -1, -2) if p.trans_rhs else b[0], s[0]))
      ref = fx(lhs, rhs, gs)
      line("xla lax.ragged_dot", timed(fx, (lhs, rhs, gs), 3))
    except Exception:
      print(f"xla {name} ERROR\n{traceback.format_exc()[-1500:]}", flush=True)
  if dense and not p.ragged_contracting and left() > 30:
    a2 = lhs[0]
    b2 = rhs[0, 0] if not p.trans_rhs else rhs[0, 0].T
    fd = jax.jit(lambda a, b: a @ b)
    line("dense dot, same FLOPs", timed(fd, (a2, b2), iters))
  for label, cfg in configs:
    if left() < 25:
      print(f"time {name} {label}: skipped, {left():.0f} s left", flush=True)
      continue
    try:
      t0 = time.time()
      f = ours(p, cfg)
      out = f(lhs, rhs, gs)
      out.block_until_ready()
      ct = time.time() - t0
      err = ""
      if ref is not None:
        o = np.asarray(out.astype(jnp.float32)).reshape(-1)
        r = np.asarray(ref.astype(jnp.float32)).reshape(-1)
        err = f"vs xla rel={np.linalg.norm(o - r) / np.linalg.norm(r):.1e}"
      ms = timed(f, (lhs, rhs, gs), iters)
      line(f"triton {label}", ms)
      print(f"     compile+first {ct:.1f}s {err}", flush=True)
    except Exception:
      print(f"time {name} {label} ERROR\n{traceback.format_exc()[-2500:]}", flush=True)


def cfg(bm, bn, bk, w, s, gm=8):
  return (f"{bm}x{bn}x{bk} w{w} s{s} g{gm}",
          C(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, group_m=gm))


# ---- correctness (on the CPU, `--cpu`: the same calls, small)
CM, CK, CN, CK2, CN2 = (1000, 512, 768, 1001, 771) if not CPU else (200, 64, 96, 67, 33)
big = cfg(128, 256, 64, 8, 3)[1]
mid = cfg(64, 128, 64, 4, 4)[1]
pers = C(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, persistent=True)
sizes8 = [130, 0, 1, 300, 77, 0, 250, 100]       # sum 858 < 1000: tail rows zero
if CPU:
  sizes8 = [30, 0, 1, 60, 7, 0, 50, 20]
check("ragged-M bf16 128x256", problem(8, CM, CK, CN, BF16), big, sizes8, 1e-2)
check("ragged-M bf16 persistent trans sum>M", problem(8, CM, CK, CN, BF16, trans=True),
      pers, [600, 0, 500, 1, 2, 3, 4, 5] if not CPU else [100, 0, 120, 1, 2, 3, 4, 5], 1e-2)
check("ragged-M fp32 tf32 unaligned K,N", problem(8, CM, CK2, CN2, np.float32), mid,
      sizes8, 3e-3)
hi = problem(8, CM, CK, CN, np.float32, precision=(lax.Precision.HIGHEST,) * 2)
check("ragged-M fp32 highest", hi, BE.default_config(hi, "grouped"), sizes8, 1e-5)
check("ragged-K bf16 128x256", problem(8, CM, CK, CN, BF16, rk=True), big, sizes8, 1e-2)
check("ragged-K fp16 persistent unaligned", problem(8, CM, CK2, CN2, np.float16, rk=True),
      pers, sizes8, 2e-3)

# ---- timing
P1 = (8, 16384, 4096, 14336) if not CPU else (8, 512, 64, 96)
P2 = (64, 16384, 2048, 1408) if not CPU else (16, 512, 64, 96)
s1 = dirichlet_sizes(1, P1[0], P1[1])
s2 = dirichlet_sizes(2, P2[0], P2[1])
print("sizes P1", s1.tolist(), flush=True)
print("sizes P2 min/max/empty", s2.min(), s2.max(), int((s2 == 0).sum()), flush=True)
try:
  from jaxgemm.ops.ragged_dot import schedule
  gs2 = jnp.asarray(s2[None])
  ft = jax.jit(lambda s: schedule.row_tiles(schedule.group_bounds(s, P2[1]), P2[1], 128))
  print(f"schedule table alone (G=64, block_m=128): {timed(ft, (gs2,), 10) * 1e3:.1f} us",
        flush=True)
except Exception:
  print(traceback.format_exc()[-1000:], flush=True)


def pcfg(bm, bn, bk, w, s, gm=8):
  return (f"persistent {bm}x{bn}x{bk} w{w} s{s} g{gm}",
          C(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, group_m=gm,
            persistent=True))


bench("fwd-G8", problem(*P1, BF16), [cfg(128, 256, 64, 8, 3), pcfg(128, 256, 64, 8, 3),
                                     cfg(128, 256, 64, 8, 4), cfg(128, 128, 64, 8, 4),
                                     pcfg(128, 128, 64, 8, 4)], s1)
bench("fwd-G64", problem(*P2, BF16), [cfg(128, 256, 64, 8, 3), cfg(128, 128, 64, 8, 4),
                                      cfg(64, 256, 64, 4, 3), cfg(64, 128, 64, 4, 4),
                                      pcfg(128, 128, 64, 8, 4), pcfg(64, 256, 64, 4, 3)], s2)
bench("wgrad-G8", problem(*P1, BF16, rk=True), [cfg(128, 256, 64, 8, 3),
                                               pcfg(128, 256, 64, 8, 3),
                                               cfg(128, 128, 64, 8, 4)], s1, iters=5, xla=False)
g, m, k, n = P1
bench("dgrad-G8", problem(g, m, n, k, BF16, trans=True), [cfg(128, 256, 64, 8, 3),
                                                          pcfg(128, 256, 64, 8, 3)], s1,
      iters=5, dense=False, xla=False)
print(f"done in {time.time() - T0:.0f} s", flush=True)
