"""The Triton cast-transpose kernel (kernels/triton/quantize/cast_transpose.py).

Its contract is `jaxgemm.quantize`'s, bit for bit: q and q^T compared as their
bytes, scales as float32 values, against quantize(x, block) and
quantize(x.T, block) for each mode's block, run by XLA:CPU (`_quantize` says
why). Inputs span six decades (a factor per row times one per column) so that
neighbouring blocks get different scales. CPU: Triton's interpreter on small
shapes whose tiles the edges cut (one row, 129 columns, 257 rows), every
row_block x col_block pair, both fp8 types, float32 and E8M0 scales, zero,
saturated and non-finite blocks, and the wrapper's argument errors. GPU tier:
4096 x 14336 bf16 compiled; there the tests above run compiled too. (The
interpreter's fp8 cast is XLA's, see the kernel's docstring: the GPU's own cvt
is checked on the GPU only.)
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm

pytest.importorskip("triton")
from jaxgemm.kernels.triton.quantize.cast_transpose import cast_transpose  # noqa: E402

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
E8M0 = np.dtype(jnp.float8_e8m0fnu)
MODES = ("tensor", "row", "tile")
BLOCK = {"tensor": None, "row": (1, 128), "tile": (128, 128)}
# The CPU tests run compiled where there is a GPU.
PLATFORM = jax.default_backend()


def _x(rng, shape, dtype):
  """Random values, never zero, magnitudes 1e-3 to 1e3 varying by row and column."""
  rows, cols = shape
  mag = 10.0 ** (rng.uniform(-1.5, 1.5, (rows, 1)) + rng.uniform(-1.5, 1.5, (1, cols)))
  x = rng.standard_normal(shape) * mag
  return jnp.asarray(np.where(x == 0, 1.0, x), dtype)


@functools.lru_cache(maxsize=None)
def _jitted(**kw):
  return jax.jit(lambda x, scale: cast_transpose(x, scale=scale, **kw))


def _run(x, dtype, row_block, col_block, scale_dtype, scale=None, platform=PLATFORM):
  return _jitted(dtype=dtype, row_block=row_block, col_block=col_block, scale_dtype=scale_dtype,
                 platform=platform)(x, scale)


def _quantize(x, dtype, block, scale_dtype=F32):
  """jaxgemm.quantize run by XLA:CPU, the reference wherever the kernel runs.

  XLA:GPU's float32 division is not correctly rounded: 1/s was an ulp off for
  about 1 random s in 7 (H100, jax 0.11.2), and quantize's q then differed from
  the correctly rounded one by an fp8 step in about 1 value in 17000 (e4m3,
  float32 scales). XLA:CPU's division, like the kernel's div_rn, is correctly
  rounded; E8M0 scales, powers of two, have exact reciprocals on both."""
  with jax.default_device(jax.devices("cpu")[0]):
    return jaxgemm.quantize(np.asarray(x), dtype, block, scale_dtype=scale_dtype)


def _with_scale(x, scale, dtype):
  """clip(x * (1/scale)) in fp8 `dtype` for a given scale, in numpy (IEEE float32,
  ml_dtypes' round-to-nearest-even cast)."""
  fmax = np.float32(jnp.finfo(dtype).max)
  inv = np.float32(1) / np.asarray(scale, np.float32)
  return np.clip(np.asarray(x, np.float32) * inv, -fmax, fmax).astype(dtype)


def _tensor_scale(x, dtype, scale_dtype, modes):
  """quantize's one scale of x where a mode is "tensor" (what the caller passes)."""
  if "tensor" not in modes:
    return None
  return jaxgemm.quantize(x, dtype, None, scale_dtype=scale_dtype)[1]


def _assert_same(got, want, what):
  (q, s), (rq, rs) = got, want
  assert (q.shape, q.dtype, s.shape, s.dtype) == (rq.shape, rq.dtype, rs.shape, rs.dtype), what
  np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(rq).view(np.uint8),
                                err_msg=f"q of {what}")
  np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(rs, np.float32),
                                err_msg=f"scale of {what}")


def _check(x, dtype, row_block, col_block, scale_dtype):
  """The kernel on x against quantize, both outputs; returns the kernel's outputs."""
  scale = _tensor_scale(x, dtype, scale_dtype, (row_block, col_block))
  out = _run(x, dtype, row_block, col_block, scale_dtype, scale)
  what = (f"x {x.shape} {x.dtype} -> {np.dtype(dtype).name}, {row_block}/{col_block}, "
          f"{np.dtype(scale_dtype).name} scales")
  _assert_same(out[:2], _quantize(x, dtype, BLOCK[row_block], scale_dtype), what)
  if col_block is None:
    assert out[2:] == (None, None)
  else:
    _assert_same(out[2:], _quantize(x.T, dtype, BLOCK[col_block], scale_dtype),
                 f"q^T of {what}")
  return out


