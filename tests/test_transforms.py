"""JAX transformations of matmul_p on every kernel: grad, vjp, jvp, linearize,
jit, vmap, hessian, vmap(grad), grad(grad), and a jitted MLP training step.

Kernel backends run in the most precise (dtype, precision) they take
(`gemm_testing.best_setting`) on tiny shapes whose rows are 16-byte aligned
but no tile multiple (M ragged), so TMA-loading kernels are covered too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxgemm
from gemm_testing import (as_f64, assert_gemm_close, best_setting, iter_eqns,
                          primitive_names, random_array, tolerance)

pytestmark = pytest.mark.op("matmul")

# The Pallas rungs whose transformation tests run on the CPU. The transformations are the
# primitive's rules, the same for every rung; the persistent rungs (warp_specialized and
# the three built on it) take 25-80 s a gradient check in Mosaic GPU's interpreter, so
# theirs run compiled in the GPU tier (`slow_for_kernels`); their forward cases stay here.
CPU_PALLAS_RUNGS = ("basic", "pipelined")

M, K, N = 33, 40, 24     # M ragged; K and N multiples of 8 (aligned rows), no tile size

NN = (((1,), (0,)), ((), ()))
TN = (((0,), (0,)), ((), ()))
NT = (((1,), (1,)), ((), ()))
TT = (((0,), (1,)), ((), ()))


def _shapes(dims, m=M, k=K, n=N, batch=()):
  (lc, rc), _ = dims
  nb = len(batch)
  a = (*batch, k, m) if lc[0] == nb else (*batch, m, k)
  b = (*batch, n, k) if rc[0] == nb + 1 else (*batch, k, n)
  return a, b


def _dg(kernel, dims, precision, **kw):
  return lambda a, b: jaxgemm.dot_general(a, b, dims, precision=precision, **kw, **kernel.kw)


def _np_dg(dims):
  """float64 numpy dot_general for layouts (*batch, rows, cols) with one free dim per side."""
  def f(a, b):
    (lc, rc), (lb, _) = dims
    nb = len(lb)
    # Operands are (..., *batch, rows, cols); extra leading axes are vmap's.
    a = np.swapaxes(a, -1, -2) if lc[0] == nb else a
    b = np.swapaxes(b, -1, -2) if rc[0] == nb + 1 else b
    return np.matmul(a, b)
  return f


# ---------------------------------------------------------------- check_grads

XLA_GRAD_CASES = [
    pytest.param(((7, 33), (33, 5), NN), id="NN"),
    pytest.param(((33, 7), (33, 5), TN), id="TN"),
    pytest.param(((7, 33), (5, 33), NT), id="NT"),
    pytest.param(((33, 7), (5, 33), TT), id="TT"),
    pytest.param(((2, 7, 33), (2, 33, 5), (((2,), (1,)), ((0,), (0,)))), id="batched"),
    pytest.param(((2, 3, 7), (2, 5, 3), (((1,), (2,)), ((0,), (0,)))), id="batched-TT"),
    pytest.param(((2, 5, 9), (9, 3, 4), (((2,), (0,)), ((), ()))), id="multi-free"),
]


@pytest.mark.parametrize("shapes", XLA_GRAD_CASES)
def test_check_grads_order2_x64_xla(shapes, rng, x64):
  """xla backend, float64: check_grads order 2, forward and reverse mode."""
  a_shape, b_shape, dims = shapes
  a = random_array(rng, a_shape, np.float64)
  b = random_array(rng, b_shape, np.float64)
  f = lambda a, b: jnp.tanh(jaxgemm.dot_general(a, b, dims, backend="xla"))
  # eps=1e-6: the numerical derivatives' truncation error (~eps^2) stays far
  # below the float64 tolerance (check_grads' default eps of 1e-4 does not
  # for tanh of larger arguments).
  check_grads(f, (a, b), order=2, modes=("fwd", "rev"), eps=1e-6)


@pytest.mark.parametrize("shapes", [((2, 1, 7, 9), (3, 9, 5)), ((9,), (2, 9, 5)),
                                    ((2, 7, 9), (9,)), ((9,), (9,)), ((4, 7, 9), (9, 5))],
                         ids=str)
def test_check_grads_order2_x64_xla_matmul_shapes(shapes, rng, x64):
  a_shape, b_shape = shapes
  a = random_array(rng, a_shape, np.float64)
  b = random_array(rng, b_shape, np.float64)
  f = lambda a, b: jnp.sin(jaxgemm.matmul(a, b, backend="xla"))
  check_grads(f, (a, b), order=2, modes=("fwd", "rev"), eps=1e-6)


@pytest.mark.cases([pytest.param(NN, id="NN"), pytest.param(TT, id="TT")])
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=CPU_PALLAS_RUNGS)
def test_check_grads_order1_kernel(kernel, case, rng):
  """Every kernel, order 1, fwd and rev, in fp32 (skipped if it has no fp32 path).

  matmul is bilinear, so central differences are exact at any step: eps=1
  keeps fp32 cancellation out of the numerical derivative, leaving only the
  GEMMs' own rounding, which the table's tolerance (x4: the check sums up to
  four GEMMs' errors) covers. Since Pallas took fp32, its 12 cases were 245 s of
  a 20-minute CPU suite: the CPU keeps NN per rung, the GPU tier runs TT too.
  """
  dims = case
  a_shape, b_shape = _shapes(dims)
  dtype, precision = best_setting(kernel, a_shape, b_shape,
                                  fn=lambda a, b, **kw: jaxgemm.dot_general(a, b, dims, **kw))
  if dtype != np.float32:
    pytest.skip(f"{kernel} has no fp32 path; gradients are compared with float64 "
                f"in test_vjp_against_float64")
  a = random_array(rng, a_shape, dtype, "uniform")
  b = random_array(rng, b_shape, dtype, "uniform")
  tol = 4 * tolerance(dtype, dtype, precision)
  check_grads(_dg(kernel, dims, precision), (a, b), order=1, modes=("fwd", "rev"), eps=1.0,
              atol=tol * K, rtol=tol)


# ------------------------------------------------------------------------ vjp

VJP_EXACT = [
    pytest.param(((7, 33), (33, 65), NN), id="NN"),
    pytest.param(((33, 7), (33, 65), TN), id="TN"),
    pytest.param(((7, 33), (65, 33), NT), id="NT"),
    pytest.param(((33, 7), (65, 33), TT), id="TT"),
    pytest.param(((3, 33, 7), (3, 65, 33), (((1,), (2,)), ((0,), (0,)))), id="batched-TT"),
    pytest.param(((3, 7, 33), (3, 33, 65), (((2,), (1,)), ((0,), (0,)))), id="batched-NN"),
]


@pytest.mark.parametrize("dtype,precision", [
    (np.float32, None), (np.float32, lax.Precision.HIGHEST), (jnp.bfloat16, None),
    (np.float16, None)], ids=["f32", "f32-highest", "bf16", "f16"])
@pytest.mark.parametrize("shapes", VJP_EXACT)
def test_vjp_like_lax_xla(shapes, dtype, precision, rng):
  """xla backend: the same output as lax.dot_general's, and the same cotangents
  up to summation order (see `_assert_same_cotangents`).

  Only layouts whose GEMMs sum the same products as lax's; broadcast batches
  (summed inside our GEMM, after it in jnp) are in test_vjp_against_float64.
  """
  a_shape, b_shape, dims = shapes
  lax_dot = lambda a, b: lax.dot_general(a, b, dims, precision=precision)
  a = random_array(rng, a_shape, dtype)
  b = random_array(rng, b_shape, dtype)
  out, f_vjp = jax.vjp(_dg_xla(dims, precision), a, b)
  want, want_vjp = jax.vjp(lax_dot, a, b)
  ct = random_array(rng, out.shape, out.dtype)
  np.testing.assert_array_equal(out, want)
  _assert_same_cotangents(lax_dot, a, b, ct, f_vjp(ct), want_vjp(ct))


def _dg_xla(dims, precision):
  return lambda a, b: jaxgemm.dot_general(a, b, dims, precision=precision, backend="xla")


def test_vjp_like_jnp_matmul_xla(rng):
  for a_shape, b_shape in [((7, 33), (33, 65)), ((33,), (33, 65)), ((7, 33), (33,)),
                           ((3, 7, 33), (3, 33, 65))]:
    a = random_array(rng, a_shape, np.float32)
    b = random_array(rng, b_shape, np.float32)
    out, f_vjp = jax.vjp(lambda a, b: jaxgemm.matmul(a, b, backend="xla"), a, b)
    want, want_vjp = jax.vjp(jnp.matmul, a, b)
    ct = random_array(rng, out.shape, out.dtype)
    np.testing.assert_array_equal(out, want)
    _assert_same_cotangents(jnp.matmul, a, b, ct, f_vjp(ct), want_vjp(ct))


def _assert_same_cotangents(fn, a, b, ct, got, want):
  """Cotangents `got` equal lax's `want` up to the order of their sums.

  Not bit for bit: XLA:CPU picks its dot kernel per operand layout and CPU,
  and lax transposes the product it computes where we ask for the transposed
  product directly. On CI's machine (run of 2026-11-23) the two differed by up
  to 4.8e-7 at values near 2.5, only in the last of 65 columns: a vector
  loop's remainder, rounded differently. Two f32 sums of the same `terms`
  products, in any order, are each within terms * 2^-24 * (|x| @ |y|) of the
  exact sum (Higham, Accuracy and Stability, eq. 3.5, to first order), and
  each is then rounded to its dtype (half an ulp); a wrong operand, flag or
  transpose is off by O(|x| @ |y|) and fails.
  """
  terms = max(*a.shape, *b.shape)        # bounds each backward GEMM's K
  _, bounds = _vjp_f64(fn, a, b, ct)
  for g, w, bound in zip(got, want, bounds):
    assert g.dtype == w.dtype and g.shape == w.shape
    finfo = jnp.finfo(g.dtype)
    limit = 2 * (terms * 2.0**-24 + float(finfo.eps) / 2) * bound + float(finfo.smallest_subnormal)
    err = np.abs(as_f64(g) - as_f64(w))
    assert np.all(err <= limit), (f"{np.sum(err > limit)} of {err.size} cotangent elements "
                                  f"differ from lax's by more than summation order explains; "
                                  f"worst {err.max():.3g}")


VJP_CASES = [
    pytest.param((NN, ()), id="NN"),
    pytest.param((TN, ()), id="TN"),
    pytest.param((NT, ()), id="NT"),
    pytest.param((TT, ()), id="TT"),
    pytest.param(((((2,), (1,)), ((0,), (0,))), (3,)), id="batched"),
]


def _vjp_f64(fn, a, b, ct):
  """(cotangents, bounds) of `fn` in float64 (jax in x64 mode): its VJP at (a, b)
  for ct, and at (|a|, |b|) for |ct|, which bounds every backward GEMM's rounding."""
  with jax.enable_x64(True):
    a64, b64, ct64 = (jnp.asarray(as_f64(x)) for x in (a, b, ct))
    _, ref_vjp = jax.vjp(fn, a64, b64)
    _, bound_vjp = jax.vjp(fn, jnp.abs(a64), jnp.abs(b64))
    return ([np.asarray(r) for r in ref_vjp(ct64)],
            [np.asarray(r) for r in bound_vjp(jnp.abs(ct64))])


def _check_vjp(kernel, rng, fn, a_shape, b_shape, np_fn, out_dtype=None):
  dtype, precision = best_setting(kernel, a_shape, b_shape, fn=fn,
                                  preferred_element_type=out_dtype)
  a = random_array(rng, a_shape, dtype)
  b = random_array(rng, b_shape, dtype)
  f = lambda a, b: fn(a, b, precision=precision, preferred_element_type=out_dtype,
                      **kernel.kw)
  out, f_vjp = jax.vjp(f, a, b)
  ct = random_array(rng, out.shape, out.dtype)
  da, db = f_vjp(ct)
  assert (da.shape, da.dtype, db.shape, db.dtype) == (a.shape, a.dtype, b.shape, b.dtype)
  # Backward GEMMs run in the operands' dtype: the reference takes ct rounded to it.
  ref, bound = _vjp_f64(np_fn, a, b, ct.astype(dtype))
  tol = tolerance(dtype, dtype, precision)
  assert_gemm_close(da, ref[0], bound[0], tol, f"{kernel} d lhs")
  assert_gemm_close(db, ref[1], bound[1], tol, f"{kernel} d rhs")


@pytest.mark.cases(VJP_CASES)
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=CPU_PALLAS_RUNGS)
def test_vjp_against_float64(kernel, case, rng):
  dims, batch = case
  a_shape, b_shape = _shapes(dims, batch=batch)
  fn = lambda a, b, **kw: jaxgemm.dot_general(a, b, dims, **kw)
  _check_vjp(kernel, rng, fn, a_shape, b_shape,
             lambda a, b: lax.dot_general(a, b, dims, precision=lax.Precision.HIGHEST))


