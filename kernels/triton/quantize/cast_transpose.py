"""Cast-transpose: X (R, C) to fp8 q (R, C) and q^T (C, R) with their scales, X read once.

The FP8 training path (jaxgemm/ops/scaled_matmul/training.py) needs an operand
both ways: q, K-major for the forward GEMM, and q^T, K-major for the weight
gradient's. In XLA that is an amax pass, a convert and an fp8 transpose. Here
each program loads one 128x128 tile of X (the scale block) once, takes the
amaxes its modes need over the tile's rows, columns or all of it, and stores q
and q^T with their float32 scales (TransformerEngine's cast-transpose). q^T's
tile is stored through transposed pointers; Triton moves it through shared
memory so that both stores are coalesced.

Scales by mode, with NR = ceil(R / 128), NC = ceil(C / 128):

    mode      q's scale                               q^T's scale (as stored)
    "tensor"  the caller's (from the global amax)     the caller's
    "row"     (R, NC): quantize(x, block=(1, 128))     (C, NR): quantize(x.T, block=(1, 128))
    "tile"    (NR, NC): quantize(x, block=(128, 128))  (NC, NR): quantize(x.T, block=(128, 128))

Bit-identical to `jaxgemm.quantize`: the same float32 operations in the same
order (scale = amax * f32(1/fmax), rounded up to a power of two on the bits for
E8M0 scales, 1.0 where zero or subnormal; q = clip(x * (1/scale)) rounded to
nearest even). What that takes on the GPU:
* the reciprocal is `tl.math.div_rn`: Triton's `/` on float32 is approximate
  (div.full.f32). So is XLA:GPU's division, so quantize run there differs
  from this kernel by an fp8 step in about 1 value in 17000 with float32
  scales (none with E8M0 scales, whose reciprocals are exact); XLA:CPU's
  division is correctly rounded, and its quantize is what the tests match;
* amaxes are int32 maxima of |x|'s bits, since `tl.max` on floats drops NaNs
  on the GPU, where quantize means a block with a NaN to get a NaN scale: for
  non-negative floats the bits order as the values do, and a NaN's bits exceed
  +inf's;
* the clip propagates NaN too (tl.maximum's default drops it);
* the fp8 cast rounds to nearest even (`fp_downcast_rounding="rtne"`: sm_90's
  cvt.rn.satfinite; the clip has made saturation moot).
Triton's interpreter (the CPU) casts fp32 to fp8 wrongly: it rounds half up,
truncates subnormals and can carry a rounded-up mantissa into the wrong bit
(0.496 became e5m2 0.25, not 0.5). There the kernel stores the clipped float32 values
and XLA casts them, which is quantize's own cast (as `scaled.stored_dtype`
does for a bf16 C).
"""

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jaxgemm import triton_call
from jaxgemm.gemm import FP8_DTYPES, SCALE_DTYPES, scale_shape

# The scale block, and so the tile a program owns.
TILE = 128
# Warps a program, by modes (CUPTI, H100, 8192x4096, 8192x14336 and 14336x4096 bf16: the
# fp8-block-wide probe's run4 at ac7bdd6, quant_modes.py). x's ("row", "row") runs at
# 1.8-2.0 TB/s on 4 warps against 1.4 on 8; the other block modes run 1-17% faster on 8
# (("row", "tile") 2.6-2.7 TB/s against 2.2-2.3, ("tile", "tile") 2.7-2.8 against
# 2.5-2.7, q alone 2.7-2.9 against 2.6-2.8). The "tensor" modes keep 4 (not timed by warps).
NUM_WARPS = 4
BLOCK_NUM_WARPS = 8


def num_warps(row_block: str, col_block: str | None) -> int:
  """The warps of a launch for these modes (NUM_WARPS' comment)."""
  if "tensor" in (row_block, col_block) or (row_block, col_block) == ("row", "row"):
    return NUM_WARPS
  return BLOCK_NUM_WARPS
