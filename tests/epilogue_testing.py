"""Shared by the fused_matmul and glu backend tests: float64 references of the epilogue
kernels and the one way a test runs a backend's impl (as tests/gemm_testing.py is for GEMMs).

The references evaluate `jaxgemm.ops.activations` in float64 (the kernels are held to
jax.nn's definitions; the op-level tests, tests/test_fused_matmul.py, write them out
independently). Bounds are element-wise, compared as `tol * bound` by
`gemm_testing.assert_gemm_close`: |A| @ |B| for a product (times 1.2, the largest |act'|,
through an activation), plus the magnitudes of the terms added, plus the result's own (its
rounding at the store).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gemm_testing import as_f64, assert_gemm_close, random_array, tolerance
from jaxgemm.ops import activations


def act64(name, z):
  """activations.apply in float64."""
  with jax.enable_x64(True):
    return np.asarray(activations.apply(name, jnp.asarray(z, jnp.float64)))


def grad64(name, z):
  """activations.derivative in float64."""
  with jax.enable_x64(True):
    return np.asarray(activations.derivative(name, jnp.asarray(z, jnp.float64)))


def _op(x, trans):
  return np.swapaxes(x, 1, 2) if trans else x


# The in-kernel derivatives' largest absolute error in fp32 against float64, on 400001
# points of [-12, 12] (tests/test_fused_matmul_pallas.py::test_activation_formulas): gelu'
# 3.5e-6 at z = -4.87 (0.5 (1 + t) + 0.5 z (1 + t)(1 - t) du with t -> -1: a few ulps of
# tanh near -1, times |z du| ~ 13), the others <= 7.3e-7. Absolute, not relative to g:
# where g cancels towards 0 (gelu' ~ -3e-5 at z = -4.5) it is a large part of g.
GATE_DERIVATIVE_ABS_ERR = 4e-6


def fused_matmul_reference(problem, a, b, extras, tol):
  """([outputs], [element-wise bounds]) in float64 of a FusedMatmulProblem on its operands."""
  a64, b64 = as_f64(a), as_f64(b)
  ex = [as_f64(x) for x in extras]
  if problem.gate in ("lhs", "rhs"):   # gated operand rounded to its dtype, as the contract says
    g = grad64(problem.gate_activation, ex[0])
    if problem.gate == "lhs":
      a64 = as_f64(jnp.asarray(a64 * g, np.float32).astype(problem.dtype))
    else:
      b64 = as_f64(jnp.asarray(b64 * g, np.float32).astype(problem.dtype))
  acc = _op(a64, problem.trans_a) @ _op(b64, problem.trans_b)
  mag = np.abs(_op(a64, problem.trans_a)) @ np.abs(_op(b64, problem.trans_b))
  if problem.gate == "out":
    # out = round(g32 * acc32): the product's error, |g| * (|A| @ |B|) relative, the
    # store's rounding, relative to |out|, and the kernel's fp32 g, off by up to
    # GATE_DERIVATIVE_ABS_ERR absolutely, times |acc| <= |A| @ |B|. That last error does
    # not scale with the output dtype's tol, so it enters as itself (/ tol). H100 GPU
    # tier, bf16, gelu', z = -4.5: g32 = -3.139e-5 against -2.932e-5, |acc| = 7.55,
    # |A| @ |B| = 41.1: the output off by 1.5e-5 where tol * (|g| |A| @ |B| + |out|) is 1.43e-5.
    g = grad64(problem.gate_activation, ex[0])
    return [g * acc], [(np.abs(g) + GATE_DERIVATIVE_ABS_ERR / tol) * mag + np.abs(g * acc)]
  if problem.gate:
    return [acc], [mag + np.abs(acc)]
  z, zmag = acc, mag
  if problem.bias:
    bias = ex.pop(0)
    bias = bias[None, None, :] if problem.bias == "shared" else bias[:, None, :]
    z, zmag = z + bias, zmag + np.abs(bias)
  y = act64(problem.activation, z) if problem.activation else z
  ymag = 1.2 * zmag
  if problem.residual:
    res = ex.pop(0)
    y, ymag = y + res, ymag + np.abs(res)
  ymag = ymag + np.abs(y)
  return ([y, z], [ymag, zmag + np.abs(z)]) if problem.save_preactivation else ([y], [ymag])


def glu_reference(problem, x, wg, wu, biases):
  """([H, Zg, Zu], [bounds]) in float64 of a GluProblem: an error in Zg moves H by at most
  1.2 |dZg| |Zu|, one in Zu by |act(Zg)| |dZu|, plus H's rounding."""
  x64 = _op(as_f64(x), problem.trans_a)
  zs, mags = [], []
  for i, w in enumerate((wg, wu)):
    w64 = _op(as_f64(w), problem.trans_b)
    z, mag = x64 @ w64, np.abs(x64) @ np.abs(w64)
    if biases:
      bias = as_f64(biases[i])
      bias = bias[None, None, :] if problem.bias == "shared" else bias[:, None, :]
      z, mag = z + bias, mag + np.abs(bias)
    zs.append(z)
    mags.append(mag)
  a = act64(problem.activation, zs[0])
  h = a * zs[1]
  hmag = 1.2 * mags[0] * np.abs(zs[1]) + np.abs(a) * mags[1] + np.abs(h)
  return [h, *zs], [hmag, mags[0] + np.abs(zs[0]), mags[1] + np.abs(zs[1])]


def run_impl(backend, problem, variant, config, *, platform="cpu", seed=0, gate_dtype=None):
  """`backend.impl` on random operands of `problem` (a fused_matmul or glu problem), every
  output checked against its float64 reference; returns the outputs."""
  rng = np.random.default_rng(seed)
  glu = problem.op == "glu"
  a = random_array(rng, problem.a_shape, problem.dtype)
  b = [random_array(rng, problem.b_shape, problem.dtype) for _ in range(2 if glu else 1)]
  gated = getattr(problem, "gate", None)
  dtypes = ([gate_dtype or problem.out_dtype] if gated
            else [problem.out_dtype] * len(problem.extra_shapes))
  extras = [random_array(rng, s, d) for s, d in zip(problem.extra_shapes, dtypes)]
  backend.check(problem, variant, config)
  out = jax.jit(backend.impl(problem, variant, config, platform))(a, *b, *extras)
  outs = out if problem.num_outputs > 1 else (out,)
  assert len(outs) == problem.num_outputs
  tol = tolerance(problem.dtype, problem.out_dtype)
  refs, bounds = (glu_reference(problem, a, *b, extras) if glu
                  else fused_matmul_reference(problem, a, b[0], extras, tol))
  names = ("h", "zg", "zu") if glu else ("y", "z")
  for name, o, r, bound in zip(names, outs, refs, bounds):
    assert o.shape == problem.out_shape and o.dtype == problem.out_dtype
    assert_gemm_close(o, r, bound, tol, f"{problem.describe()} {variant} {name}")
  return outs