@pytest.mark.cases([pytest.param(((2, 1, M, K), (3, K, N)), id="broadcast"),
                    pytest.param(((2, M, K), (K, N)), id="shared-rhs"),
                    pytest.param(((K,), (2, K, N)), id="vector-lhs")])
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=CPU_PALLAS_RUNGS)
def test_vjp_against_float64_matmul_shapes(kernel, case, rng):
  a_shape, b_shape = case
  _check_vjp(kernel, rng, jaxgemm.matmul, a_shape, b_shape,
             functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST))


@pytest.mark.slow_for_kernels(keep=1, cpu_variants=CPU_PALLAS_RUNGS)
def test_vjp_preferred_element_type(kernel, rng):
  """16-bit operands with an fp32 result: the cotangents come back in 16 bits."""
  a_shape, b_shape = (M, K), (K, N)
  for dtype in (np.float16, jnp.bfloat16):
    a = jax.ShapeDtypeStruct(a_shape, dtype)
    kw = dict(preferred_element_type=np.float32)
    try:
      jax.eval_shape(lambda a, b: jaxgemm.matmul(a, b, **kw, **kernel.kw), a, a.update(shape=b_shape))
    except NotImplementedError as e:
      if kernel.is_xla:
        raise
      reason = str(e)
      continue
    a = random_array(rng, a_shape, dtype)
    b = random_array(rng, b_shape, dtype)
    out, f_vjp = jax.vjp(lambda a, b: jaxgemm.matmul(a, b, **kw, **kernel.kw), a, b)
    assert out.dtype == np.float32
    ct = random_array(rng, out.shape, np.float32)
    da, db = f_vjp(ct)
    assert (da.dtype, db.dtype) == (a.dtype, b.dtype)
    ct16 = as_f64(ct.astype(dtype))
    a64, b64 = as_f64(a), as_f64(b)
    tol = tolerance(dtype, dtype)
    assert_gemm_close(da, ct16 @ b64.T, np.abs(ct16) @ np.abs(b64).T, tol, f"{kernel} da")
    assert_gemm_close(db, a64.T @ ct16, np.abs(a64).T @ np.abs(ct16), tol, f"{kernel} db")
    return
  pytest.skip(f"{kernel} has no 16-bit -> fp32 path: {reason}")