# ---------------------------------------------------------------- against quantize


SETTINGS = [
    pytest.param((BF16, E4M3, F32, [(130, 200), (1, 129)]), id="bf16-e4m3-f32_scales"),
    pytest.param((F32, E5M2, E8M0, [(257, 64), (128, 128)]), id="f32-e5m2-e8m0_scales"),
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("row_block,col_block",
                         list(itertools.product(MODES, (None, *MODES))))
def test_every_mode_pair_matches_quantize(row_block, col_block, setting, rng):
  in_dtype, dtype, scale_dtype, shapes = setting
  for shape in shapes:
    _check(_x(rng, shape, in_dtype), dtype, row_block, col_block, scale_dtype)


@pytest.mark.parametrize("scale_dtype", [F32, E8M0], ids=["f32_scales", "e8m0_scales"])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("in_dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_every_dtype_matches_quantize(in_dtype, dtype, scale_dtype, rng):
  _check(_x(rng, (130, 200), in_dtype), dtype, "row", "tile", scale_dtype)


def test_outside_jit(rng):
  x = _x(rng, (130, 200), BF16)
  eager = cast_transpose(x, dtype=E4M3, row_block="tile", col_block="row", platform=PLATFORM)
  jitted = _check(x, E4M3, "tile", "row", F32)
  for a, b in zip(eager, jitted):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("row_block,col_block,scale_dtype",
                         [("row", "tile", F32), ("tile", "row", E8M0)],
                         ids=["row-tile-f32_scales", "tile-row-e8m0_scales"])
def test_zero_blocks_get_scale_one(row_block, col_block, scale_dtype, rng):
  """quantize's scale 1.0 for an all-zero block: a zero 128x128 tile, and a zero row
  (its 1x128 blocks) in the tile the bottom edge cuts."""
  x = _x(rng, (130, 200), BF16).at[:128, :128].set(0).at[129].set(0)
  q, s, qt, st = _check(x, E4M3, row_block, col_block, scale_dtype)
  row_s, tile_s = (s, st) if row_block == "row" else (st, s)
  row_s, tile_s = np.asarray(row_s, np.float32), np.asarray(tile_s, np.float32)
  assert not np.asarray(q[:128, :128], np.float32).any()
  assert tile_s[0, 0] == 1 and (row_s[:128, 0] == 1).all()
  if row_block == "row":
    assert (row_s[129] == 1).all()


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_tensor_scale_below_amax_saturates(dtype, rng):
  """A given scale 8x below amax / fmax: q clips to +-fmax, as clip(x * (1/scale))."""
  x = _x(rng, (130, 200), BF16)
  scale = jaxgemm.quantize(x, dtype, None)[1] / 8
  q, s, qt, st = _run(x, dtype, "tensor", "tensor", F32, scale)
  want = _with_scale(x, scale, dtype)
  assert (np.abs(np.asarray(q, np.float32)) == float(jnp.finfo(dtype).max)).sum() > 100
  _assert_same((q, s), (want, scale), "q")
  _assert_same((qt, st), (want.T, scale), "q^T")


def test_given_scale_is_cast_to_scale_dtype_first(rng):
  """E8M0 scales with a float32 scale that is no power of two: q is made with the
  E8M0 scale returned, so q * scale still dequantizes x."""
  x = _x(rng, (130, 200), F32)
  scale = jaxgemm.quantize(x, E4M3, None)[1] * np.float32(1.3)
  q, s, _, _ = _run(x, E4M3, "tensor", None, E8M0, scale)
  assert s.dtype == E8M0 and s.shape == scale.shape
  _assert_same((q, s), (_with_scale(x, s, E4M3), scale.astype(E8M0)), "q")


def _per_element(scale, mode, shape):
  """A block scale repeated over the elements of its block, cut to `shape`."""
  rows, cols = BLOCK[mode]
  return np.repeat(np.repeat(np.asarray(scale), rows, 0), cols, 1)[:shape[0], :shape[1]]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0
@pytest.mark.parametrize("row_block,col_block,dtype",
                         [("row", "tile", E4M3), ("tile", "row", E5M2)], ids=["e4m3", "e5m2"])
def test_non_finite_blocks(row_block, col_block, dtype, rng):
  """An inf makes its blocks' scales inf and their values 0 (or NaN, inf * 0), and a NaN
  makes its blocks' scales and values NaN, both as quantize's (whose jitted max and
  clip on XLA:CPU drop NaNs unless put back: `quantize._amax`)."""
  x = _x(rng, (130, 200), F32).at[3, 5].set(jnp.inf).at[129, 150].set(jnp.nan)
  q, s, qt, st = _run(x, dtype, row_block, col_block, F32)
  for got, got_s, src, mode, nan_at in ((q, s, x, row_block, (129, 150)),
                                        (qt, st, x.T, col_block, (150, 129))):
    want, want_s = _quantize(src, dtype, BLOCK[mode])
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan_block = np.isnan(_per_element(got_s, mode, src.shape))
    assert nan_block[nan_at] and np.isnan(got[nan_block]).all()
    assert np.isinf(np.asarray(got_s)).any()
    np.testing.assert_array_equal(got, want)   # NaN == NaN here
    np.testing.assert_array_equal(np.asarray(got_s), np.asarray(want_s))


# ---------------------------------------------------------------- errors


GOOD = dict(dtype=E4M3, row_block="row", col_block="tile", platform="cpu")
ERRORS = [  # (id, the arguments that differ from GOOD, the error, what its message says)
    ("x-1d", dict(x=np.ones(128, np.float32)), ValueError, "2-D x"),
    ("x-3d", dict(x=np.ones((2, 128, 128), np.float32)), ValueError, "2-D x"),
    ("x-empty", dict(x=np.ones((0, 128), np.float32)), ValueError, "non-empty"),
    ("x-int32", dict(x=np.ones((4, 4), np.int32)), TypeError, "x.dtype"),
    ("x-float64", dict(x=np.ones((4, 4), np.float64)), TypeError, "x.dtype"),
    ("dtype-bf16", dict(dtype=BF16), TypeError, "dtype must be one of"),
    ("dtype-unknown", dict(dtype="float9"), TypeError, "dtype"),
    ("scale_dtype-bf16", dict(scale_dtype=BF16), TypeError, "scale_dtype must be one of"),
    ("row_block-unknown", dict(row_block="block"), ValueError, "row_block must be one of"),
    ("row_block-None", dict(row_block=None), ValueError, "row_block must be one of"),
    ("col_block-unknown", dict(col_block="col"), ValueError, "col_block must be None or one of"),
    ("no-scale-row", dict(row_block="tensor"), ValueError, "takes a scale exactly when"),
    ("no-scale-col", dict(col_block="tensor"), ValueError, "takes a scale exactly when"),
    ("scale-unused", dict(scale=np.ones((), np.float32)), ValueError, "takes a scale exactly when"),
    ("scale-2", dict(row_block="tensor", scale=np.ones(2, np.float32)), ValueError,
     r"shape \(\) or \(1,\)"),
    ("scale-1x1", dict(row_block="tensor", scale=np.ones((1, 1), np.float32)), ValueError,
     r"shape \(\)"),
    ("scale-bf16", dict(row_block="tensor", scale=np.ones((), BF16)), TypeError,
     "scale.dtype must be one of"),
]


@pytest.mark.parametrize("bad,error,match", [pytest.param(*e[1:], id=e[0]) for e in ERRORS])
def test_bad_arguments(bad, error, match):
  kw = dict(GOOD, **bad)
  x = kw.pop("x", np.ones((4, 4), np.float32))
  with pytest.raises(error, match=match):
    cast_transpose(x, **kw)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("modes,dtype,scale_dtype", [
    pytest.param(("row", "row"), E4M3, F32, id="row-row-e4m3-f32_scales"),
    pytest.param(("row", "row"), E5M2, E8M0, id="row-row-e5m2-e8m0_scales"),
    pytest.param(("tile", "tile"), E4M3, E8M0, id="tile-tile-e4m3-e8m0_scales"),
    pytest.param(("tile", "tile"), E5M2, F32, id="tile-tile-e5m2-f32_scales"),
    pytest.param(("tensor", "tensor"), E4M3, F32, id="tensor-tensor-e4m3-f32_scales"),
])
def test_gpu_large_matches_quantize(modes, dtype, scale_dtype):
  """Compiled (jax-triton): div_rn, the NaN-safe amax and the GPU's fp8 cvt, on a
  4096 x 14336 bf16 activation (58.7M values, 3584 tiles)."""
  rng = np.random.default_rng(0)
  x = _x(rng, (4096, 14336), BF16)
  scale = _tensor_scale(x, dtype, scale_dtype, modes)
  out = _run(x, dtype, *modes, scale_dtype, scale, platform="gpu")
  _assert_same(out[:2], _quantize(x, dtype, BLOCK[modes[0]], scale_dtype), "q")
  _assert_same(out[2:], _quantize(x.T, dtype, BLOCK[modes[1]], scale_dtype), "q^T")
