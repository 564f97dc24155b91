"""Forward results of jaxgemm.matmul / jaxgemm.dot_general on every kernel.

Each case runs on fresh random inputs against a float64 NumPy reference with
the tolerances of `gemm_testing.TOLERANCES`. Every kernel gets a handful of
tiny, tile-unaligned cases (interpreted kernels are slow on CPU); the xla
backend also gets the wide sweep.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm
from gemm_testing import (assert_gemm_close, dot_general_reference, matmul_reference,
                          primitive_names, random_array, skip_unless_supported, tolerance,
                          best_setting, iter_eqns)

pytestmark = pytest.mark.op("matmul")

F32, F16, BF16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(jnp.bfloat16), np.dtype(np.float64)
HIGHEST, DEFAULT = lax.Precision.HIGHEST, None


def case(a_shape, b_shape, dtype, precision=HIGHEST, dist="normal", b_dtype=None,
         out=None, id=None):
  value = dict(a_shape=a_shape, b_shape=b_shape, dtype=np.dtype(dtype),
               b_dtype=np.dtype(b_dtype or dtype), precision=precision, dist=dist,
               out=None if out is None else np.dtype(out))
  if id is None:
    shapes = "x".join("(" + ",".join(map(str, s)) + ")" for s in (a_shape, b_shape))
    dt = value["dtype"].name + ("" if b_dtype is None else "*" + value["b_dtype"].name)
    id = f"{shapes}-{dt}" + ("" if out is None else f"->{value['out'].name}")
    id += "" if precision is None else f"-{precision.name.lower()}"
    id += "-" + dist
  return pytest.param(value, id=id)


# Every kernel: ragged tiny shapes, all float dtypes, both precisions, batches,
# broadcasts, 1-D operands, preferred_element_type and mixed dtypes.
COMMON = [
    case((65, 33), (33, 129), F32),
    case((1, 7), (7, 65), F32, dist="uniform"),
    case((33, 129), (129, 7), F32, DEFAULT),
    case((7, 65), (65, 33), BF16, DEFAULT),
    case((65, 7), (7, 33), F16, DEFAULT, dist="uniform"),
    case((3, 7, 33), (3, 33, 65), F32),                     # batched
    case((2, 1, 7, 33), (3, 33, 65), BF16, DEFAULT),        # broadcast batch
    case((2, 3, 7, 33), (33, 65), F16, DEFAULT),            # x @ W: batch folds into M
    case((33,), (2, 33, 7), F32),                           # 1-D lhs
    case((7, 33), (33,), F32, dist="uniform"),              # 1-D rhs
    case((7, 65), (65, 33), BF16, DEFAULT, out=F32),        # preferred_element_type
    case((7, 65), (65, 33), F16, DEFAULT, b_dtype=BF16),    # mixed: promotes to f32
    # Rows 16-byte aligned (for kernels that load with TMA) but no tile multiple.
    case((33, 40), (40, 72), F32),
    case((72, 24), (24, 40), BF16, DEFAULT, dist="uniform"),
    case((2, 7, 40), (40, 24), F16, DEFAULT, out=F32),
    case((3, 1, 40, 56), (2, 56, 24), BF16, DEFAULT),
]

# xla only: the wide sweep.
WIDE = [
    *(case((m, k), (k, n), dt, prec, dist)
      for m, k, n in [(1, 1, 1), (127, 257, 129), (257, 1, 127), (1, 129, 257), (129, 65, 1)]
      for dt, prec in [(F32, HIGHEST), (F32, DEFAULT), (BF16, DEFAULT), (F16, DEFAULT)]
      for dist in ("normal", "uniform")),
    case((4, 1, 65, 7), (1, 3, 7, 129), F32),
    case((5, 127, 65), (65, 33), BF16, DEFAULT),
    case((2, 3, 33, 7), (1, 7, 65), F16, DEFAULT),
    case((129,), (129,), F32),
    case((65,), (129, 65, 7), BF16, DEFAULT),
    case((3, 7, 65), (65,), F16, DEFAULT),
    case((7, 65), (65, 33), F32, DEFAULT, out=BF16),
    case((7, 65), (65, 33), F32, HIGHEST, out=F16),
    case((7, 65), (65, 33), F16, DEFAULT, out=F32),
    case((7, 65), (65, 33), BF16, DEFAULT, b_dtype=F32),
    case((7, 65), (65, 33), F16, DEFAULT, b_dtype=F32, out=BF16),
    case((7, 65), (65, 33), F32, lax.Precision.HIGH),
    case((7, 65), (65, 33), F32, (lax.Precision.HIGHEST, lax.Precision.HIGH), id="prec-pair"),
    case((7, 65), (65, 33), F32, "highest", id="prec-string"),
]


def _run_matmul(kernel, case, rng):
  a = random_array(rng, case["a_shape"], case["dtype"], case["dist"])
  b = random_array(rng, case["b_shape"], case["b_dtype"], case["dist"])
  kw = dict(precision=case["precision"], preferred_element_type=case["out"])
  skip_unless_supported(kernel, a, b, **kw)
  out = jaxgemm.matmul(a, b, **kw, **kernel.kw)
  expected = jax.eval_shape(lambda a, b: jnp.matmul(a, b, **kw), a, b)
  assert (out.shape, out.dtype) == (expected.shape, expected.dtype)
  ref, bound = matmul_reference(a, b)
  op_dtype = jnp.result_type(a, b)
  tol = tolerance(op_dtype, out.dtype, case["precision"])
  assert_gemm_close(out, ref, bound, tol, f"{kernel} {case}")
  return a, b, out


@pytest.mark.cases(COMMON, xla=WIDE)
@pytest.mark.slow_for_kernels(rotate=True)   # each case on one Pallas rung; all in the GPU tier
def test_matmul_forward(kernel, case, rng):
  _run_matmul(kernel, case, rng)


@pytest.mark.cases([case((65, 33), (33, 129), F32, DEFAULT)], xla=[case((7, 33), (33, 65), F64)])
def test_matmul_forward_x64(kernel, case, rng, x64):
  """With x64 on, float32 stays float32 (and float64 runs on xla)."""
  _run_matmul(kernel, case, rng)


@pytest.mark.cases([pytest.param(d, id=d) for d in ("eager", "jit")])
def test_matmul_matches_jnp_matmul(kernel, case, rng):
  """Same result as jnp.matmul (itself checked against float64) and inside jit."""
  dtype, precision = best_setting(kernel, (2, 33, 40), (40, 24))
  a = random_array(rng, (2, 33, 40), dtype)
  b = random_array(rng, (40, 24), dtype)
  f = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  if case == "jit":
    f = jax.jit(f)
  out = f(a, b)
  want = jnp.matmul(a, b, precision=precision)
  ref, bound = matmul_reference(a, b)
  tol = tolerance(dtype, dtype, precision)
  assert_gemm_close(out, ref, bound, tol, str(kernel))
  # Two correctly rounded answers differ by at most twice the error bound.
  assert_gemm_close(out, np.asarray(want.astype(jnp.float32), np.float64), bound, 2 * tol,
                    f"{kernel} vs jnp.matmul")


# --------------------------------------------------------- dot_general

# (lhs shape, rhs shape, dimension numbers, expected (trans_a, trans_b)).
DG_MAPPED = [
    pytest.param(((7, 33), (33, 65), (((1,), (0,)), ((), ())), (False, False)), id="NN"),
    pytest.param(((33, 7), (33, 65), (((0,), (0,)), ((), ())), (True, False)), id="TN"),
    pytest.param(((7, 33), (65, 33), (((1,), (1,)), ((), ())), (False, True)), id="NT"),
    pytest.param(((33, 7), (65, 33), (((0,), (1,)), ((), ())), (True, True)), id="TT"),
    # The same with 16-byte aligned rows (TMA-loading kernels take only these).
    pytest.param(((24, 40), (40, 56), (((1,), (0,)), ((), ())), (False, False)), id="NN-aligned"),
    pytest.param(((40, 24), (40, 56), (((0,), (0,)), ((), ())), (True, False)), id="TN-aligned"),
    pytest.param(((24, 40), (56, 40), (((1,), (1,)), ((), ())), (False, True)), id="NT-aligned"),
    pytest.param(((40, 24), (56, 40), (((0,), (1,)), ((), ())), (True, True)), id="TT-aligned"),
    pytest.param(((3, 65, 7), (3, 65, 33), (((1,), (1,)), ((0,), (0,))), (True, False)),
                 id="batch-TN"),
    pytest.param(((2, 3, 7, 65), (2, 3, 33, 65), (((3,), (3,)), ((0, 1), (0, 1))),
                  (False, True)), id="batch2-NT"),
    # The weight gradient of a (batch, seq, d) activation: x^T dy contracts batch and seq.
    pytest.param(((2, 5, 33), (2, 5, 7), (((0, 1), (0, 1)), ((), ())), (True, False)),
                 id="two-K-TN"),
]
DG_MAPPED_WIDE = [
    pytest.param(((2, 5, 33), (33, 7, 3), (((2,), (0,)), ((), ())), (False, False)),
                 id="multi-free-NN"),
    pytest.param(((33, 2, 5), (7, 3, 33), (((0,), (2,)), ((), ())), (True, True)),
                 id="multi-free-TT"),
    pytest.param(((4, 129, 2, 3), (4, 65, 129), (((1,), (2,)), ((0,), (0,))), (True, True)),
                 id="batch-multi-TT"),
    pytest.param(((4, 129), (4, 129, 65), (((1,), (1,)), ((0,), (0,))), (False, False)),
                 id="batch-vector-lhs"),
    pytest.param(((1, 257), (127, 257), (((1,), (1,)), ((), ())), (False, True)),
                 id="NT-257"),
    # x (b, s, d) against a (s, d, n) weight: two adjacent contracted dimensions.
    pytest.param(((3, 2, 5, 33), (5, 33, 7), (((2, 3), (0, 1)), ((), ())), (False, False)),
                 id="two-K-NN"),
]


@pytest.mark.cases(DG_MAPPED, xla=DG_MAPPED_WIDE)
@pytest.mark.slow_for_kernels(rotate=True)   # each mapping on one Pallas rung; all in the GPU tier
def test_dot_general_transposed(kernel, case, rng):
  """Layouts that map onto trans flags: right answer, no materialized transpose."""
  lhs_shape, rhs_shape, dims, (trans_a, trans_b) = case
  dtype, precision = best_setting(
      kernel, lhs_shape, rhs_shape,
      fn=lambda l, r, **kw: jaxgemm.dot_general(l, r, dims, **kw))
  lhs = random_array(rng, lhs_shape, dtype)
  rhs = random_array(rng, rhs_shape, dtype)
  f = lambda l, r: jaxgemm.dot_general(l, r, dims, precision=precision, **kernel.kw)
  out = f(lhs, rhs)
  expected = jax.eval_shape(lambda l, r: lax.dot_general(l, r, dims, precision=precision),
                            lhs, rhs)
  assert (out.shape, out.dtype) == (expected.shape, expected.dtype)
  ref, bound = dot_general_reference(lhs, rhs, dims)
  assert_gemm_close(out, ref, bound, tolerance(dtype, dtype, precision), f"{kernel} {dims}")
  jaxpr = jax.make_jaxpr(f)(lhs, rhs)
  (eqn,) = [e for e in iter_eqns(jaxpr) if e.primitive is jaxgemm.matmul_p]
  assert (eqn.params["trans_a"], eqn.params["trans_b"]) == (trans_a, trans_b)
  names = primitive_names(jaxpr)
  assert "transpose" not in names and "dot_general" not in names, names


# Dimension numbers that do not map onto matmul_p: backend="auto" runs
# lax.dot_general (a named backend raises, see test_errors.py).
DG_FALLBACK = [
    pytest.param(((3, 2, 4), (3, 4, 5), (((0, 2), (0, 1)), ((), ()))),
                 id="two-contracting-apart"),
    pytest.param(((3, 2, 4), (2, 4, 5), (((2,), (1,)), ((1,), (0,)))), id="batch-not-leading"),
    pytest.param(((2, 3), (4, 5), (((), ()), ((), ()))), id="outer-product"),
    pytest.param(((2, 7, 3), (7, 5), (((1,), (0,)), ((), ()))), id="contract-middle"),
    pytest.param(((2, 3, 7), (2, 7, 5), (((2,), (1,)), ((0,), (0,)))), id="mapped-control"),
]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32])
@pytest.mark.parametrize("lhs_shape,rhs_shape,dims", [p.values[0] for p in DG_FALLBACK],
                         ids=[p.id for p in DG_FALLBACK])
def test_dot_general_auto_matches_lax(lhs_shape, rhs_shape, dims, dtype, rng):
  lhs = random_array(rng, lhs_shape, dtype)
  rhs = random_array(rng, rhs_shape, dtype)
  out = jaxgemm.dot_general(lhs, rhs, dims)
  want = lax.dot_general(lhs, rhs, dims)
  assert (out.shape, out.dtype) == (want.shape, want.dtype)
  ref, bound = dot_general_reference(lhs, rhs, dims)
  if jnp.issubdtype(dtype, jnp.integer):
    np.testing.assert_array_equal(out, want)
  else:
    assert_gemm_close(out, ref, bound, tolerance(dtype), str(dims))


def test_dot_general_preferred_element_type_and_mixed():
  lhs = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) / 7
  rhs = jnp.arange(6, dtype=jnp.float16).reshape(3, 2) / 3
  dims = (((1,), (0,)), ((), ()))
  for pet in (None, jnp.float32, jnp.bfloat16, jnp.float16):
    # None: lax's own result dtype (bfloat16 for bfloat16 x float16).
    out = jaxgemm.dot_general(lhs, rhs, dims, preferred_element_type=pet, backend="xla")
    want = lax.dot_general(lhs, rhs, dims, preferred_element_type=pet)
    assert (out.shape, out.dtype) == (want.shape, want.dtype)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                               rtol=1e-2)


# ----------------------------------------------- result dtypes and shapes

SHAPE_PAIRS = [
    ((5, 3), (3, 4)), ((3,), (3, 4)), ((5, 3), (3,)), ((3,), (3,)),
    ((2, 5, 3), (3, 4)), ((5, 3), (2, 3, 4)), ((2, 1, 5, 3), (6, 3, 4)),
    ((1, 5, 3), (2, 3, 4)), ((3,), (2, 2, 3, 4)), ((2, 2, 5, 3), (3,)),
    ((0, 5, 3), (3, 4)), ((5, 0), (0, 4)), ((0, 3), (3, 0)), ((2, 0, 3), (2, 3, 4)),
]
DTYPE_PAIRS = [
    (F32, F32, None), (BF16, BF16, None), (F16, F16, None), (BF16, F32, None),
    (F16, BF16, None), (BF16, BF16, F32), (F32, F32, BF16), (F16, F16, F32),
]


def test_result_dtype_and_shape_like_jnp_matmul(kernel):
  """Result dtype and shape equal jnp.matmul's for all shape rules (traced only)."""
  checked = 0
  for a_shape, b_shape in SHAPE_PAIRS:
    for a_dt, b_dt, pet in DTYPE_PAIRS:
      a = jax.ShapeDtypeStruct(a_shape, a_dt)
      b = jax.ShapeDtypeStruct(b_shape, b_dt)
      want = jax.eval_shape(lambda a, b: jnp.matmul(a, b, preferred_element_type=pet), a, b)
      try:
        got = jax.eval_shape(
            lambda a, b: jaxgemm.matmul(a, b, preferred_element_type=pet, **kernel.kw), a, b)
      except NotImplementedError:
        if kernel.is_xla:
          raise
        continue
      assert (got.shape, got.dtype) == (want.shape, want.dtype), (a, b, pet)
      checked += 1
  if checked == 0:
    pytest.skip(f"{kernel} supports none of {DTYPE_PAIRS}")