# ------------------------------------------------------ jit, jvp, linearize


@pytest.mark.slow_for_kernels(keep=1, cpu_variants=CPU_PALLAS_RUNGS)
def test_jit_jvp_linearize(kernel, rng):
  dtype, precision = best_setting(kernel, (M, K), (K, N))
  a, ta = (random_array(rng, (M, K), dtype) for _ in range(2))
  b, tb = (random_array(rng, (K, N), dtype) for _ in range(2))
  f = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  tol = tolerance(dtype, dtype, precision)
  a64, b64, ta64, tb64 = map(as_f64, (a, b, ta, tb))
  ref, bound = a64 @ b64, np.abs(a64) @ np.abs(b64)
  t_ref = ta64 @ b64 + a64 @ tb64
  t_bound = np.abs(ta64) @ np.abs(b64) + np.abs(a64) @ np.abs(tb64)

  assert_gemm_close(jax.jit(f)(a, b), ref, bound, tol, f"{kernel} jit")
  out, t_out = jax.jvp(f, (a, b), (ta, tb))
  assert_gemm_close(out, ref, bound, tol, f"{kernel} jvp primal")
  assert_gemm_close(t_out, t_ref, t_bound, tol, f"{kernel} jvp tangent")
  out, t_out = jax.jit(lambda *x: jax.jvp(f, x[:2], x[2:]))(a, b, ta, tb)
  assert_gemm_close(t_out, t_ref, t_bound, tol, f"{kernel} jit(jvp) tangent")

  out, f_lin = jax.linearize(f, a, b)
  assert_gemm_close(out, ref, bound, tol, f"{kernel} linearize primal")
  assert_gemm_close(f_lin(ta, tb), t_ref, t_bound, tol, f"{kernel} linearized")
  # Tangent in a only: the linear map is one GEMM with b.
  assert_gemm_close(f_lin(ta, jnp.zeros_like(b)), ta64 @ b64, np.abs(ta64) @ np.abs(b64), tol,
                    f"{kernel} linearized, a only")


