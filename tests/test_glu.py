"""glu on every registered kernel: activation(x @ Wg + bg) * (x @ Wu + bu), errors, transformations.

References are float64 numpy (tests/test_fused_matmul.py's activations).
Tolerance: the GEMM's (tests/gemm_testing.py) on the bound
|act'|max * (|X| @ |Wg| + |bg|) * |Zu| + |act(Zg)| * (|X| @ |Wu| + |bu|) + |H|:
an error e_g in Zg moves H by at most 1.2 |e_g| |Zu|, one e_u in Zu by
|act(Zg)| |e_u|, and the output's rounding is relative to |H|.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64, random_array, tolerance
from test_fused_matmul import act64, assert_close

pytestmark = pytest.mark.op("glu")


def reference(x, wg, wu, activation, bg=None, bu=None):
  x64 = as_f64(x)
  zg = x64 @ as_f64(wg) + (0 if bg is None else as_f64(bg))
  zu = x64 @ as_f64(wu) + (0 if bu is None else as_f64(bu))
  a, _ = act64(activation, zg)
  h = a * zu
  bg_abs = 0 if bg is None else np.abs(as_f64(bg))
  bu_abs = 0 if bu is None else np.abs(as_f64(bu))
  bound = (1.2 * (np.abs(x64) @ np.abs(as_f64(wg)) + bg_abs) * np.abs(zu)
           + np.abs(a) * (np.abs(x64) @ np.abs(as_f64(wu)) + bu_abs) + np.abs(h))
  return h, bound


def skip_unless(kernel, *args, **kw):
  avals = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype) for x in args]
  try:
    jax.eval_shape(lambda x, wg, wu: jaxgemm.glu(x, wg, wu, **kw, **kernel.kw), *avals)
  except NotImplementedError as e:
    if kernel.is_xla:
      raise
    pytest.skip(f"{kernel} does not take this case: {e}")


def _operands(rng, m, k, n, dtype, bias, batch=()):
  x = random_array(rng, (*batch, m, k), dtype)
  wg, wu = random_array(rng, (k, n), dtype), random_array(rng, (k, n), dtype)
  biases = (random_array(rng, (n,), dtype), random_array(rng, (n,), dtype)) if bias else (None,
                                                                                        None)
  return x, wg, wu, *biases


CASES = [pytest.param(("silu", True), id="swiglu+bias"), pytest.param(("gelu", False), id="geglu"),
         pytest.param(("relu", True), id="reglu+bias"),
         pytest.param(("gelu_exact", False), id="gelu_exact"),
         pytest.param(("sigmoid", True), id="sigmoid+bias"),
         pytest.param(("tanh", False), id="tanh")]


@pytest.mark.cases(CASES)
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=("dual",))   # dual_clusters: test_glu_pallas.py
def test_every_activation_matches_float64(kernel, case, rng):
  activation, bias = case
  x, wg, wu, bg, bu = _operands(rng, 40, 24, 48, jnp.float32, bias)
  skip_unless(kernel, x, wg, wu, activation=activation)
  out = jax.jit(lambda *o: jaxgemm.glu(o[0], o[1], o[2], activation=activation, bias_gate=o[3],
                                       bias_up=o[4], **kernel.kw))(x, wg, wu, bg, bu)
  assert out.shape == (40, 48) and out.dtype == jnp.float32
  ref, bound = reference(x, wg, wu, activation, bg, bu)
  assert_close(out, ref, bound, tolerance(jnp.float32), f"{kernel} {case}")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=("dual",))   # dual_clusters: test_glu_pallas.py
def test_16_bit_and_batches(kernel, dtype, rng):
  x, wg, wu, bg, bu = _operands(rng, 16, 32, 64, dtype, True, batch=(2, 2))
  skip_unless(kernel, x, wg, wu)
  out = jax.jit(lambda *o: jaxgemm.glu(o[0], o[1], o[2], bias_gate=o[3], bias_up=o[4],
                                       **kernel.kw))(x, wg, wu, bg, bu)
  assert out.dtype == dtype and out.shape == (2, 2, 16, 64)
  ref, bound = reference(x, wg, wu, "silu", bg, bu)
  assert_close(out, ref, bound, tolerance(dtype), f"{kernel}")


def _theirs(x, wg, wu, bg, bu):
  hi = dict(precision="highest")
  return jax.nn.silu(jnp.matmul(x, wg, **hi) + bg) * (jnp.matmul(x, wu, **hi) + bu)


@pytest.mark.slow_for_kernels
def test_grad_jvp_and_vmap(kernel, rng):
  x, wg, wu, bg, bu = _operands(rng, 24, 16, 40, jnp.float32, True)
  skip_unless(kernel, x, wg, wu)
  ours = lambda *o: jaxgemm.glu(o[0], o[1], o[2], bias_gate=o[3], bias_up=o[4], **kernel.kw)
  cot = random_array(rng, (24, 40), jnp.float32)
  args = (x, wg, wu, bg, bu)
  grads = jax.jit(jax.grad(lambda *o: (ours(*o) * cot).sum(), tuple(range(5))))(*args)
  want = jax.grad(lambda *o: (_theirs(*o) * cot).sum(), tuple(range(5)))(*args)
  tol = 10 * tolerance(jnp.float32)
  for name, g, w in zip(("x", "w_gate", "w_up", "bias_gate", "bias_up"), grads, want):
    err = np.abs(as_f64(g) - as_f64(w)).max() / np.abs(as_f64(w)).max()
    assert err <= tol, f"{kernel} d{name}: {err:.3g}"
  tangents = tuple(random_array(rng, a.shape, jnp.float32) for a in args)
  _, tangent = jax.jit(lambda p, t: jax.jvp(ours, p, t))(args, tangents)
  _, want_tangent = jax.jvp(_theirs, args, tangents)
  # TF32 on the GPU: errors scale with the largest products, not each element.
  np.testing.assert_allclose(tangent, want_tangent, rtol=tol,
                             atol=tol * np.abs(want_tangent).max())
  stack = lambda a: jnp.stack([a, -0.5 * a])
  for axes in ((0, None, None, None, None), (None, 0, 0, None, None), (None, None, None, 0, 0)):
    vargs = [stack(a) if ax == 0 else a for a, ax in zip(args, axes)]
    out = jax.jit(jax.vmap(ours, in_axes=axes))(*vargs)
    want = jax.vmap(_theirs, in_axes=axes)(*vargs)
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max(),
                               err_msg=f"{axes}")


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w: jaxgemm.glu(x, w, w[:, :4]), ValueError, r"w_up must have w_gate's shape \(6, 8\)"),
    (lambda x, w: jaxgemm.glu(x, w, w, activation=None), ValueError, "unknown activation=None"),
    (lambda x, w: jaxgemm.glu(x, w, w, activation="swish"), ValueError, "valid activations"),
    (lambda x, w: jaxgemm.glu(x, w, w, bias_up=jnp.ones(3)), ValueError, r"bias_up must have shape \(N,\) = \(8,\)"),
    (lambda x, w: jaxgemm.glu(x, w, w, bias_gate=jnp.ones(8, jnp.float16)), TypeError, "bias_gate must be in the result's dtype"),
    (lambda x, w: jaxgemm.glu(x, w, w.astype(jnp.float16)), TypeError, "w_up must have w_gate's dtype"),
])
def test_bad_inputs_name_the_argument(call, error, match):
  x, w = jnp.ones((4, 6)), jnp.ones((6, 8))
  with pytest.raises(error, match=match):
    call(x, w)


def test_one_bias_alone_leaves_the_other_zero(rng):
  x, wg, wu, bg, _ = _operands(rng, 8, 16, 24, jnp.float32, True)
  out = jaxgemm.glu(x, wg, wu, bias_gate=bg, backend="xla")
  ref, bound = reference(x, wg, wu, "silu", bg, None)
  assert_close(out, ref, bound, tolerance(jnp.float32), "bias_gate alone")