# ------------------------------------------------------------ zero sizes

# Rows of 8 elements or 0 bytes: every kernel takes these shapes when not empty.
EMPTY = [
    pytest.param(((0, 8), (8, 40)), id="M=0"),
    pytest.param(((7, 40), (40, 0)), id="N=0"),
    pytest.param(((7, 0), (0, 40)), id="K=0"),
    pytest.param(((0, 7, 40), (0, 40, 8)), id="B=0"),
    pytest.param(((2, 7, 0), (0, 8)), id="batched-K=0"),
]


@pytest.mark.cases(EMPTY)
def test_zero_sized(kernel, case):
  """Empty M, N, K or batch: zeros (K=0) of the right shape, and no kernel launched."""
  (a_shape, b_shape) = case
  dtype, precision = best_setting(kernel, a_shape, b_shape)
  a, b = jnp.full(a_shape, 3.0, dtype), jnp.full(b_shape, 5.0, dtype)
  f = jax.jit(lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw))
  out = f(a, b)
  want = jnp.matmul(a, b)
  assert (out.shape, out.dtype) == (want.shape, want.dtype)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.zeros(want.shape, np.float32))
  assert jaxgemm.matmul_p in [e.primitive for e in iter_eqns(jax.make_jaxpr(f)(a, b))]
  hlo = f.lower(a, b).as_text()
  for op in ("custom_call", "dot_general", "while", "call @"):
    assert op not in hlo, f"{op} in the compiled empty problem:\n{hlo}"
  # The gradient of an empty problem is empty or zero too, without kernels.
  g = jax.jit(jax.grad(lambda a, b: jaxgemm.matmul(a, b, precision=precision,
                                                   **kernel.kw).sum(), (0, 1)))
  da, db = g(a, b)
  assert da.shape == a.shape and db.shape == b.shape
  assert not np.asarray(da, np.float32).any() and not np.asarray(db, np.float32).any()
  hlo = g.lower(a, b).as_text()
  assert "custom_call" not in hlo and "dot_general" not in hlo, hlo