# -------------------------------------------------------------------- vmap

# (in_axes, out_axes, a's per-example shape, b's per-example shape, dims)
VMAP_COMMON = [
    pytest.param(((0, None), 0, NN), id="lhs-only"),
    pytest.param(((None, 0), 0, NN), id="rhs-only"),
    pytest.param(((0, 0), 0, NN), id="both"),
    pytest.param(((1, None), 1, TN), id="lhs-only-axis1-TN"),
    pytest.param(((None, 2), 2, NT), id="rhs-only-axis2-NT"),
]
VMAP_WIDE = [
    pytest.param(((2, 1), 0, TT), id="both-axes21-TT"),
    pytest.param(((0, None), 2, TT), id="lhs-only-TT-out2"),
    pytest.param(((None, 0), 1, TN), id="rhs-only-TN"),
    pytest.param(((2, None), 0, NN), id="lhs-only-axis2"),
    pytest.param(((None, 1), 0, NN), id="rhs-only-axis1"),
    pytest.param(((1, 0), 1, NT), id="both-NT"),
]
V = 3


def _mapped_shape(shape, axis):
  return shape if axis is None else (*shape[:axis], V, *shape[axis:])


@pytest.mark.slow_for_kernels(rotate=True)   # each layout on one Pallas rung
@pytest.mark.cases(VMAP_COMMON, xla=VMAP_WIDE)
def test_vmap(kernel, case, rng):
  in_axes, out_axes, dims = case
  a_shape, b_shape = _shapes(dims, m=7, k=K, n=N)
  fn = lambda a, b, **kw: jaxgemm.dot_general(a, b, dims, **kw)
  va_shape, vb_shape = _mapped_shape(a_shape, in_axes[0]), _mapped_shape(b_shape, in_axes[1])
  # The batching rule folds V into M or N: check the folded problem too.
  dtype, precision = best_setting(kernel, a_shape, b_shape, fn=fn)
  a = random_array(rng, va_shape, dtype)
  b = random_array(rng, vb_shape, dtype)
  f = jax.vmap(lambda a, b: fn(a, b, precision=precision, **kernel.kw), in_axes, out_axes)
  out = f(a, b)
  a64 = np.moveaxis(as_f64(a), in_axes[0], 0) if in_axes[0] is not None else as_f64(a)[None]
  b64 = np.moveaxis(as_f64(b), in_axes[1], 0) if in_axes[1] is not None else as_f64(b)[None]
  np_fn = _np_dg(dims)
  ref = np.moveaxis(np_fn(a64, b64), 0, out_axes)
  bound = np.moveaxis(np_fn(np.abs(a64), np.abs(b64)), 0, out_axes)
  assert_gemm_close(out, ref, bound, tolerance(dtype, dtype, precision), f"{kernel} vmap")
  # vmap stays on matmul_p: no dot_general, one GEMM.
  names = primitive_names(jax.make_jaxpr(f)(a, b))
  assert names.count("jaxgemm_matmul") == 1 and "dot_general" not in names, names


