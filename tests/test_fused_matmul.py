"""matmul with an epilogue (fused_matmul) on every registered kernel: results, errors, transformations.

Each test taking `kernel` runs on every (backend, variant) registered for the
op (tests/conftest.py); on the CPU the kernels run in Triton's and Mosaic
GPU's interpreters. References are float64 numpy with the activations and
their derivatives written out here (independently of `jaxgemm.ops.activations`).

Tolerance: the GEMM's (tests/gemm_testing.py) applied to an epilogue bound.
An error e in Z moves act(Z) by at most L*|e|, with L <= 1.13 the largest
slope of the six activations (gelu's; relu, silu, sigmoid, tanh <= 1.1), and
the output's own rounding (and XLA's rounding of Z, for the "xla" backend's
jnp expression) is relative to |Y| and |residual|; so element-wise
|out - ref| <= tol * (1.2 * (|A| @ |B| + |bias|) + |act(Z)| + |residual|).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from epilogue_testing import GATE_DERIVATIVE_ABS_ERR
from gemm_testing import as_f64, random_array, tolerance
from jaxgemm.ops.fused_matmul import primitive as fused_primitive

pytestmark = pytest.mark.op("fused_matmul")

ACTIVATIONS = (None, "relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh")
_C = math.sqrt(2 / math.pi)
_erf = np.vectorize(math.erf)


def act64(name, z):
  """(act(z), act'(z)) in float64, as jax.nn defines them."""
  if name is None:
    return z, np.ones_like(z)
  if name == "relu":
    return np.maximum(z, 0), (z > 0).astype(np.float64)
  if name == "gelu":
    t = np.tanh(_C * (z + 0.044715 * z**3))
    return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * _C * (1 + 3 * 0.044715 * z**2)
  if name == "gelu_exact":
    cdf = 0.5 * (1 + _erf(z / math.sqrt(2)))
    return z * cdf, cdf + z * np.exp(-z**2 / 2) / math.sqrt(2 * math.pi)
  s = 1 / (1 + np.exp(-z))
  if name == "silu":
    return z * s, s + z * s * (1 - s)
  if name == "sigmoid":
    return s, s * (1 - s)
  return np.tanh(z), 1 - np.tanh(z)**2


def reference(a, b, bias, activation, residual):
  """(Y, the element-wise bound of the module docstring) in float64."""
  a64, b64 = as_f64(a), as_f64(b)
  z = a64 @ b64 + (0 if bias is None else as_f64(bias))
  y, _ = act64(activation, z)
  bound = 1.2 * (np.abs(a64) @ np.abs(b64) + (0 if bias is None else np.abs(as_f64(bias))))
  bound = bound + np.abs(y)
  if residual is not None:
    y = y + as_f64(residual)
    bound = bound + np.abs(as_f64(residual))
  return y, bound


def assert_close(out, ref, bound, tol, what):
  out64 = as_f64(out)
  assert out64.shape == ref.shape, f"{what}: shape {out64.shape} != {ref.shape}"
  assert np.all(np.isfinite(out64)), f"{what}: non-finite output"
  err = np.abs(out64 - ref)
  limit = tol * bound + float(jnp.finfo(jnp.asarray(out).dtype).smallest_subnormal)
  assert np.all(err <= limit), (f"{what}: {(err > limit).sum()} of {err.size} elements off; "
                                f"worst ratio {np.max(err / limit):.3g}")


def skip_unless(kernel, *args, fn=None, **kw):
  fn = fn or (lambda a, b: jaxgemm.matmul(a, b, **kw, **kernel.kw))
  avals = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype) for x in args]
  try:
    jax.eval_shape(fn, *avals)
  except NotImplementedError as e:
    if kernel.is_xla:
      raise
    pytest.skip(f"{kernel} does not take this case: {e}")


def _operands(rng, m, k, n, dtype, bias, residual, batch=()):
  a = random_array(rng, (*batch, m, k), dtype)
  b = random_array(rng, (k, n), dtype)
  return (a, b, random_array(rng, (n,), dtype) if bias else None,
          random_array(rng, (*batch, m, n), dtype) if residual else None)


# ----------------------------------------------------------------- forward