# ------------------------------------------------------------ NaN and Inf


def test_nan_inf_propagate_like_jnp(kernel, rng):
  dtype, precision = best_setting(kernel, (33, 40), (40, 24))
  a = np.array(random_array(rng, (33, 40), np.float32))
  b = np.array(random_array(rng, (40, 24), np.float32))
  a[3, 10] = np.nan          # row 3 all NaN
  a[20, 39] = np.inf         # row 20: +-Inf, sign of b[39, j]
  a[31, 0] = -np.inf
  a[31, 1] = np.inf          # row 31: Inf - Inf = NaN where signs of b[0:2, j] agree
  b[30, 5] = np.nan          # column 5 all NaN
  a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
  out = jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  want = jnp.matmul(a, b, precision=precision)
  out, want = np.asarray(out, np.float64), np.asarray(want, np.float64)
  np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
  np.testing.assert_array_equal(np.isposinf(out), np.isposinf(want))
  np.testing.assert_array_equal(np.isneginf(out), np.isneginf(want))
  assert np.isnan(want).sum() >= 24 + 33 - 1 and np.isinf(want).sum() > 0  # the test bites
  finite = np.isfinite(want)
  ref, bound = matmul_reference(jnp.where(jnp.isfinite(a), a, 0), b)
  ref = np.where(finite, ref, 0)
  assert_gemm_close(np.where(finite, out, 0), ref, np.where(finite, bound, 0),
                    tolerance(dtype, dtype, precision), f"{kernel} finite part")