@pytest.mark.slow_for_kernels(keep=1, cpu_variants=CPU_PALLAS_RUNGS)
def test_vmap_nested_and_batched_operands(kernel, rng):
  """vmap of vmap over already-batched operands (batch dims fold into B)."""
  dtype, precision = best_setting(kernel, (2, 7, K), (2, K, N))
  a = random_array(rng, (2, 3, 2, 7, K), dtype)
  b = random_array(rng, (3, 2, K, N), dtype)
  mm = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  out = jax.vmap(jax.vmap(mm, (0, 0)), (0, None))(a, b)
  a64, b64 = as_f64(a), as_f64(b)
  assert_gemm_close(out, np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64)),
                    tolerance(dtype, dtype, precision), f"{kernel} vmap(vmap)")


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)], ids=str)
def test_vmap_empty_axis(kernel, in_axes):
  """vmap over a size-0 axis gives an empty result (no kernel runs)."""
  dtype, precision = best_setting(kernel, (7, K), (K, N))
  a = jnp.ones((0, 7, K) if in_axes[0] == 0 else (7, K), dtype)
  b = jnp.ones((0, K, N) if in_axes[1] == 0 else (K, N), dtype)
  mm = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  out = jax.vmap(mm, in_axes)(a, b)
  assert out.shape == (0, 7, N) and out.dtype == dtype
  g = jax.vmap(jax.grad(lambda a, b: mm(a, b).sum()), in_axes)(a, b)
  assert g.shape == (0, 7, K)