# (activation, bias, residual): every activation with a bias and a residual,
# and each piece of the epilogue alone.
EPILOGUES = [pytest.param((act, True, True), id=f"{act}+bias+residual") for act in ACTIVATIONS[1:]]
EPILOGUES += [pytest.param((None, True, False), id="bias"),
              pytest.param((None, False, True), id="residual"),
              pytest.param(("gelu", False, False), id="gelu-alone"),
              pytest.param((None, True, True), id="bias+residual")]


@pytest.mark.cases(EPILOGUES)
# Mosaic GPU's interpreter: 7-15 s a case; the clusters rung's epilogues are checked on the
# CPU by test_fused_matmul_pallas.py's clusters cases, here in the GPU tier.
@pytest.mark.slow_for_kernels(keep=2, cpu_variants=("warp_specialized",))
def test_every_epilogue_matches_float64(kernel, case, rng):
  activation, bias, residual = case
  # Ragged M, N, K: no tile divides them.
  a, b, bias, residual = _operands(rng, 40, 24, 48, jnp.float32, bias, residual)
  skip_unless(kernel, a, b, bias=bias, activation=activation, residual=residual)
  out = jax.jit(lambda a, b, bias, r: jaxgemm.matmul(
      a, b, bias=bias, activation=activation, residual=r, **kernel.kw))(a, b, bias, residual)
  assert out.dtype == jnp.float32 and out.shape == (40, 48)
  ref, bound = reference(a, b, bias, activation, residual)
  assert_close(out, ref, bound, tolerance(jnp.float32), f"{kernel} {case}")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=("warp_specialized",))
def test_16_bit(kernel, dtype, rng):
  a, b, bias, residual = _operands(rng, 64, 32, 64, dtype, True, True)
  skip_unless(kernel, a, b, bias=bias, activation="silu", residual=residual)
  out = jax.jit(lambda *x: jaxgemm.matmul(x[0], x[1], bias=x[2], activation="silu",
                                          residual=x[3], **kernel.kw))(a, b, bias, residual)
  assert out.dtype == dtype
  ref, bound = reference(a, b, bias, "silu", residual)
  assert_close(out, ref, bound, tolerance(dtype), f"{kernel} {np.dtype(dtype).name}")


@pytest.mark.slow_for_kernels
def test_batches_and_1d_operands(kernel, rng):
  """x (2, 3, M, K) @ W (K, N) joins M; a batched W runs a batch; a 1-D b has no N."""
  a, b, bias, residual = _operands(rng, 8, 16, 24, jnp.float32, True, True, batch=(2, 3))
  skip_unless(kernel, a, b, bias=bias, activation="gelu", residual=residual)
  fn = jax.jit(lambda *x: jaxgemm.matmul(x[0], x[1], bias=x[2], activation="gelu",
                                         residual=x[3], **kernel.kw))
  ref, bound = reference(a, b, bias, "gelu", residual)
  assert_close(fn(a, b, bias, residual), ref, bound, tolerance(jnp.float32), "shared W")
  wb = random_array(rng, (2, 1, 16, 24), jnp.float32)
  ref, bound = reference(a, wb, bias, "gelu", residual)
  assert_close(fn(a, wb, bias, residual), ref, bound, tolerance(jnp.float32), "batched W")
  v, r1 = random_array(rng, (16,), jnp.float32), random_array(rng, (2, 3, 8), jnp.float32)
  out = jax.jit(lambda a, v, r: jaxgemm.matmul(a, v, activation="tanh", residual=r,
                                               **kernel.kw))(a, v, r1)
  ref, bound = reference(a, v, None, "tanh", r1)
  assert_close(out, ref, bound, tolerance(jnp.float32), "1-D b")


# ----------------------------------------------------------------- gated forms