# --------------------------------------- backend="auto" takes everything

AUTO_CASES = [
    (np.int32, np.int32, None), (np.int8, np.int8, None), (np.uint8, np.int8, None),
    (np.int8, np.int8, np.int32), (np.bool_, np.bool_, None), (np.complex64, np.complex64, None),
    (np.float32, np.complex64, None), (np.int32, np.float16, None), (np.bool_, np.float32, None),
    (np.float32, np.float32, np.int32), (np.float32, np.float32, None),
    (jnp.bfloat16, jnp.bfloat16, None), (jnp.bfloat16, np.float32, np.float32),
]
AUTO_X64_CASES = [
    (np.float64, np.float64, None), (np.float32, np.float64, None), (np.int64, np.int64, None),
    (np.float64, np.float64, np.float32), (np.float32, np.float32, np.float64),
    (np.complex128, np.complex128, None), (np.int64, np.float32, None),
]


def _check_auto(a_dt, b_dt, pet, rng, precision=None):
  for a_shape, b_shape in [((5, 3), (3, 4)), ((2, 1, 5, 3), (6, 3, 4)), ((3,), (3, 4)),
                           ((5, 3), (3,)), ((0, 3), (3, 4)), ((5, 0), (0, 4))]:
    a = random_array(rng, a_shape, a_dt)
    b = random_array(rng, b_shape, b_dt)
    out = jaxgemm.matmul(a, b, precision=precision, preferred_element_type=pet)
    want = jnp.matmul(a, b, precision=precision, preferred_element_type=pet)
    assert (out.shape, out.dtype) == (want.shape, want.dtype)
    if jnp.issubdtype(want.dtype, jnp.inexact) and want.dtype.itemsize <= 4:
      np.testing.assert_allclose(np.asarray(out, np.complex128), np.asarray(want, np.complex128),
                                 rtol=1e-2 if want.dtype.itemsize < 4 else 2e-5, atol=1e-5)
    elif jnp.issubdtype(want.dtype, jnp.inexact):
      np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-12, atol=1e-12)
    else:
      np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