# ------------------------------------------- higher order: reference in f64


def _loss_fn(mm):
  return lambda a, b: jnp.sum(jnp.tanh(mm(a, b)) ** 2)


def _f64_reference(fun_of_mm, *args):
  """`fun_of_mm(jnp.matmul at HIGHEST)` evaluated in float64 (x64 mode)."""
  with jax.enable_x64(True):
    mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
    args64 = [jnp.asarray(as_f64(x)) for x in args]
    return np.asarray(fun_of_mm(mm)(*args64))


def _assert_rel(got, ref, tol, what):
  got = as_f64(got)
  assert got.shape == ref.shape, (got.shape, ref.shape)
  rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
  assert rel <= tol, f"{what}: relative error {rel:.3g} > {tol:.1g}"


# Chains of GEMMs and elementwise ops: the norm-wise error grows with the
# number of GEMMs on the path (here up to 4), each within the table's bound.
CHAIN = 4


@pytest.mark.slow_for_kernels
def test_hessian(kernel, rng):
  dtype, precision = best_setting(kernel, (3, 8), (8, 8))
  a = random_array(rng, (3, 8), dtype, "uniform")
  b = random_array(rng, (8, 8), dtype, "uniform") / 4
  mm_k = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  fun = lambda mm: jax.hessian(_loss_fn(mm))
  got = fun(mm_k)(a, b)
  assert got.shape == (3, 8, 3, 8) and got.dtype == dtype
  _assert_rel(got, _f64_reference(fun, a, b), CHAIN * tolerance(dtype, dtype, precision),
              f"{kernel} hessian")


@pytest.mark.slow_for_kernels
def test_vmap_grad(kernel, rng):
  """Per-example gradients: vmap(grad) over examples, weights shared."""
  dtype, precision = best_setting(kernel, (7, K), (K, N))
  x = random_array(rng, (5, 7, K), dtype)
  w = random_array(rng, (K, N), dtype) / 8
  mm_k = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  fun = lambda mm: jax.vmap(jax.grad(_loss_fn(mm), argnums=1), (0, None))
  got = jax.jit(fun(mm_k))(x, w)
  assert got.shape == (5, K, N) and got.dtype == dtype
  _assert_rel(got, _f64_reference(fun, x, w), CHAIN * tolerance(dtype, dtype, precision),
              f"{kernel} vmap(grad)")


@pytest.mark.slow_for_kernels
def test_grad_grad(kernel, rng):
  dtype, precision = best_setting(kernel, (M, K), (K, N))
  a = random_array(rng, (M, K), dtype)
  b = random_array(rng, (K, N), dtype) / 8
  mm_k = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)

  def fun(mm):
    g = jax.grad(_loss_fn(mm), argnums=(0, 1))
    return jax.grad(lambda a, b: sum(jnp.sum(jnp.sin(x)) for x in g(a, b)), argnums=(0, 1))

  got = fun(mm_k)(a, b)
  ref = _f64_reference(lambda mm: lambda a, b: jnp.concatenate(
      [x.ravel() for x in fun(mm)(a, b)]), a, b)
  _assert_rel(jnp.concatenate([x.astype(jnp.float32).ravel() for x in got]), ref,
              CHAIN * tolerance(dtype, dtype, precision), f"{kernel} grad(grad)")


# ---------------------------------------------------------------- training

STEPS = 20


def _mlp_losses(mm, dtype, x, y, params, lr=0.05):
  """20 jitted SGD steps of a 2-layer MLP; GEMMs in `dtype`, params in fp32."""
  def forward(params, x):
    w1, b1, w2, b2 = params
    h = jax.nn.gelu(mm(x.astype(dtype), w1.astype(dtype)) + b1)
    return mm(h.astype(dtype), w2.astype(dtype)) + b2

  def loss(params, x, y):
    return jnp.mean((forward(params, x).astype(jnp.float32) - y) ** 2)

  @jax.jit
  def step(params, x, y):
    l, g = jax.value_and_grad(loss)(params, x, y)
    return [p - lr * gp.astype(p.dtype) for p, gp in zip(params, g)], l

  losses = []
  for _ in range(STEPS):
    params, l = step(params, x, y)
    losses.append(float(l))
  return np.asarray(losses), step


