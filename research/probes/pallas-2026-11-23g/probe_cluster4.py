"""Probe (GPU): rung 4 on 2x2 clusters (A multicast along N, B along M) against 1x2.

A 1x2 cluster of 256x128 CTA tiles moves 32 KB from L2 per CTA and K step (A's 32 KB
tile once for both CTAs, each CTA's own 16 KB of B): about 6.2 TB/s at 820 TFLOP/s. A
2x2 cluster shares B too: 24 KB, a quarter less. Does that close the last 1-2% on the
LLM MLP shapes?

Q: how many clusters of 1, 2 and 4 CTAs fit on the GPU at once (the driver's
   cuOccupancyMaxActiveClusters, on a no-op kernel with our kernels' 384 threads and
   200 KiB of shared memory): a persistent grid must not launch more than that.
S: correctness of 2x2 `clusters` and `stream_k` (split forced) against XLA's f32 dot on
   aligned, ragged, transposed and batched shapes, and stream_k's determinism.
T: `jaxgemm.timing.time_paired` against XLA's dot (40 calls each, two reps): the table's
   1x2 `clusters` and `stream_k`, and 2x2 `clusters` on 32 and on 33 clusters.

Run from the repository root on the GPU machine, after `make gpu-env`:
  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/pallas-2026-11-23g/probe_cluster4.py [Q][S][T]
"""
import contextlib
import ctypes
import dataclasses
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.probe_helpers import BE, guard, kernel, operands, prob, relerr, xla2d_fn, xla_fn
from jaxgemm.kernels.pallas import common, warp_specialized as ws
from jaxgemm.timing import Timer, time_paired

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "QST"
ITERS = 40


def max_active_clusters(cluster_size: int, threads: int = 384, smem: int = 200 * 1024) -> int:
  """cuOccupancyMaxActiveClusters for a no-op kernel of our launch shape."""
  cuda = ctypes.CDLL("libcuda.so.1")

  def ok(rc, what):
    if rc:
      raise RuntimeError(f"{what} failed with CUresult {rc}")

  ok(cuda.cuInit(0), "cuInit")
  dev, ctx = ctypes.c_int(), ctypes.c_void_p()
  ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
  ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
  ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
  ptx = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n"
  mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
  ok(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(ptx)), "cuModuleLoadData")
  ok(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"noop"), "cuModuleGetFunction")
  ok(cuda.cuFuncSetAttribute(fn, 8, smem), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED)")

  class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint),
                ("y", ctypes.c_uint), ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]

  class Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(Attr)), ("num_attrs", ctypes.c_uint)]

  attr = Attr(id=4, x=cluster_size, y=1, z=1)   # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
  cfg = Config((ctypes.c_uint * 3)(cluster_size * 64, 1, 1), (ctypes.c_uint * 3)(threads, 1, 1),
               smem, None, ctypes.pointer(attr), 1)
  n = ctypes.c_int()
  ok(cuda.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(cfg)),
     "cuOccupancyMaxActiveClusters")
  return n.value


@contextlib.contextmanager
def patched(sms=None, force_split=False):
  saved = common.num_sms, ws.MAX_STREAM_K_SHARE, ws.MIN_STREAM_K_STEPS
  if sms is not None:
    common.num_sms = lambda interpret: sms
  if force_split:
    ws.MAX_STREAM_K_SHARE, ws.MIN_STREAM_K_STEPS = 1.0, 4
  try:
    yield
  finally:
    common.num_sms, ws.MAX_STREAM_K_SHARE, ws.MIN_STREAM_K_STEPS = saved


def config(p, variant, cluster):
  cfg = BE.default_config(p, variant)
  return dataclasses.replace(cfg, cluster_m=cluster[0], cluster_n=cluster[1])