@pytest.mark.parametrize("a_dt,b_dt,pet", AUTO_CASES, ids=str)
def test_auto_accepts_what_jnp_matmul_accepts(a_dt, b_dt, pet, rng):
  _check_auto(a_dt, b_dt, pet, rng)


@pytest.mark.parametrize("a_dt,b_dt,pet", AUTO_X64_CASES, ids=str)
def test_auto_accepts_x64(a_dt, b_dt, pet, rng, x64):
  _check_auto(a_dt, b_dt, pet, rng)


@pytest.mark.parametrize("precision", [
    "highest", "fastest", ("high", "default"), lax.Precision.HIGH,
    lax.DotAlgorithmPreset.F32_F32_F32, lax.DotAlgorithmPreset.DEFAULT], ids=str)
def test_auto_accepts_any_precision(precision, rng):
  _check_auto(np.float32, np.float32, None, rng, precision=precision)


def test_auto_runs_on_matmul_p_for_floats():
  """backend="auto" uses the primitive (xla on CPU) for what the kernels take."""
  a = jnp.ones((4, 8), jnp.bfloat16)
  names = primitive_names(jax.make_jaxpr(jaxgemm.matmul)(a, a.T))
  assert "jaxgemm_matmul" in names and "dot_general" not in names
  names = primitive_names(jax.make_jaxpr(jaxgemm.matmul)(a.astype(jnp.int8), a.T.astype(jnp.int8)))
  assert "jaxgemm_matmul" not in names and "dot_general" in names