def _mlp_setup(rng):
  x = random_array(rng, (32, K), np.float32)
  y = jnp.sin(random_array(rng, (32, 8), np.float32))
  params = [random_array(rng, (K, N), np.float32) / np.sqrt(K), jnp.zeros((N,)),
            random_array(rng, (N, 8), np.float32) / np.sqrt(N), jnp.zeros((8,))]
  return x, y, params


@pytest.mark.slow_for_kernels
def test_mlp_training_matches_xla(kernel, rng):
  """A jitted 2-layer MLP step: the kernel's loss trajectory is the xla backend's."""
  dtype, precision = best_setting(kernel, (32, K), (K, N))
  x, y, params = _mlp_setup(rng)
  mm = lambda kw: lambda a, b: jaxgemm.matmul(a, b, precision=precision,
                                              preferred_element_type=jnp.float32, **kw)
  if kernel.is_xla:
    # The reference itself: against jnp.matmul, at HIGHEST to pin XLA's own precision.
    mm = lambda kw: lambda a, b: jaxgemm.matmul(a, b, precision=lax.Precision.HIGHEST,
                                                preferred_element_type=jnp.float32, **kw)
    want, _ = _mlp_losses(lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST,
                                                  preferred_element_type=jnp.float32),
                          dtype, x, y, params)
  else:
    want, _ = _mlp_losses(mm(dict(backend="xla")), dtype, x, y, params)
  got, step = _mlp_losses(mm(kernel.kw), dtype, x, y, params)
  assert np.all(np.isfinite(got))
  assert got[-1] < 0.8 * got[0], f"training does not learn: {got}"
  # 20 steps chain ~100 GEMMs whose fp32 sums run in each kernel's own order:
  # the CHAIN factor of the other chained tests (pallas-pipelined on the H200:
  # 2.7e-5 from xla's trajectory, against a single GEMM's 1e-5).
  rtol = tolerance(dtype, np.float32, precision) * (1 if kernel.is_xla else CHAIN)
  np.testing.assert_allclose(got, want, rtol=rtol, err_msg=f"{kernel} loss trajectory vs xla")
  # The step runs on matmul_p: 2 forward GEMMs, 3 backward (dW1, dh, dW2).
  jaxpr = jax.make_jaxpr(step)(params, x, y)
  assert primitive_names(jaxpr).count("jaxgemm_matmul") == 5


# ------------------------------------------------------------------- jaxprs


def test_matmul_p_in_jaxpr(kernel):
  dtype, precision = best_setting(kernel, (M, K), (K, N))
  a, b = jnp.ones((M, K), dtype), jnp.ones((K, N), dtype)
  jaxpr = jax.make_jaxpr(lambda a, b: jaxgemm.matmul(a, b, precision=precision,
                                                     **kernel.kw))(a, b)
  (eqn,) = [e for e in iter_eqns(jaxpr) if e.primitive is jaxgemm.matmul_p]
  assert (eqn.params["backend"], eqn.params["variant"]) == (kernel.backend, kernel.variant)
  # config=None: the backend picks one per problem when lowering.
  assert eqn.params["config"] is None or isinstance(eqn.params["config"], jaxgemm.KernelConfig)


@pytest.mark.parametrize("out_dtype", [None, np.float32], ids=["same", "f32-out"])
def test_backward_keeps_kernel_and_precision(kernel, out_dtype):
  """Every GEMM of grad runs on the same kernel, precision and accumulator."""
  dtype, precision = best_setting(kernel, (M, K), (K, N), preferred_element_type=out_dtype)
  a, b = jnp.ones((M, K), dtype), jnp.ones((K, N), dtype)
  f = lambda a, b: jaxgemm.matmul(a, b, precision=precision, preferred_element_type=out_dtype,
                                  **kernel.kw).astype(jnp.float32).sum()
  fwd = [e for e in iter_eqns(jax.make_jaxpr(f)(a, b)) if e.primitive is jaxgemm.matmul_p]
  eqns = [e for e in iter_eqns(jax.make_jaxpr(jax.grad(f, (0, 1)))(a, b))
          if e.primitive is jaxgemm.matmul_p]
  assert len(fwd) == 1 and len(eqns) == 3
  for e in eqns:
    for p in ("backend", "variant", "config", "precision", "acc_dtype"):
      assert e.params[p] == fwd[0].params[p], (p, e.params[p], fwd[0].params[p])
  assert {(e.params["trans_a"], e.params["trans_b"]) for e in eqns} == {
      (False, False), (False, True), (True, False)}