def plan(p, cfg, sms):
  tiles = p.batch * common.cdiv(p.m, cfg.tile_m * cfg.cluster_m) * common.cdiv(
      p.n, cfg.tile_n * cfg.cluster_n)
  k = common.round_up(p.k, common.col_multiple(p.dtype))
  workers = min(sms // (cfg.cluster_m * cfg.cluster_n), tiles)
  return ws.plan_stream_k(tiles, workers, common.cdiv(k, cfg.tile_k), cfg.split_rounds)


def compiled(p, variant, cfg, a, b, sms=None, force_split=False):
  """The kernel called directly (a fresh jit, so traced under the patch)."""
  BE.check(p, variant, cfg)
  f = kernel(p, variant, cfg)
  with patched(sms, force_split):
    jax.block_until_ready(f(a, b))
  return f


if "Q" in sections:
  print("== Q: max active clusters (384 threads, 200 KiB SMEM) ==", flush=True)
  for size in (1, 2, 4):
    guard(f"cluster {size}", lambda size=size: print(
        f"cluster of {size}: {max_active_clusters(size)} at once", flush=True))

if "S" in sections:
  print("== S: 2x2 clusters, correctness (32 clusters) ==", flush=True)
  cases = [("clusters", (1, 8192, 8192, 8192), False, False, jnp.bfloat16),
           ("clusters", (1, 4095, 4093, 4097), False, False, jnp.bfloat16),
           ("clusters", (1, 4096, 4096, 4096), True, False, jnp.bfloat16),
           ("clusters", (1, 4096, 4096, 4096), False, True, jnp.bfloat16),
           ("clusters", (3, 1000, 700, 900), True, True, jnp.float16),
           ("clusters", (1, 300, 200, 260), False, False, jnp.bfloat16),
           ("stream_k", (1, 8192, 5376, 8192), False, False, jnp.bfloat16),
           ("stream_k", (2, 3000, 2500, 1024), True, True, jnp.bfloat16),
           ("stream_k", (1, 8191, 5377, 4096), False, False, jnp.float16)]
  bad = 0
  for variant, shape, ta, tb, dt in cases:
    p = prob(*shape, ta, tb, dt)

    def check(p=p, variant=variant):
      global bad
      cfg = config(p, variant, (2, 2))
      a, b = operands(p, 31)
      f = compiled(p, variant, cfg, a, b, sms=128, force_split=True)
      sk = plan(p, cfg, 128) if variant == "stream_k" else None
      errs, same = [], True
      for seed in (31, 32):
        a, b = operands(p, seed)
        c1 = f(a, b)
        errs.append(relerr(c1, xla_fn(p)(a, b)))
        same &= bool(np.array_equal(np.asarray(c1), np.asarray(f(a, b))))
      ok = max(errs) < 1e-2 and same and (variant == "clusters" or sk is not None)
      bad += not ok
      print(f"{'OK ' if ok else 'BAD'} {variant:9s} {p.describe():46s} relerr={max(errs):.2e} "
            f"deterministic={same} {sk}", flush=True)
    guard(p.describe(), check)
  print(f"S: {bad} bad, t={time.time() - T0:.0f}s", flush=True)

if "T" in sections:
  print("== T: paired ratio to XLA's dot (median of 40 each), TFLOP/s ==", flush=True)
  timer = Timer("gpu")
  problems = [("8192x4096x14336", prob(1, 8192, 14336, 4096)),
              ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
              ("8192^3", prob(1, 8192, 8192, 8192)),
              ("4096^3", prob(1, 4096, 4096, 4096))]
  for name, p in problems:
    def run(name=name, p=p):
      a, b = operands(p, 1)
      xla = xla2d_fn(p)
      jax.block_until_ready(xla(a, b))
      fns = {"c1x2": compiled(p, "clusters", config(p, "clusters", (1, 2)), a, b),
             "sk1x2": compiled(p, "stream_k", config(p, "stream_k", (1, 2)), a, b),
             "c2x2@33": compiled(p, "clusters", config(p, "clusters", (2, 2)), a, b, sms=132),
             "c2x2@32": compiled(p, "clusters", config(p, "clusters", (2, 2)), a, b, sms=128)}
      for rep in (1, 2):
        for label, f in fns.items():
          k_ms, x_ms = time_paired(timer, f, xla, (a, b), ITERS)
          k, x = statistics.median(k_ms), statistics.median(x_ms)
          print(f"{name:16s} {label:8s} {p.flops / k / 1e9:7.1f} TFLOP/s  xla "
                f"{p.flops / x / 1e9:7.1f}  {x / k:6.3f}x  {k * 1e3:8.1f} us (rep {rep})",
                flush=True)
    guard(name, run)
    print(f"t={time.time() - T0:.0f}s", flush=True)
print(f"done in {time.time() - T0:.0f}s", flush=True)
