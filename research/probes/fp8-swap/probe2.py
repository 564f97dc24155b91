"""GPU probe: `config.swap_ab` as the backend runs it (C^T = B^T A^T, the weight through
registers), against the unswapped in-place f16 kernel and the transposing default.

Each row paired with XLA's scaled form (CUPTI), its output checked against the float64
product of the dequantized operands (max |error| / max |C|; bf16 C rounds at ~2e-3).
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
from jaxgemm.ops.matmul.triton import TritonConfig  # noqa: E402
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: E402

E4M3, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
timer = timing.Timer("gpu")
backend = registry.get_backend("triton", "scaled_matmul")
print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, timer {timer.label}", flush=True)


def case(m, k, n, kind="tensor", trans_a=False, trans_b=False):
  keys = jax.random.split(jax.random.key(m + n + k), 2)
  x = jax.random.normal(keys[0], (m, k), F32)
  w = jax.random.normal(keys[1], (k, n), F32) / np.sqrt(k)
  block_a, block_b = {"tensor": (None, None), "row_col": ((1, None), (None, 1))}[kind]
  a8, sa = jaxgemm.quantize(x, E4M3, block=block_a)
  b8, sb = jaxgemm.quantize(w, E4M3, block=block_b)
  exact = (np.asarray(a8.astype(F32), np.float64) * np.asarray(sa, np.float64)) @ (
      np.asarray(b8.astype(F32), np.float64) * np.asarray(sb, np.float64))
  a_in = a8.T if trans_a else a8
  b_in = b8.T if trans_b else b8
  xla = jax.jit(lambda a, b, sa, sb: (jnp.dot(a.T if trans_a else a, b.T if trans_b else b,
                                              preferred_element_type=F32)
                                      * (sa * sb)).astype(BF16))
  problem = ScaledMatmulProblem(1, m, n, k, np.dtype(E4M3), np.dtype(BF16), np.dtype(F32),
                                trans_a, trans_b, None, scale_kind=kind)
  return (a_in, b_in, sa, sb), exact, xla, problem


def row(name, f, args, exact, xla, flops):
  try:
    out = np.asarray(f(*args).astype(F32))
    err = float(np.max(np.abs(out - exact)) / np.max(np.abs(exact)))
    mine, theirs = timing.time_paired(timer, f, xla, args, 40)
    mine, theirs = float(np.median(mine)), float(np.median(theirs))
    print(f"{name:58s} {mine * 1e3:7.1f} us {flops / mine / 1e9:6.1f} TFLOP/s  xla "
          f"{theirs * 1e3:6.1f} us  ratio {theirs / mine:5.2f}x  err {err:.1e}", flush=True)
  except Exception as e:  # noqa: BLE001
    print(f"{name:58s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


def ours(config, trans_a=False, trans_b=False):
  return jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(
      a, b, sa, sb, trans_a=trans_a, trans_b=trans_b, backend="triton", config=config))


F16_TILE = TritonConfig(block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3,
                        align_operands=False)
def main():
  for m, k, n, kind in ((128, 4096, 14336, "tensor"), (128, 4096, 14336, "row_col"),
                        (64, 4096, 14336, "tensor"), (16, 4096, 14336, "tensor"),
                        (16, 8192, 8192, "tensor"), (256, 4096, 14336, "tensor"),
                        (32, 1024, 768, "tensor"), (128, 14336, 4096, "tensor")):
    args, exact, xla, problem = case(m, k, n, kind)
    flops = 2 * m * k * n
    label = f"{m}x{k}x{n} {kind}"
    default = backend.default_config(problem, "blocked")
    row(f"{label} default {default.block_m}x{default.block_n} swap={default.swap_ab} "
        f"align={default.align_operands}", ours(default), args, exact, xla, flops)
    f16 = dataclasses.replace(F16_TILE, block_m=min(128, max(16, 1 << (m - 1).bit_length())))
    row(f"{label} unswapped f16 in place {f16.block_m}x64 w4 s3", ours(f16), args, exact, xla,
        flops)
    if m == 128 and kind == "tensor":
      for bn, warps, stages in ((128, 8, 3), (128, 8, 5), (64, 4, 4), (256, 8, 3)):
        c = dataclasses.replace(default, block_n=bn, num_warps=warps, num_stages=stages)
        row(f"{label} swap 128x{bn} w{warps} s{stages}", ours(c), args, exact, xla, flops)
    if m == 256:
      for bm in (128, 64):
        c = TritonConfig(block_m=bm, block_n=128, block_k=128, num_warps=8, num_stages=4,
                         align_operands=False, swap_ab=True)
        row(f"{label} swap {bm}x128 w8 s4", ours(c), args, exact, xla, flops)

  # TT read in place: the new rule (fp8, A through registers) against the old (f16 math).
  for m, k, n in ((128, 4096, 14336), (256, 1024, 512)):
    args, exact, xla, problem = case(m, k, n, "tensor", trans_a=True, trans_b=True)
    c = TritonConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4,
                     align_operands=False)
    row(f"{m}x{k}x{n} TT in place, A through registers", ours(c, True, True), args, exact, xla,
        2 * m * k * n)
    keep = scaled.a_through_registers, scaled.dot_f16
    scaled.a_through_registers = lambda p: False
    scaled.dot_f16 = lambda p: p.trans_a or not p.trans_b
    row(f"{m}x{k}x{n} TT in place, f16 math (the old rule)", ours(c, True, True), args, exact,
        xla, 2 * m * k * n)
    scaled.a_through_registers, scaled.dot_f16 = keep


if __name__ == "__main__":
  main()