@pytest.mark.kernel_backends
def test_gradient_jaxpr_has_no_dot_general(kernel, rng):
  """Kernel backends: forward and backward GEMMs are all matmul_p, nowhere dot_general."""
  dtype, precision = best_setting(kernel, (32, K), (K, N))
  x, y, params = _mlp_setup(rng)
  mm = lambda a, b: jaxgemm.matmul(a, b, precision=precision,
                                   preferred_element_type=jnp.float32, **kernel.kw)

  def loss(params, x):
    w1, _, w2, _ = params
    h = jnp.tanh(mm(x.astype(dtype), w1.astype(dtype)))
    return jnp.sum(mm(h.astype(dtype), w2.astype(dtype)))

  cases = [
      ("grad", jax.grad(loss), (params, x)),
      ("jit(grad(jit))", jax.jit(jax.grad(jax.jit(loss))), (params, x)),
      ("hessian", jax.hessian(lambda w1: loss([w1, None, params[2], None], x)), (params[0],)),
  ]
  for what, g, args in cases:
    jaxpr = jax.make_jaxpr(g)(*args)
    names = primitive_names(jaxpr)
    assert "jaxgemm_matmul" in names, what
    assert "dot_general" not in names, f"{kernel} {what}: dot_general in\n{jaxpr}"


def test_jaxpr_walk_finds_nested_dot_general():
  """The walker above sees inside sub-jaxprs (jit, custom_jvp, ...)."""
  f = jax.grad(jax.jit(lambda a: jnp.sum(jax.nn.relu(jnp.matmul(a, a.T)))))
  names = primitive_names(jax.make_jaxpr(f)(jnp.ones((3, 4))))
  assert "dot_general" in names
  assert "dot_general" not in [e.primitive.name for e in jax.make_jaxpr(f)(jnp.ones((3, 4))).eqns]


@pytest.mark.parametrize("dims,batch", [(NN, ()), (TN, ()), (NT, ()), (TT, ()),
                                        ((((2,), (1,)), ((0,), (0,))), (3,))],
                         ids=["NN", "TN", "NT", "TT", "batched"])
def test_derived_gemms_pass_the_variant_check(kernel, dims, batch):
  """The GEMMs that grad and vmap derive run on the forward's kernel: each must be
  one that kernel accepts (its `check`), as the forward was, or it would run a
  kernel outside its contract. Traced only."""
  from jaxgemm.ops import rules
  from jaxgemm.ops.matmul import primitive
  a_shape, b_shape = _shapes(dims, batch=batch)
  fn = lambda a, b, **kw: jaxgemm.dot_general(a, b, dims, **kw)
  dtype, precision = best_setting(kernel, a_shape, b_shape, fn=fn)
  f = lambda a, b: fn(a, b, precision=precision, **kernel.kw).astype(jnp.float32).sum()
  a, b = jax.ShapeDtypeStruct(a_shape, dtype), jax.ShapeDtypeStruct(b_shape, dtype)
  va = jax.ShapeDtypeStruct((4, *a_shape), dtype)
  jaxprs = [jax.make_jaxpr(jax.grad(f, (0, 1)))(a, b),
            jax.make_jaxpr(jax.vmap(jax.grad(f, (0, 1)), (0, None)))(va, b)]
  checked = 0
  for jaxpr in jaxprs:
    for e in iter_eqns(jaxpr):
      if e.primitive is jaxgemm.matmul_p:
        problem = primitive.problem_of(*[v.aval for v in e.invars], **e.params)
        c = rules.resolve_kernel(problem, e.params)
        assert (c.backend, c.variant) == (kernel.backend, kernel.variant)
        jaxgemm.registry.get_backend(c.backend).check(problem, c.variant, c.config)
        checked += 1
  assert checked == 3 + 3
