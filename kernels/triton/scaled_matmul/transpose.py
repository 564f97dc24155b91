"""The FP8 relayout's transpose: X (batch, R, C) of one-byte elements to X^T (batch, C, R).

FP8 wgmma reads both operands K-major, so a B stored (K, N) is transposed before
the K-major kernels (`jaxgemm.ops.scaled_matmul.pallas.k_major_operands`,
`scaled.relayout`). XLA's transpose of an fp8 array ran 2.86-3.31 TB/s on an H200,
where this kernel (one 128x128 tile a program, moved through shared memory by
`tl.trans`, 8 warps) ran 3.73-5.04 TB/s: 35.9 against 46.9 us at 8192x8192, 6.7
against 10.1 at 4096x4096, 31.5 against 41.0 at 4096x14336, outputs bit-equal
(the fp8-inplace-f16 probe's run1 at 01180b5, H200, transpose.py; 128x128 on 8 warps was the best
or within 1% of it of 16 tilings at each size). The kernel moves bytes: any
one-byte dtype goes through it as uint8.
"""

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jaxgemm import triton_call

TILE = 128
NUM_WARPS = 8


@triton.jit
def transpose_kernel(x_ptr, y_ptr, R: tl.constexpr, C: tl.constexpr,
                     TILE_R: tl.constexpr, TILE_C: tl.constexpr, EVEN: tl.constexpr,
                     INDEX_64: tl.constexpr):
  """Y[b] = X[b]^T, one (batch, TILE_R x TILE_C tile of X) per program; grid (batch *
  tiles,). EVEN: R and C are multiples of the tiles (no masks)."""
  tiles_c: tl.constexpr = (C + TILE_C - 1) // TILE_C
  tiles: tl.constexpr = (R + TILE_R - 1) // TILE_R * tiles_c
  pid = tl.program_id(0)
  batch = pid // tiles
  if INDEX_64:
    batch = batch.to(tl.int64)
  pid_r = pid % tiles // tiles_c
  pid_c = pid % tiles_c
  offs_r = pid_r * TILE_R + tl.arange(0, TILE_R)
  offs_c = pid_c * TILE_C + tl.arange(0, TILE_C)
  x_ptrs = x_ptr + batch * (R * C) + offs_r[:, None] * C + offs_c[None, :]
  y_ptrs = y_ptr + batch * (R * C) + offs_c[:, None] * R + offs_r[None, :]
  if EVEN:
    tl.store(y_ptrs, tl.trans(tl.load(x_ptrs)))
  else:
    x = tl.load(x_ptrs, mask=(offs_r[:, None] < R) & (offs_c[None, :] < C))
    tl.store(y_ptrs, tl.trans(x), mask=(offs_c[:, None] < C) & (offs_r[None, :] < R))


def transpose(x: jax.Array, platform: str) -> jax.Array:
  """x (batch, R, C) of a one-byte dtype as (batch, C, R), `jnp.swapaxes(x, 1, 2)`.

  >>> x = jnp.arange(6, dtype=jnp.uint8).reshape(1, 2, 3)
  >>> transpose(x, "cpu")[0].tolist()
  [[0, 3], [1, 4], [2, 5]]
  """
  if x.ndim != 3 or np.dtype(x.dtype).itemsize != 1:
    raise ValueError(f"transpose takes (batch, R, C) arrays of a one-byte dtype; got "
                     f"x.shape={x.shape}, x.dtype={np.dtype(x.dtype).name}")
  batch, r, c = x.shape
  if 0 in x.shape:
    return jnp.swapaxes(x, 1, 2)
  tile_r, tile_c = min(TILE, triton.next_power_of_2(r)), min(TILE, triton.next_power_of_2(c))
  grid = batch * triton.cdiv(r, tile_r) * triton.cdiv(c, tile_c)
  launch = triton_call.Launch.make(
      transpose_kernel, (grid,), jax.ShapeDtypeStruct((batch, c, r), jnp.uint8),
      num_warps=NUM_WARPS, num_stages=1, R=r, C=c, TILE_R=tile_r, TILE_C=tile_c,
      EVEN=r % tile_r == 0 and c % tile_c == 0, INDEX_64=batch * r * c >= 2**31)
  y = triton_call.call(launch, jax.lax.bitcast_convert_type(x, jnp.uint8), platform=platform)
  return jax.lax.bitcast_convert_type(y, x.dtype)