@pytest.mark.parametrize("setting, want", [
    ("float32", lax.Precision.HIGHEST), ("highest", lax.Precision.HIGHEST),
    ("tensorfloat32", lax.Precision.HIGH), ("bfloat16", lax.Precision.DEFAULT)])
@pytest.mark.parametrize("fn", ["matmul", "dot_general"])
def test_default_matmul_precision_is_honoured(setting, want, fn):
  """precision=None means jax.default_matmul_precision's setting, as it does to
  jnp.matmul: with "float32" the named kernel backends run exact fp32 (Triton's
  exact rung), not TF32."""
  a, b = jnp.ones((16, 32), jnp.float32), jnp.ones((32, 8), jnp.float32)
  call = {"matmul": lambda a, b, **kw: jaxgemm.matmul(a, b, **kw),
          "dot_general": lambda a, b, **kw: jaxgemm.dot_general(
              a, b, (((1,), (0,)), ((), ())), **kw)}[fn]
  # The backends that take fp32 operands (Pallas refuses them for now).
  backends = ["auto", *(b for b in jaxgemm.backends() if b != "pallas")]
  with jax.default_matmul_precision(setting):
    for backend in backends:
      eqns = [e for e in iter_eqns(jax.make_jaxpr(
          lambda a, b: call(a, b, backend=backend))(a, b).jaxpr)
              if e.primitive is jaxgemm.matmul_p]
      assert [e.params["precision"] for e in eqns] == [(want, want)], backend
  if "triton" in backends and setting in ("float32", "highest"):
    from jaxgemm import dispatch  # noqa: PLC0415
    from jaxgemm.ops.matmul.primitive import problem_of  # noqa: PLC0415
    (eqn,) = eqns
    problem = problem_of(*[v.aval for v in eqn.invars], **eqn.params)
    assert problem.fp32_precision == "ieee"
    assert dispatch.choose(problem, "triton").variant == "pipelined"
  # Outside the context the default is back: TF32-able, precision None.
  (eqn,) = [e for e in jax.make_jaxpr(lambda a, b: call(a, b, backend="xla"))(a, b).eqns
            if e.primitive is jaxgemm.matmul_p]
  assert eqn.params["precision"] is None


