"""GPU probe, second pass over the in-place float16 path (`scaled.dot_f16`, the default up
to 128 rows since run1).

1. 128 rows: the default against the same kernel fed an A converted to float16 by XLA
   first (the kernel then converts only B's tiles: each of the 224 programs otherwise
   converts all of A, twice B's bytes at 64-wide tiles), and narrower N tiles.
2. 16 and 64 rows: the default (in place, f16) against transposing B for fp8 (the
   default before run1).
3. Problems under a megabyte, which ran in place before run1 too: f16 against fp8 with
   Triton's register transposes.
Each row is timed paired with XLA's scaled form (CUPTI) and checked against a reference
run of the kernel (relative max difference).
"""
import dataclasses
import sys

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxgemm  # noqa: E402
from jaxgemm import registry, timing  # noqa: E402
from jaxgemm.kernels.triton.scaled_matmul import scaled  # noqa: E402
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: E402

E4M3, BF16, F16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float16, jnp.float32
timer = timing.Timer("gpu")
backend = registry.get_backend("triton", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)
DOT_F16 = scaled.dot_f16


def operands(m, k, n, kind):
  keys = jax.random.split(jax.random.key(m + k + n), 2)
  x = jax.random.normal(keys[0], (m, k), F32)
  w = jax.random.normal(keys[1], (k, n), F32) / np.sqrt(k)
  a8, sa = jaxgemm.quantize(x, E4M3, block=None if kind == "tensor" else (1, 128))
  b8, sb = jaxgemm.quantize(w, E4M3, block=None if kind == "tensor" else (128, 128))
  return a8, b8, sa, sb


def xla_scaled(kind):
  if kind == "tensor":
    return jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32)
                                         * (sa * sb)).astype(BF16))
  return jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, backend="xla"))


def row(label, m, k, n, f, args, xla, ref):
  try:
    out = np.asarray(f(*args).astype(F32))
    diff = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    mine, theirs = timing.time_paired(timer, f, xla, args, 40)
    mine, theirs = float(np.median(mine)), float(np.median(theirs))
    print(f"{m}x{k}x{n} {label:46s} {mine * 1e3:8.1f} us {2 * m * k * n / mine / 1e9:7.1f} "
          f"TFLOP/s  xla {theirs * 1e3:8.1f} us  ratio {theirs / mine:5.2f}x  diff {diff:.1e}",
          flush=True)
  except Exception as e:  # noqa: BLE001
    print(f"{m}x{k}x{n} {label:46s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


def backend_fn(config):
  return jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(
      a, b, sa, sb, backend="triton", variant="blocked", config=config))


def f16_a_fn(problem, config):
  """The kernel on an A that XLA converted to float16 (exact) first."""
  def run(a, b, sa, sb):
    sa, sb = sa.astype(F32), sb.astype(F32)
    if problem.scale_kind == "block":
      sa, sb = sa[None], sb[None]
    return scaled.scaled_matmul(a.astype(F16)[None], b[None], sa, sb, problem, config,
                                "cuda")[0]
  return jax.jit(run)


for kind in ("tensor", "block"):
  m, k, n = 128, 4096, 14336
  args = operands(m, k, n, kind)
  xla = xla_scaled(kind)
  problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind=kind)
  base = backend.default_config(problem, "blocked")
  ref = np.asarray(backend_fn(base)(*args).astype(F32))
  row(f"{kind} default {base.block_m}x{base.block_n}x{base.block_k} w{base.num_warps} "
      f"s{base.num_stages}", m, k, n, backend_fn(base), args, xla, ref)
  for bn, w, s in ((64, 4, 3), (64, 4, 4), (32, 4, 3), (32, 4, 4), (128, 8, 3), (128, 4, 3)):
    c = dataclasses.replace(base, block_n=bn, num_warps=w, num_stages=s)
    row(f"{kind} f16 A first 128x{bn}x128 w{w} s{s}", m, k, n, f16_a_fn(problem, c), args,
        xla, ref)
    if bn == 32:
      row(f"{kind} in place 128x{bn}x128 w{w} s{s}", m, k, n, backend_fn(c), args, xla, ref)

for m in (16, 64):
  k, n = 4096, 14336
  args = operands(m, k, n, "tensor")
  xla = xla_scaled("tensor")
  problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind="tensor")
  base = backend.default_config(problem, "blocked")
  ref = np.asarray(backend_fn(base)(*args).astype(F32))
  row(f"default (in place f16) {base.block_m}x{base.block_n}", m, k, n, backend_fn(base),
      args, xla, ref)
  old = dataclasses.replace(base, block_n=128, num_warps=4, num_stages=4, align_operands=True)
  row("transposed B, fp8 (before run1) 64x128 w4 s4", m, k, n, backend_fn(old), args, xla,
      ref)

for m, k, n in ((512, 512, 512), (256, 1024, 512), (1024, 256, 1024)):
  args = operands(m, k, n, "tensor")
  xla = xla_scaled("tensor")
  problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                scale_kind="tensor")
  base = backend.default_config(problem, "blocked")
  ref = np.asarray(backend_fn(base)(*args).astype(F32))
  row(f"default in place f16 {base.block_m}x{base.block_n}x{base.block_k}", m, k, n,
      backend_fn(base), args, xla, ref)
  scaled.dot_f16 = lambda p: False
  row("in place fp8 (register transposes)", m, k, n,
      backend_fn(dataclasses.replace(base, group_m=9)), args, xla, ref)
  scaled.dot_f16 = DOT_F16
