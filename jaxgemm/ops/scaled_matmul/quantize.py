"""`quantize`: an array to fp8 values and float32 scales, x ~= q * scale, in scaled_matmul's shapes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxgemm import sharding
from jaxgemm.ops.scaled_matmul import cast_transpose
from jaxgemm.gemm import FP8_DTYPES, SCALE_DTYPES, dtype_among, dtype_names

E8M0 = np.dtype(jnp.float8_e8m0fnu)


def _block_sizes(block, shape) -> tuple[int, int]:
  """The (rows, cols) of one block over the last two dimensions of `shape`."""
  if not (isinstance(block, tuple) and len(block) == 2):
    raise TypeError(f"quantize's block must be None or a pair (rows, cols), each a positive "
                    f"int or None (the whole dimension); got block={block!r}")
  out = []
  for size, b in zip(shape[-2:], block):
    if b is None:
      out.append(max(size, 1))
    elif isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b > 0:
      out.append(int(b))
    else:
      raise TypeError(f"quantize's block entries must be positive ints or None; got "
                      f"block={block!r}")
  return tuple(out)


def pow2_ceil(s):
  """The least power of two >= each positive normal float32 `s` (others pass through).

  Exact on the bits: adding the largest mantissa carries into the exponent unless
  the mantissa is already zero, and masking keeps the exponent alone.
  """
  bits = lax.bitcast_convert_type(s, jnp.int32)
  up = lax.bitcast_convert_type((bits + 0x007FFFFF) & 0x7F800000, jnp.float32)
  return jnp.where(jnp.isfinite(s) & (s > 0), up, s)


def _amax(x, axis=None):
  """max |x| over `axis`, NaN where a NaN is among the values. Jitted, XLA:CPU's max
  drops NaNs (its fast min/max: a NaN block got a finite scale), so on the CPU the NaN
  is put back; GPUs propagate it already and keep their one reduction."""
  plain = lambda x: jnp.max(jnp.abs(x), axis=axis)
  nan_safe = lambda x: jnp.where(jnp.any(jnp.isnan(x), axis=axis), jnp.nan, plain(x))
  return lax.platform_dependent(x, cpu=nan_safe, default=plain)


def _clip(v, fmax):
  """v clipped to +-fmax, NaN kept (XLA:CPU's jitted clip drops it, as its max does)."""
  plain = lambda v: jnp.clip(v, -fmax, fmax)
  return lax.platform_dependent(v, cpu=lambda v: jnp.where(jnp.isnan(v), v, plain(v)),
                                default=plain)


def scale_of_amax(amax, dtype, scale_dtype):
  """The float32 scale of a block whose largest |x| is `amax` (`quantize`'s rule)."""
  s = amax * np.float32(1 / float(jnp.finfo(dtype).max))
  if np.dtype(scale_dtype) == E8M0:
    s = pow2_ceil(s)
  tiny = float(jnp.finfo(jnp.float32).tiny)
  return jnp.where((s >= tiny) | ~jnp.isfinite(s), s, jnp.float32(1))


def quantize(x, dtype=jnp.float8_e4m3fn, block=None, *, scale_dtype=jnp.float32):
  """(q, scale) with x ~= q * scale: q in fp8 `dtype`, scale float32, amax based.

  Args:
    x: a floating array; with a `block`, its last two dimensions are blocked
      (leading ones are batch: one scale per block of each).
    dtype: jnp.float8_e4m3fn (max 448) or jnp.float8_e5m2 (max 57344).
    block: None for one scale (shape ()); else (rows, cols) of a block, an int or
      None (the whole dimension), giving scale shape
      (..., ceil(rows/block_rows), ceil(cols/block_cols)):

        block=(1, 128)     (rows, ceil(cols/128))    activations: scaled_matmul's a_scale
        block=(128, 128)   (ceil(rows/128), ceil(cols/128))   weights: its b_scale
        block=(1, None)    (rows, 1)                 per row
        block=(None, 1)    (1, cols)                 per column
        block=(128, 1)     (ceil(rows/128), cols)    blocks along rows (the a of a
                                                      trans_a scaled_matmul)

      A partial block at the end counts only the elements it has.
    scale_dtype: jnp.float32, or jnp.float8_e8m0fnu for power-of-two scales
      (the OCP MX scale type: an 8-bit exponent). Each scale is then rounded up
      to a power of two, so q uses [dtype_max/2, dtype_max] for a block's amax
      (at most one binade less of range at the bottom), and `scaled_matmul`
      knows its scales exactly: applying one after rounding to bfloat16 is
      exact, which lets XLA's cuBLAS FP8 GEMM write bfloat16 itself.

  Each block's scale is amax / dtype_max (amax in float32 over the block), and
  q = x / scale rounded to `dtype`, clipped to +-dtype_max (saturating: rounding
  never overflows to inf or nan). Both divisions are computed as products with a
  float32 reciprocal (amax * (1 / dtype_max), x * (1 / scale)): XLA rewrites a
  division by a constant into such a product inside `jit` only, so a quantize in
  a jitted training step and the same call outside jit gave scales an ulp apart
  and different fp8 values for 2 inputs in 5 (a test's reference drifted from
  the step it checked); products compile alike in and outside jit. A block whose scale is zero or not a normal
  float32 (all zeros, or amax below ~5e-36) gets scale 1.0, so q holds the
  block's values rounded to fp8 (zeros stay zeros). A non-finite element makes
  its block's scale non-finite. Jit-able (`block` and `dtype` are static).

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> q, s = jaxgemm.quantize(jnp.array([[1.0, -2.0], [0.5, 0.25]]), block=(1, None))
    >>> q.dtype, s.shape, [float(v) for v in s[:, 0] * 448]
    (dtype(float8_e4m3fn), (2, 1), [2.0, 0.5])
  """
  x = jnp.asarray(x)
  dtype = np.dtype(dtype)
  scale_dtype = dtype_among(scale_dtype, SCALE_DTYPES, "quantize", "scale_dtype")
  if dtype not in FP8_DTYPES:
    raise TypeError(f"quantize's dtype must be one of {dtype_names(FP8_DTYPES)}; "
                    f"got dtype={dtype}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"quantize takes a floating x; got x.dtype={x.dtype}")
  fmax = float(jnp.finfo(dtype).max)
  x32 = x.astype(jnp.float32)
  scale_of = lambda amax: scale_of_amax(amax, dtype, scale_dtype)

  if block is None:
    scale = scale_of(_amax(x32) if x.size else jnp.float32(0))
    q = _clip(x32 * (1 / scale), fmax).astype(dtype)
    return q, scale.astype(scale_dtype)
  if x.ndim < 2:
    raise ValueError(f"quantize with block={block!r} blocks the last two dimensions of x; "
                     f"got x.shape={x.shape} (use block=None for one scale)")
  br, bc = _block_sizes(block, x.shape)
  *lead, rows, cols = x.shape
  nr, nc = math.ceil(rows / br), math.ceil(cols / bc)
  padded = jnp.pad(x32, [(0, 0)] * len(lead) + [(0, nr * br - rows), (0, nc * bc - cols)])
  view_sharding, padded_sharding = _block_view_shardings(padded, nr, nc)
  blocked = padded.reshape(*lead, nr, br, nc, bc, out_sharding=view_sharding)
  amax = _amax(blocked, axis=(-3, -1)) if blocked.size else jnp.zeros(
      (*lead, nr, nc), jnp.float32)
  scale = scale_of(amax)                                      # (..., nr, nc)
  # Each block times its scale's reciprocal, broadcast over the block: the products
  # a repeat of the scales gave, with no repeat (which Explicit mesh axes refuse).
  scaled = (blocked * (1 / scale)[..., :, None, :, None]).reshape(
      padded.shape, out_sharding=padded_sharding)[..., :rows, :cols]
  q = _clip(scaled, fmax).astype(dtype)
  return q, scale.astype(scale_dtype)


def _block_view_shardings(padded, nr, nc):
  """The shardings of `padded` (..., R, C) viewed as (..., nr, R/nr, nc, C/nc) blocks and
  back, as `reshape`'s out_sharding; (None, None) where its type shards nothing.

  With Explicit mesh axes jax's reshape rule splits one dimension only and asks for
  the result's sharding otherwise, so it is given: each dimension's mesh axes go where
  the view keeps every device's elements in place (`sharding.split_dim`), or, where
  they cannot (fewer blocks than shards), that dimension is gathered, as quantizing
  a block across devices needs.
  """
  typed = jax.typeof(padded).sharding   # an aval's spec has an entry per dimension
  if all(entry is None for entry in typed.spec):
    return None, None
  *lead, rows, cols = typed.spec
  view = (*lead, *sharding.split_dim(rows, nr, padded.shape[-2] // max(nr, 1), typed.mesh.shape),
          *sharding.split_dim(cols, nc, padded.shape[-1] // max(nc, 1), typed.mesh.shape))
  return typed.update(spec=P(*view)), typed


# The blocks `quantize_pair` takes (for x and for x^T): those the FP8 GEMMs take, and
# what the fused kernel calls them.
_PAIR_MODES = {None: "tensor", (1, 128): "row", (128, 128): "tile"}
QUANTIZE_BACKENDS = ("xla", "triton")


def quantize_pair(x, dtype, block, block_t, *, scale_dtype=jnp.float32, backend="xla"):
  """(q, scale, q_t, scale_t): `quantize(x, dtype, block)` and `quantize(x.T, dtype, block_t)`.

  An FP8 GEMM wants both operands K-major, so a training step needs most tensors
  in both orientations (X for the forward and, transposed, for the wgrad). With
  backend="triton" one kernel reads x once and writes both (amax, scale and cast of
  every 128x128 tile, TransformerEngine's cast-transpose); with "xla", two
  `quantize` calls that XLA fuses as it can (an fp8 transpose where both are per
  tensor). The values are the same bit for bit on the CPU and with power-of-two
  scales; on the GPU, XLA's float32 division is not correctly rounded, so its q
  can be one fp8 step from the kernel's (103 of 2.1M values with float32 block
  scales, the fp8-fused-quant probe's run9 at 21b052b, H100, `diff_probe.py`), the kernel's
  being the correctly rounded one.

  Args:
    x: a 2-D floating array (R, C).
    block, block_t: None (one scale, then both; the amax is XLA's reduction),
      (1, 128) or (128, 128), for x and for x^T (C, R).
    scale_dtype, dtype: as `quantize`'s.
    backend: "xla" or "triton" (the kernel, compiled for jax's default backend, or
      in Triton's interpreter where that is the CPU; under vmap, one kernel call per entry).

  >>> import jax.numpy as jnp
  >>> x = jnp.arange(12.0).reshape(3, 4)
  >>> q, s, qt, st = quantize_pair(x, jnp.float8_e4m3fn, None, None)
  >>> bool((qt == q.T).all()), s == st
  (True, Array(True, dtype=bool))
  """
  x = jnp.asarray(x)
  if backend not in QUANTIZE_BACKENDS:
    raise ValueError(f"quantize_pair's backend={backend!r} must be one of {QUANTIZE_BACKENDS}")
  for name, b in (("block", block), ("block_t", block_t)):
    if b not in _PAIR_MODES:
      raise ValueError(f"quantize_pair's {name}={b!r} must be one of {list(_PAIR_MODES)}")
  if (block is None) != (block_t is None):
    raise ValueError(f"quantize_pair scales x and x^T both per tensor or both in blocks; "
                     f"got block={block!r}, block_t={block_t!r}")
  if x.ndim != 2:
    raise ValueError(f"quantize_pair takes a 2-D x; got x.shape={x.shape}")
  if backend == "xla":
    return _pair_xla(x, dtype, block, block_t, scale_dtype)
  return _pair_triton(x, dtype, block, block_t, scale_dtype)


def _pair_xla(x, dtype, block, block_t, scale_dtype):
  q, scale = quantize(x, dtype, block, scale_dtype=scale_dtype)
  if block is None:
    return q, scale, q.T, scale
  # x's own blocks, then an fp8 transpose: quantizing x.T made XLA transpose the bf16
  # x first, 10.2 ms of the block recipe's step against 2.6 ms for the Triton kernel
  # (H100, the fp8-fused-quant probe's run8a at 0b0b344).
  q_t, scale_t = quantize(x, dtype, block_t[::-1], scale_dtype=scale_dtype)
  return q, scale, q_t.T, scale_t.T


def _pair_triton(x, dtype, block, block_t, scale_dtype):
  modes = (_PAIR_MODES[block], _PAIR_MODES[block_t])

  @jax.custom_batching.custom_vmap
  def fused(x):
    if block is None:   # the whole tensor's amax first: XLA's reduction
      scale = scale_of_amax(_amax(x.astype(jnp.float32)), dtype, scale_dtype)
      q, q_t = cast_transpose.bind(x, scale, dtype=dtype, scale_dtype=scale_dtype, modes=modes)
      scale = scale.astype(scale_dtype)
      return q, scale, q_t, scale
    return tuple(cast_transpose.bind(x, None, dtype=dtype, scale_dtype=scale_dtype,
                                     modes=modes))

  @fused.def_vmap
  def _vmapped(axis_size, in_batched, x):   # the kernel's primitive has no batching rule
    # One kernel call per entry, so each entry is quantized as it would be alone: XLA's
    # quantize can be an fp8 step off the kernel on the GPU (float32 scales; the fp8-fused-quant
    # probe's run9 at 21b052b, diff_probe.py).
    del axis_size, in_batched
    return lax.map(fused, x), (True,) * 4

  return fused(x)