@pytest.mark.parametrize("mode", ["standard", "strict"])
@pytest.mark.parametrize("lhs_dt, rhs_dt, pet", [
    (F32, BF16, None), (BF16, F32, None), (BF16, F16, None), (F16, F32, BF16),
    (BF16, F16, F32)], ids=str)
def test_dot_general_mixed_operands_as_lax(lhs_dt, rhs_dt, pet, mode, rng):
  """dot_general takes the mixed operand dtypes lax.dot_general takes, in either
  promotion mode (float32 x bfloat16 raised TypePromotionError under "strict"),
  with lax's result dtype; the kernels compute in the operands' standard
  promotion (float32 here), so the float64 reference holds at fp32's tolerance
  for the inputs as given. Pallas takes no fp32 operands yet."""
  lhs, rhs = random_array(rng, (33, 40), lhs_dt), random_array(rng, (40, 24), rhs_dt)
  dims = (((1,), (0,)), ((), ()))
  ref, bound = dot_general_reference(lhs, rhs, dims)
  with jax.numpy_dtype_promotion(mode):
    want = lax.dot_general(lhs, rhs, dims, preferred_element_type=pet)
    for backend in ["auto", *(b for b in jaxgemm.backends() if b != "pallas")]:
      out = jaxgemm.dot_general(lhs, rhs, dims, preferred_element_type=pet, backend=backend,
                                precision="highest")
      assert (out.shape, out.dtype) == (want.shape, want.dtype), backend
      assert_gemm_close(out, ref, bound, tolerance(F32, out.dtype, "highest"), backend)


def test_dot_general_fp8_pair_goes_to_lax():
  """Two fp8 formats have no common dtype for the kernels: auto hands the call to
  lax (its result), a named kernel backend says why it cannot run it."""
  lhs = jnp.ones((16, 32), jnp.float8_e4m3fn)
  rhs = jnp.ones((32, 8), jnp.float8_e5m2)
  dims = (((1,), (0,)), ((), ()))
  want = lax.dot_general(lhs, rhs, dims)
  out = jaxgemm.dot_general(lhs, rhs, dims)
  assert out.dtype == want.dtype
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))
  with pytest.raises(NotImplementedError, match="float8_e4m3fn x float8_e5m2"):
    jaxgemm.dot_general(lhs, rhs, dims, backend="xla")
