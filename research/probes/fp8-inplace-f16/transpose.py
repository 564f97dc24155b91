"""GPU probe: XLA's transpose of an fp8 (K, N) weight against a Triton tile transpose.

Question (docs/results-fp8.md): the NN rows pay XLA's transpose of the fp8 weight
before the K-major kernel: ~50 us of 882 at 8192^3 (block, run7 vs run6) and ~15 us of
138 at 4096^3, 2.2-2.65 TB/s where an H100 copies at ~3 TB/s. Is a Triton transpose
(one tile through registers and shared memory, `tl.trans`) faster? Times are CUPTI,
paired with XLA's `jnp.swapaxes` in the same run; outputs checked bit-equal.
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp
import triton
import triton.language as tl

sys.path.insert(0, ".")
from jaxgemm import timing, triton_call  # noqa: E402


@triton.jit
def transpose_kernel(x_ptr, y_ptr, R: tl.constexpr, C: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GROUP: tl.constexpr):
  pid = tl.program_id(0)
  tiles_c = C // BLOCK_C
  pid_r = pid // tiles_c
  pid_c = pid % tiles_c
  offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
  offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
  x = tl.load(x_ptr + offs_r[:, None] * C + offs_c[None, :])
  tl.store(y_ptr + offs_c[:, None] * R + offs_r[None, :], tl.trans(x))


def triton_transpose(x, block_r, block_c, warps):
  r, c = x.shape
  launch = triton_call.Launch.make(
      transpose_kernel, (r // block_r * (c // block_c),), jax.ShapeDtypeStruct((c, r), x.dtype),
      num_warps=warps, num_stages=1, R=r, C=c, BLOCK_R=block_r, BLOCK_C=block_c, GROUP=1)
  return triton_call.call(launch, x, platform="gpu")


timer = timing.Timer("gpu")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
for r, c in ((8192, 8192), (4096, 4096), (4096, 14336)):
  x = jax.random.randint(jax.random.key(r + c), (r, c), 0, 255, jnp.int32).astype(jnp.uint8)
  x8 = jax.lax.bitcast_convert_type(x, jnp.float8_e4m3fn)
  xla = jax.jit(lambda v: jnp.swapaxes(v, 0, 1))
  want = np.asarray(xla(x))
  gbytes = 2 * r * c / 1e9
  t8 = float(np.median(timer.time(jax.jit(lambda v: jnp.swapaxes(v, 0, 1)), (x8,), 40)))
  print(f"{r}x{c}: xla fp8 transpose {t8 * 1e3:6.1f} us ({gbytes / t8 * 1e3:6.0f} GB/s)",
        flush=True)
  for br, bc in ((64, 64), (128, 64), (64, 128), (128, 128), (32, 128), (128, 32), (256, 64),
                 (64, 256)):
    for warps in (4, 8):
      try:
        f = jax.jit(lambda v, br=br, bc=bc, w=warps: triton_transpose(v, br, bc, w))
        same = bool((np.asarray(f(x)) == want).all())
        mine, theirs = timing.time_paired(timer, f, xla, (x,), 40)
        mine, theirs = float(np.median(mine)), float(np.median(theirs))
        print(f"  triton {br:3d}x{bc:3d} w{warps}: {mine * 1e3:6.1f} us "
              f"({gbytes / mine * 1e3:6.0f} GB/s)  xla {theirs * 1e3:6.1f} us "
              f"({gbytes / theirs * 1e3:6.0f} GB/s)  ratio {theirs / mine:4.2f}x  same {same}",
              flush=True)
      except Exception as e:  # noqa: BLE001
        print(f"  triton {br}x{bc} w{warps}: FAILED {type(e).__name__}: {str(e)[:200]}",
              flush=True)
