"""Probe: hardware counters of XLA's dot (cuBLAS) and our persistent rungs, same problems.

Run on the H200 from the repository root, under Nsight Compute (see ncu.sh beside
this file). Inputs are made on the host and everything is compiled and warmed up
before the profiled range opens (cuProfilerStart), so only the GEMM kernels
are profiled: the previous attempt profiled XLA's input fusions too and hung
(../pallas-2026-11-23d/README.md).
"""
import ctypes
import time

import jax
import ml_dtypes
import numpy as np

from research.probe_helpers import BE, kernel, prob, relerr, xla2d_fn, xla_fn

T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)
CASES = [("8192^3", prob(1, 8192, 8192, 8192), "clusters"),
         ("8192x4096x14336", prob(1, 8192, 14336, 4096), "stream_k")]


def host_operands(p, seed):
  rng = np.random.default_rng(seed)
  return tuple(jax.device_put(rng.standard_normal(s, np.float32).astype(ml_dtypes.bfloat16))
               for s in (p.a_shape, p.b_shape))


def cuda_profiler(start: bool):
  """cuProfilerStart/Stop on the device's primary context (the one XLA uses)."""
  cu = ctypes.CDLL("libcuda.so.1")
  dev, ctx = ctypes.c_int(), ctypes.c_void_p()
  assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
  assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
  assert cu.cuCtxSetCurrent(ctx) == 0
  rc = (cu.cuProfilerStart if start else cu.cuProfilerStop)()
  print("cuProfilerStart" if start else "cuProfilerStop", "rc", rc, flush=True)


runs = []
for name, p, variant in CASES:
  a, b = host_operands(p, 1)
  x, k = xla2d_fn(p), kernel(p, variant, BE.default_config(p, variant))
  err = relerr(k(a, b), xla_fn(p)(a, b))     # compiles both; checks ours
  jax.block_until_ready(x(a, b))
  print(f"{name} {variant} err {err:.1e}", flush=True)
  runs.append((name, x, k, a, b))

cuda_profiler(True)
for name, x, k, a, b in runs:
  jax.block_until_ready(x(a, b))
  jax.block_until_ready(k(a, b))
cuda_profiler(False)
print(f"done in {time.time() - T0:.0f}s", flush=True)
