"""GPU probe: the 128-row per-tensor FP8 GEMM as C^T = B^T A^T (swap_kernel.py).

128x4096x14336, e4m3, B stored (K, N), per-tensor scales, bf16 C, each variant paired
with XLA's scaled form (CUPTI) and checked against the backend's default (in-place f16).
REG_A: 0 Triton's own handling of the MN-major fp8 operand; 1 an f16 round trip,
2 an identity inline asm, both of which make Triton feed wgmma's A from registers
(sm_90 PTX, ptx.py).
"""
import pathlib
import sys

import numpy as np
import jax
import jax.numpy as jnp
import triton

sys.path.insert(0, ".")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import jaxgemm  # noqa: E402
from jaxgemm import timing, triton_call  # noqa: E402
from swap_kernel import swapped_kernel  # noqa: E402

E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
timer = timing.Timer("gpu")
print(f"jax {jax.__version__}, triton {triton.__version__}, {jax.devices()[0].device_kind}, "
      f"timer {timer.label}", flush=True)
M, K, N = 128, 4096, 14336
keys = jax.random.split(jax.random.key(0), 2)
x = jax.random.normal(keys[0], (M, K), F32)
w = jax.random.normal(keys[1], (K, N), F32) / np.sqrt(K)
a8, sa = jaxgemm.quantize(x, E4M3)
b8, sb = jaxgemm.quantize(w, E4M3)
args = (a8, b8, sa, sb)
xla = jax.jit(lambda a, b, sa, sb: (jnp.dot(a, b, preferred_element_type=F32)
                                    * (sa * sb)).astype(BF16))
exact = np.asarray(a8.astype(np.float64)) @ np.asarray(b8.astype(np.float64)) * float(sa * sb)
ref = None


def row(name, f):
  global ref
  try:
    out = np.asarray(f(*args).astype(F32))
    ref = out if ref is None else ref
    diff = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    err = float(np.max(np.abs(out - exact)) / np.max(np.abs(exact)))
    mine, theirs = timing.time_paired(timer, f, xla, args, 40)
    mine, theirs = float(np.median(mine)), float(np.median(theirs))
    print(f"{name:44s} {mine * 1e3:7.1f} us {2 * M * K * N / mine / 1e9:7.1f} TFLOP/s  xla "
          f"{theirs * 1e3:7.1f} us  ratio {theirs / mine:5.2f}x  vs default {diff:.1e}  "
          f"vs exact {err:.1e}", flush=True)
    return mine
  except Exception as e:  # noqa: BLE001
    print(f"{name:44s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    return float("inf")


row("default (in place, f16)", jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(
    a, b, sa, sb, backend="triton")))
row("xla scaled form", xla)


def swapped(bn, bk, warps, stages, reg_a, promote=True):
  launch = triton_call.Launch.make(
      swapped_kernel, (triton.cdiv(N, bn) * triton.cdiv(M, 128),),
      jax.ShapeDtypeStruct((M, N), BF16), num_warps=warps, num_stages=stages,
      M=M, N=N, K=K, BLOCK_N=bn, BLOCK_M=128, BLOCK_K=bk, PROMOTE=promote,
      TRANS_LOAD=False, REG_A=reg_a)
  return jax.jit(lambda a, b, sa, sb: triton_call.call(
      launch, a, b, (sa * sb).astype(F32), platform="cuda"))


results = []
for reg_a in (1, 2, 0):
  for bn, warps in ((64, 4), (128, 8), (128, 4)):
    for stages in (3, 4, 6):
      for bk in (128, 64):
        if reg_a == 0 and (stages != 3 or bk != 128):
          continue
        name = f"swap reg_a={reg_a} {bn}x128x{bk} w{warps} s{stages}"
        results.append((row(name, swapped(bn, bk, warps, stages, reg_a)), name))
print("best:", sorted(results)[:5], flush=True)
for t, name in sorted(results)[:2]:
  parts = name.split()
  bn, _, bk = parts[2].split("x")
  row(name + " no promotion", swapped(int(bn), int(bk), int(parts[3][1:]), int(parts[4][1:]),
                                      int(parts[1][-1]), promote=False))