MODES = ("tensor", "row", "tile")
IN_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(jnp.float32))
E8M0 = np.dtype(jnp.float8_e8m0fnu)


@triton.jit
def _scale_of(amax, FMAX: tl.constexpr, POW2: tl.constexpr):
  """quantize's scale of a block with this amax (float32; any shape)."""
  INV_FMAX: tl.constexpr = 1.0 / FMAX   # a Python double, rounded to f32 as quantize's
  s = amax * INV_FMAX
  if POW2:   # pow2_ceil: the exponent of s, plus one unless the mantissa is zero
    up = ((s.to(tl.int32, bitcast=True) + 0x007FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    s = tl.where((s > 0) & (s <= 3.4028234663852886e38), up, s)
  # 1.0 for zero and subnormal scales; NaN and inf pass (s != s: NaN)
  return tl.where((s >= 1.1754943508222875e-38) | (s != s), s, 1.0)


@triton.jit
def _max(x, AXIS: tl.constexpr):
  """tl.max(x, AXIS, keep_dims=True), naming tl.max's own combine function: the
  interpreter reduces with numpy only for that very function, and the clone of
  tl.max that triton_call interprets holds a clone of it (the generic path,
  element by element in Python, took over a second a 128x128 tile)."""
  return tl.reduce(x, AXIS, tl.standard._elementwise_max, keep_dims=True)


@triton.jit
def _block_scale(abs_bits, given_ptr, MODE: tl.constexpr, AXIS: tl.constexpr,
                 FMAX: tl.constexpr, POW2: tl.constexpr):
  """The scale(s) of the tile in MODE, shaped to broadcast over it: (1, 1) for
  "tensor" and "tile", the max over AXIS kept as a dim for "row"."""
  # One return: Triton 3.6 types every return of a function alike, even in pruned
  # constexpr branches ("Inconsistent return types",
  # the fp8-fused-quant probe's run8a at 0b0b344, H100).
  if MODE == "tensor":
    s = tl.load(given_ptr + tl.zeros((1, 1), tl.int32))
  elif MODE == "row":
    s = _scale_of(_max(abs_bits, AXIS).to(tl.float32, bitcast=True), FMAX, POW2)
  else:
    s = _scale_of(_max(_max(abs_bits, 1), 0).to(tl.float32, bitcast=True), FMAX, POW2)
  return s


@triton.jit
def _quantized(x, scale, out_ptr, FMAX: tl.constexpr, STORE_F32: tl.constexpr):
  """clip(x * (1/scale)) in out_ptr's fp8 type, or still float32 where STORE_F32."""
  q = x * tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
  q = tl.maximum(q, -FMAX, propagate_nan=tl.PropagateNan.ALL)
  q = tl.minimum(q, FMAX, propagate_nan=tl.PropagateNan.ALL)
  if not STORE_F32:
    q = q.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
  return q


@triton.jit
def cast_transpose_kernel(
    x_ptr, given_scale_ptr, q_ptr, q_scale_ptr, qt_ptr, qt_scale_ptr,
    R: tl.constexpr, C: tl.constexpr, ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr,
    FMAX: tl.constexpr, POW2: tl.constexpr, STORE_F32: tl.constexpr,
    TILE_SIZE: tl.constexpr, INDEX_64: tl.constexpr,
):
  """q, q^T and their scales from one TILE_SIZE^2 tile of X (R, C) per program.

  Grid: (NR * NC,), tiles in row-major order. MODEs are "tensor", "row" or
  "tile" (the module docstring); COL_MODE "" writes no q^T (qt_ptr and
  qt_scale_ptr are then None). given_scale_ptr: the float32 scale of the
  "tensor" modes (one element; unread otherwise). A "tensor" mode's own scale
  output is left unwritten. q and q^T are fp8 (their pointers' type, FMAX its
  largest value), or float32 where STORE_F32 (the interpreter); POW2: E8M0 scales.
  """
  NC: tl.constexpr = tl.cdiv(C, TILE_SIZE)
  NR: tl.constexpr = tl.cdiv(R, TILE_SIZE)
  pid = tl.program_id(0)
  pid_r = pid // NC
  pid_c = pid % NC
  rows = pid_r * TILE_SIZE + tl.arange(0, TILE_SIZE)
  cols = pid_c * TILE_SIZE + tl.arange(0, TILE_SIZE)
  if INDEX_64:
    rows = rows.to(tl.int64)
    cols = cols.to(tl.int64)
  in_rows = rows[:, None] < R
  in_cols = cols[None, :] < C
  mask = in_rows & in_cols
  # Zeros past the edges: they leave every amax as it is.
  x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
  abs_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF

  s = _block_scale(abs_bits, given_scale_ptr, ROW_MODE, 1, FMAX, POW2)
  tl.store(q_ptr + rows[:, None] * C + cols[None, :], _quantized(x, s, q_ptr, FMAX, STORE_F32),
           mask=mask)
  if ROW_MODE == "row":
    tl.store(q_scale_ptr + rows[:, None] * NC + pid_c, s, mask=in_rows)
  if ROW_MODE == "tile":
    tl.store(q_scale_ptr + pid_r * NC + pid_c + tl.zeros((1, 1), tl.int32), s)

  if COL_MODE != "":
    st = _block_scale(abs_bits, given_scale_ptr, COL_MODE, 0, FMAX, POW2)
    qt = tl.trans(_quantized(x, st, qt_ptr, FMAX, STORE_F32))   # (cols, rows)
    tl.store(qt_ptr + cols[:, None] * R + rows[None, :], qt,
             mask=(cols[:, None] < C) & (rows[None, :] < R))
    if COL_MODE == "row":
      tl.store(qt_scale_ptr + cols[None, :] * NR + pid_r, st, mask=in_cols)
    if COL_MODE == "tile":
      tl.store(qt_scale_ptr + pid_c * NR + pid_r + tl.zeros((1, 1), tl.int32), st)


def _check(x, dtype, row_block, col_block, scale, scale_dtype):
  """Raises on arguments `cast_transpose` does not take; returns (dtype, scale_dtype)."""
  if getattr(x, "ndim", None) != 2 or 0 in x.shape:
    raise ValueError(f"cast_transpose takes a non-empty 2-D x; got x.shape="
                     f"{getattr(x, 'shape', None)}")
  if np.dtype(x.dtype) not in IN_DTYPES:
    raise TypeError(f"cast_transpose's x.dtype must be one of {[d.name for d in IN_DTYPES]}; "
                    f"got {x.dtype}")
  try:
    dtype, scale_dtype = np.dtype(dtype), np.dtype(scale_dtype)
  except TypeError as e:
    raise TypeError(f"cast_transpose's dtype and scale_dtype must be dtypes; got dtype={dtype!r}, "
                    f"scale_dtype={scale_dtype!r}") from e
  if dtype not in FP8_DTYPES:
    raise TypeError(f"cast_transpose's dtype must be one of {[d.name for d in FP8_DTYPES]}; "
                    f"got dtype={dtype}")
  if scale_dtype not in SCALE_DTYPES:
    raise TypeError(f"cast_transpose's scale_dtype must be one of "
                    f"{[d.name for d in SCALE_DTYPES]}; got scale_dtype={scale_dtype}")
  if row_block not in MODES:
    raise ValueError(f"cast_transpose's row_block must be one of {MODES}; got {row_block!r}")
  if col_block is not None and col_block not in MODES:
    raise ValueError(f"cast_transpose's col_block must be None or one of {MODES}; "
                     f"got {col_block!r}")
  needs_scale = "tensor" in (row_block, col_block)
  if needs_scale != (scale is not None):
    raise ValueError(f"cast_transpose takes a scale exactly when row_block or col_block is "
                     f"'tensor'; got row_block={row_block!r}, col_block={col_block!r} and "
                     f"{'no scale' if scale is None else 'a scale'}")
  if scale is not None:
    if getattr(scale, "size", None) != 1 or getattr(scale, "ndim", 2) > 1:
      raise ValueError(f"cast_transpose's scale must have shape () or (1,); got "
                       f"{getattr(scale, 'shape', scale)!r}")
    if np.dtype(scale.dtype) not in SCALE_DTYPES:
      raise TypeError(f"cast_transpose's scale.dtype must be one of "
                      f"{[d.name for d in SCALE_DTYPES]}; got {scale.dtype}")
  return dtype, scale_dtype


def cast_transpose(x, *, dtype, row_block, col_block, scale=None, scale_dtype=jnp.float32,
                   platform):
  """(q, q_scale, qt, qt_scale): x quantized, and x.T quantized, from one read of x.

  Args:
    x: (R, C), bfloat16, float16 or float32.
    dtype: the fp8 type of q and qt (jnp.float8_e4m3fn or jnp.float8_e5m2).
    row_block: how q's scales cover x: "tensor" (`scale`), "row" (1x128
      blocks) or "tile" (128x128), as the module docstring's table says.
    col_block: the same for qt = quantize(x.T, ...), or None for no qt
      (qt and qt_scale are then None).
    scale: the "tensor" modes' scale (shape () or (1,), float32 or E8M0),
      usually quantize's scale of x with block=None; only with a "tensor" mode.
      It is first cast to scale_dtype, so that q is made with the scale
      returned for it.
    scale_dtype: jnp.float32, or jnp.float8_e8m0fnu for power-of-two scales.
    platform: "cpu" runs Triton's interpreter, anything else jax-triton.

  The results equal, bit for bit, `quantize(x, dtype, block, scale_dtype=...)`
  and `quantize(x.T, ...)` for the modes' blocks as XLA:CPU computes them (the
  module docstring says why not always as XLA:GPU does); a "tensor" mode's
  scale is returned as given (cast to scale_dtype).
  """
  dtype, scale_dtype = _check(x, dtype, row_block, col_block, scale, scale_dtype)
  r, c = x.shape
  given = (jnp.ones((1,), jnp.float32) if scale is None else
           jnp.reshape(scale, (1,)).astype(scale_dtype).astype(jnp.float32))
  stored = np.dtype(np.float32) if platform == "cpu" else dtype
  outs = [jax.ShapeDtypeStruct((r, c), stored),
          # jax-triton passes outputs by position: a "tensor" mode's one is a placeholder
          jax.ShapeDtypeStruct((1,) if row_block == "tensor" else scale_shape(row_block, r, c),
                               jnp.float32)]
  if col_block is not None:
    outs += [jax.ShapeDtypeStruct((c, r), stored),
             jax.ShapeDtypeStruct((1,) if col_block == "tensor" else
                                  scale_shape(col_block, c, r), jnp.float32)]
  none_ptrs = {} if col_block is not None else dict(qt_ptr=None, qt_scale_ptr=None)
  launch = triton_call.Launch.make(
      cast_transpose_kernel, (triton.cdiv(r, TILE) * triton.cdiv(c, TILE),), tuple(outs),
      num_warps=num_warps(row_block, col_block), num_stages=1, R=r, C=c, ROW_MODE=row_block,
      COL_MODE=col_block or "", FMAX=int(jnp.finfo(dtype).max), POW2=scale_dtype == E8M0,
      STORE_F32=platform == "cpu", TILE_SIZE=TILE,
      INDEX_64=r * c >= 2**31, **none_ptrs)
  results = triton_call.call(launch, x, given, platform=platform)

  def finish(q, q_scale, mode):
    q_scale = jnp.asarray(scale) if mode == "tensor" else q_scale
    return q.astype(dtype), q_scale.astype(scale_dtype)   # q: a no-op but where STORE_F32
  q, q_scale = finish(*results[:2], row_block)
  if col_block is None:
    return q, q_scale, None, None
  return (q, q_scale, *finish(*results[2:], col_block))
