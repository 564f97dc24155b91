"""GPU probe: the cast-transpose kernel's block modes by variant.

Question (docs/performance-notes.md, "FP8 GEMMs", "Sixth session"): the block step spends
2.52 ms in the quantizer, and its "x" mode (1x128 blocks of x and of x^T: ROW_MODE and
COL_MODE "row") ran at 1.4 TB/s where the other block modes ran at 2.6-2.8
(research/probes/fp8-fused-quant/run8b). Which part is slow, and does either of two
changes fix it: 8 warps instead of 4 (`NUM_WARPS`), or q^T made from the transposed input
tile with its amaxes along its own rows (`TRANSPOSE_FIRST`) instead of the quantized tile
transposed after an amax down x's columns?

Answer (run4, at 6318c74, which had the switch): the warps matter by mode, the switch does
not (x equal, the other modes 2-80% slower with it); it was removed, and the kernel now
takes its warps by mode (`cast_transpose.num_warps`). This file as it stands times the
warps only.

Each (shape, modes, variant): CUPTI time of the jitted call (median of 5), bandwidth
against the bytes it must move (bf16 in, q and q^T out), and whether its four outputs equal
the 4-warp run's bit for bit.

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
(--cpu: the interpreter on one small shape, equality only).
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
from jaxgemm.kernels.triton.quantize import cast_transpose as ct  # noqa: E402

CPU = "--cpu" in sys.argv
PLATFORM = "cpu" if CPU else "cuda"
SHAPES = [(200, 300)] if CPU else [(8192, 4096), (8192, 14336), (14336, 4096)]
# (label, row_block, col_block): the block recipe's operands and a q-only control.
MODES = [("x (row, row)", "row", "row"), ("dy (row, tile)", "row", "tile"),
         ("w (tile, tile)", "tile", "tile"), ("q only (row, -)", "row", None)]
VARIANTS = [4, 8]   # warps


def cupti_ms(f, *args, reps=5):
  if CPU:
    return float("nan")
  from jax.experimental.mosaic.gpu import profiler  # noqa: PLC0415
  times = []
  for _ in range(reps):
    out, t = profiler.measure(f)(*args)
    jax.block_until_ready(out)
    times.append(t)
  return float(np.median(times))


def bits(a):
  a = np.asarray(a)
  return a.view(np.uint8) if a.dtype.itemsize == 1 else a


print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
for rows, cols in SHAPES:
  x = jax.random.normal(jax.random.key(rows + cols), (rows, cols), jnp.float32)
  x = (x * jnp.exp2(jax.random.uniform(jax.random.key(1), (rows, 1), minval=-8, maxval=8))
       ).astype(jnp.bfloat16)
  for label, row_block, col_block in MODES:
    first = None   # the first variant's outputs: 4 warps
    for warps in VARIANTS:
      ct.num_warps = lambda r, c, w=warps: w   # read at trace time
      f = jax.jit(lambda x, r=row_block, c=col_block: ct.cast_transpose(
          x, dtype=jnp.float8_e4m3fn, row_block=r, col_block=c, platform=PLATFORM))
      outs = [o for o in jax.block_until_ready(f(x)) if o is not None]
      first = first or outs
      same = all(np.array_equal(bits(a), bits(b)) for a, b in zip(outs, first))
      ms = cupti_ms(f, x)
      moved = rows * cols * (2 + 1 + (1 if col_block else 0))
      print(f"{rows}x{cols} {label:16s} warps {warps} "
            f"{ms:7.3f} ms ({moved / ms / 1e6:6.0f} GB/s)  same-as-default {same}", flush=True)