@pytest.mark.parametrize("gate", ["out", "lhs", "rhs"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.slow_for_kernels(keep=0)
def test_gated_forms_every_layout(kernel, gate, layout, rng):
  """The backward's GEMMs: g(Z) * (A @ B), (A * g(Z)) @ B, A @ (B * g(Z)), stored either way."""
  trans_a, trans_b = layout[0] == "T", layout[1] == "T"
  m, k, n = 24, 40, 32
  a = random_array(rng, (k, m) if trans_a else (m, k), jnp.float32)
  b = random_array(rng, (n, k) if trans_b else (k, n), jnp.float32)
  z_shape = {"out": (m, n), "lhs": a.shape, "rhs": b.shape}[gate]
  z = random_array(rng, z_shape, jnp.float32)
  params = dict(trans_a=trans_a, trans_b=trans_b, ndims=(0, 1, 1, 1), out_dtype=jnp.float32,
                acc_dtype=jnp.float32, precision=None, gate=gate, gate_activation="gelu",
                **kernel.kw)
  fn = jax.jit(lambda a, b, z: fused_primitive.bind(a, b, z, **params)[0])
  skip_unless(kernel, a, b, z, fn=fn)
  _, g = act64("gelu", as_f64(z))
  a64, b64 = as_f64(a), as_f64(b)
  # The fp32 g is off by up to GATE_DERIVATIVE_ABS_ERR absolutely (measured on 400001
  # points, epilogue_testing), whatever g's size, so where g cancels towards 0 it is most
  # of g; times |A| @ |B| it enters the bound as itself, not scaled by tol, as in
  # epilogue_testing's reference. Without it, JAXGEMM_TEST_SEED=1881985743 (TN, out) failed
  # at z = -5.28, g = -2.3e-7: the output 3.9e-7 off against a bound of 1.7e-8.
  tol = tolerance(jnp.float32)
  g_err = (np.abs(a64.T if trans_a else a64) @ np.abs(b64.T if trans_b else b64)
           * GATE_DERIVATIVE_ABS_ERR / tol)
  if gate == "lhs":
    a64 = a64 * g
  if gate == "rhs":
    b64 = b64 * g
  op_a, op_b = (a64.T if trans_a else a64), (b64.T if trans_b else b64)
  ref, bound = op_a @ op_b, np.abs(op_a) @ np.abs(op_b)
  if gate == "out":
    ref, bound = ref * g, bound * np.abs(g)
  assert_close(fn(a, b, z), ref, bound + np.abs(ref) + g_err, tol, f"{kernel} {gate}")


# ----------------------------------------------------------------- transformations

def _loss_case(rng):
  """Small integers for A and B and half-integers for the bias: Z is exact even on
  TF32 tensor cores (integers below 2^10 are exact in TF32, their sums in fp32)
  and never 0, so every activation's derivative (relu's step included) is
  evaluated where the reference's is."""
  a = jnp.asarray(rng.integers(-3, 4, (24, 16)), jnp.float32)
  b = jnp.asarray(rng.integers(-3, 4, (16, 40)), jnp.float32)
  bias = jnp.asarray(rng.integers(-4, 4, (40,)) + 0.5, jnp.float32)
  residual = random_array(rng, (24, 40), jnp.float32)
  cot = random_array(rng, (24, 40), jnp.float32)
  return a, b, bias, residual, cot


def _grads64(a, b, bias, residual, cot, activation):
  a64, b64 = as_f64(a), as_f64(b)
  z = a64 @ b64 + as_f64(bias)
  _, g = act64(activation, z)
  dz = as_f64(cot) * g
  return dz @ b64.T, a64.T @ dz, dz.sum(0), as_f64(cot)


@pytest.mark.parametrize("activation", ["gelu", "silu", "relu", "gelu_exact", "sigmoid", "tanh"])
@pytest.mark.slow_for_kernels(keep=0)
def test_grad_every_operand(kernel, activation, rng):
  a, b, bias, residual, cot = _loss_case(rng)
  skip_unless(kernel, a, b, bias=bias, activation=activation, residual=residual)
  loss = lambda *x: (jaxgemm.matmul(x[0], x[1], bias=x[2], activation=activation,
                                    residual=x[3], **kernel.kw) * cot).sum()
  grads = jax.jit(jax.grad(loss, (0, 1, 2, 3)))(a, b, bias, residual)
  tol = tolerance(jnp.float32)
  for name, got, want in zip(("a", "b", "bias", "residual"), grads,
                             _grads64(a, b, bias, residual, cot, activation)):
    scale = np.abs(want).max() + 1e-30
    err = np.abs(as_f64(got) - want).max() / scale
    assert err <= 10 * tol, f"{kernel} {activation} d{name}: {err:.3g}"


@pytest.mark.slow_for_kernels
def test_jvp_and_hessian(kernel, rng):
  a, b, bias, residual, _ = _loss_case(rng)
  skip_unless(kernel, a, b, bias=bias, activation="tanh", residual=residual)
  ours = lambda *x: jaxgemm.matmul(x[0], x[1], bias=x[2], activation="tanh", residual=x[3],
                                   **kernel.kw)
  theirs = lambda *x: jnp.tanh(jnp.matmul(x[0], x[1], precision="highest") + x[2]) + x[3]
  primals = (a, b, bias, residual)
  tangents = tuple(random_array(rng, x.shape, jnp.float32) for x in primals)
  out, tangent = jax.jit(lambda p, t: jax.jvp(ours, p, t))(primals, tangents)
  want_out, want_tangent = jax.jvp(theirs, primals, tangents)
  # fp32 runs as TF32 on the GPU's kernels and XLA's dot: errors scale with the
  # products' size, not each element's, so the absolute part is the largest value's.
  tol = tolerance(jnp.float32)
  np.testing.assert_allclose(out, want_out, rtol=tol, atol=tol * np.abs(want_out).max())
  np.testing.assert_allclose(tangent, want_tangent, rtol=10 * tol,
                             atol=10 * tol * np.abs(want_tangent).max())
  # Second order wrt b and bias: the gated forms' own derivatives.
  a_small, b_small = a[:6, :5], b[:5, :4]
  loss = lambda f: lambda w, c: (f(a_small, w, c, residual[:6, :4]) ** 2).sum()
  hess = jax.jit(jax.hessian(loss(ours), (0, 1)))(b_small, bias[:4])
  want = jax.hessian(loss(theirs), (0, 1))(b_small, bias[:4])
  for h, w in zip(jax.tree.leaves(hess), jax.tree.leaves(want)):
    np.testing.assert_allclose(h, w, rtol=10 * tol, atol=10 * tol * float(np.abs(w).max()))


@pytest.mark.slow_for_kernels
def test_vmap_every_operand(kernel, rng):
  a, b, bias, residual, _ = _loss_case(rng)
  skip_unless(kernel, a, b, bias=bias, activation="silu", residual=residual)
  ours = lambda *x: jaxgemm.matmul(x[0], x[1], bias=x[2], activation="silu", residual=x[3],
                                   **kernel.kw)
  theirs = lambda *x: jax.nn.silu(jnp.matmul(x[0], x[1], precision="highest") + x[2]) + x[3]
  stack = lambda x: jnp.stack([x, -0.5 * x])
  tol = tolerance(jnp.float32)
  for axes in ((0, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, 0, 0, 0)):
    args = [stack(x) if ax == 0 else x for x, ax in zip((a, b, bias, residual), axes)]
    out = jax.jit(jax.vmap(ours, in_axes=axes))(*args)
    want = jax.vmap(theirs, in_axes=axes)(*args)
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max(),
                               err_msg=f"{axes}")


# ----------------------------------------------------------------- the contract

@pytest.mark.parametrize("call, error, match", [
    (lambda a, b: jaxgemm.matmul(a, b, bias=jnp.ones(7)), ValueError, r"bias must have shape \(N,\) = \(8,\)"),
    (lambda a, b: jaxgemm.matmul(a, b, bias=jnp.ones(8, jnp.bfloat16)), TypeError, "bias must be in the result's dtype float32"),
    (lambda a, b: jaxgemm.matmul(a, b, residual=jnp.ones((4, 7))), ValueError, r"residual must have the result's shape \(4, 8\)"),
    (lambda a, b: jaxgemm.matmul(a, b, residual=jnp.ones((4, 8), jnp.float16)), TypeError, "residual must be in the result's dtype"),
    (lambda a, b: jaxgemm.matmul(a, b, activation="swish"), ValueError, "unknown activation='swish'; valid activations: .*'gelu_exact'"),
    (lambda a, b: jaxgemm.matmul(a, b[:, 0], bias=jnp.ones(8)), ValueError, "bias needs b with a column dimension"),
    (lambda a, b: jaxgemm.matmul(a, b, activation="relu", backend="triton", variant="splitk"), ValueError, "variant"),
])
def test_bad_inputs_name_the_argument(call, error, match):
  a, b = jnp.ones((4, 6)), jnp.ones((6, 8))
  with pytest.raises(error, match=match):
    call(a, b)


def test_auto_computes_what_jnp_computes_for_integers():
  a, b = jnp.arange(12).reshape(3, 4), jnp.arange(8).reshape(4, 2)
  out = jaxgemm.matmul(a, b, bias=jnp.ones(2, a.dtype), activation="relu")
  np.testing.assert_array_equal(out, jax.nn.relu(a @ b + 1))
  with pytest.raises(NotImplementedError, match="floating"):
    jaxgemm.matmul(a, b, activation="relu", backend="triton")


def test_gradient_applies_the_derivative_inside_the_backward_gemms():
  """The backward GEMMs are gated (dX = (g*dY) @ W^T, dW = X^T @ (g*dY)), and the
  forward saves Z once: no plain matmul of the cotangent in the gradient."""
  x, w, bias = jnp.ones((16, 32)), jnp.ones((32, 24)), jnp.ones(24)
  loss = lambda x, w, b: jaxgemm.matmul(x, w, bias=b, activation="gelu", backend="triton").sum()
  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(x, w, bias)
  fused = [e.params for e in jaxpr.jaxpr.eqns if e.primitive is fused_primitive.fused_matmul_p]
  assert sorted(str(p["gate"]) for p in fused) == ["None", "lhs", "rhs"]
  assert [p["save_preactivation"] for p in fused if p["gate"] is None] == [True]
  assert not any(e.primitive is jaxgemm.matmul_p for e in jaxpr.jaxpr.eqns)


def test_autotune_finds_and_times_the_fused_forward_and_its_backward(tmp_path):
  """The tuner takes fused_matmul's forms (several results, a problem-dependent
  operand count): the forward, the forward that saves Z, and the two gated backward
  GEMMs; records are stored under the op's name."""
  pytest.importorskip("triton")
  x, w, b = jnp.ones((64, 32), jnp.float16), jnp.ones((32, 64), jnp.float16), jnp.ones(64, jnp.float16)
  fn = lambda x, w, b: jaxgemm.matmul(x, w, bias=b, activation="gelu")
  found = [p.epilogue for p in jaxgemm.problems_in(fn, x, w, b)]
  assert found == ["+bias gelu", "+bias gelu (saves Z)", "gate rhs gelu'", "gate lhs gelu'"]
  cache = tmp_path / "tuned.json"
  report = jaxgemm.autotune(fn, x, w, b, backends=["triton"], iters=2, cache_path=cache,
                            time_budget_s=120, log=None)
  assert len(report.tuned) == 4, report.summary()
  assert not [t for t in report.trials if t.status == "error"], report.summary()
  assert '"fused_matmul|' in cache.read_text() and '|triton/' in cache.read_text()


@pytest.mark.parametrize("m, activation, save, kind, want", [
    (8192, "gelu", False, "NVIDIA H100 80GB HBM3", "pallas"),
    (128, "silu", False, "NVIDIA H200", "triton"),
    (8192, None, False, "NVIDIA H100 80GB HBM3", None),      # a bias alone: XLA's
    (8192, "gelu", True, "NVIDIA H100 80GB HBM3", None),     # saves Z (fwd+bwd): XLA's
    (8192, "gelu", False, "NVIDIA A100-SXM4-80GB", None),    # not measured off Hopper
])
def test_auto_takes_a_fused_kernel_where_measured_faster(m, activation, save, kind, want):
  from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
  bf16 = np.dtype(jnp.bfloat16)
  problem = FusedMatmulProblem(1, m, 14336, 4096, bf16, bf16, np.dtype(np.float32),
                               activation=activation, bias="shared", save_preactivation=save)
  wins = [name for name in ("triton", "pallas")
          if jaxgemm.registry.get_backend(name, "fused_matmul").structural_win(problem, kind)]
  assert wins == ([want] if want else []), wins
