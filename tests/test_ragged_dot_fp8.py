"""The FP8 grouped training path, `jaxgemm.ragged_dot(x, w, group_sizes, fp8=recipe)`.

The forward and the dgrad are FP8 grouped GEMMs (`scaled_ragged_dot`): each is checked
against the float64 product of its operands as the recipe quantizes them
(`jaxgemm.quantize`, with the blocks the recipe names; W's per expert), at
test_scaled_ragged_dot's tolerance for the backend, which checks the wiring (which
operand, which blocks, which transpose, which scale). So is the weight gradient, the
ragged-K form of `scaled_ragged_dot` on X and dY quantized along the tokens (the recipe's
"x_wgrad" and "dy_wgrad" blocks: 128x1 and 128x128, per tensor the forward's X8 and the
dgrad's dY8). Against the unquantized float64 products the error is the quantization's:
QUANT_TOL, test_fp8_training's (e4m3 about 0.037 relative Frobenius for a product of two
quantized operands, e5m2 x e4m3 about 0.058, allowed 1.5x).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64, assert_gemm_close
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe
from test_fp8_training import QUANT_TOL, rel_err
from test_scaled_ragged_dot import (ACC_TOL, OUT_STEP, XLA_ACC, expand, ragged_k_reference,
                                    reference)

pytestmark = pytest.mark.op("scaled_ragged_dot")

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float32)
SIZES = (0, 3, 7, 1, 20)   # an empty expert, small ones, rows past the sum (M = 40)
M, K, N = 40, 300, 200     # partial 128-blocks along K and N
# Each kernel backend's cases run compiled in the GPU tier; the CPU checks XLA's.
BACKENDS = [b if b == "xla" else pytest.param(b, marks=pytest.mark.slow)
            for b in jaxgemm.backends("scaled_ragged_dot")]


def inputs(rng, dtype=BF16, m=M):
  x = rng.standard_normal((m, K))
  w = rng.standard_normal((len(SIZES), K, N)) / np.sqrt(K)
  dy = rng.standard_normal((m, N))
  return jnp.asarray(x, dtype), jnp.asarray(w, dtype), jnp.asarray(dy, dtype)


def quantized(recipe, a, role):
  """The float64 values of `a` as the recipe quantizes operand `role` ("x", "w", "dy",
  "x_wgrad", "dy_wgrad")."""
  dtype = recipe.grad_dtype if role.startswith("dy") else recipe.dtype
  block = recipe.blocks(role)
  q, s = jaxgemm.quantize(a, dtype, block, scale_dtype=recipe.scale_dtype)
  return as_f64(q) * expand(s.astype(F32), q.shape, block)


def fp8_tolerance(backend) -> float:
  return OUT_STEP[BF16] + (XLA_ACC if backend == "xla" else ACC_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp8", ["tensor", "block"])
def test_forward_dgrad_wgrad_are_the_recipes_gemms(fp8, backend, rng):
  x, w, dy = inputs(rng)
  recipe = Fp8Recipe.named(fp8)
  sizes = jnp.array(SIZES)
  f = jax.jit(lambda x, w: jaxgemm.ragged_dot(x, w, sizes, fp8=fp8, backend=backend))
  y, vjp = jax.vjp(f, x, w)
  dx, dw = jax.jit(vjp)(dy)
  assert (y.dtype, dx.dtype, dw.dtype) == (BF16, BF16, BF16)
  x64, w64, dy64 = quantized(recipe, x, "x"), quantized(recipe, w, "w"), quantized(recipe, dy, "dy")
  assert_gemm_close(y, *reference(x64, w64, SIZES), fp8_tolerance(backend), "forward")
  assert_gemm_close(dx, *reference(dy64, w64.transpose(0, 2, 1), SIZES),
                    fp8_tolerance(backend), "dgrad")
  # The weight gradient: each expert's rows of X'^T @ dY', X and dY quantized along the
  # tokens as the recipe's wgrad blocks say (rows past the groups and the empty expert's
  # give zeros).
  xw64, dyw64 = quantized(recipe, x, "x_wgrad"), quantized(recipe, dy, "dy_wgrad")
  live = np.array(SIZES) > 0
  want, bound = ragged_k_reference(xw64, dyw64, SIZES)
  assert_gemm_close(dw[live], want[live], bound[live], fp8_tolerance(backend), "wgrad")
  assert not np.any(as_f64(dw[~live])), "an empty expert's gradient is zero"
  # And near the unquantized products, within the quantization's error.
  xf, wf, dyf = as_f64(x), as_f64(w), as_f64(dy)
  assert rel_err(y, reference(xf, wf, SIZES)[0]) < QUANT_TOL[recipe.dtype]
  assert rel_err(dx, reference(dyf, wf.transpose(0, 2, 1), SIZES)[0]) < QUANT_TOL[
      recipe.grad_dtype]
  assert rel_err(dw[live], ragged_k_reference(xf, dyf, SIZES)[0][live]) < QUANT_TOL[
      recipe.grad_dtype]


@pytest.mark.parametrize("fp8", ["tensor", "block"])
def test_the_weight_gradient_is_the_fp8_ragged_k_gemm(fp8, rng):
  """jax.grad's program runs three FP8 grouped GEMMs, the wgrad the ragged-K form (no bf16
  ragged_dot left), and its dW is the bf16 gradient's within FP8's error.

  The bound: dW = X^T dY per expert with both operands quantized (e4m3 for both in the
  block recipe, e5m2 dY per tensor): the relative Frobenius error of such a product is
  the quantization's, QUANT_TOL (test_fp8_training's, 1.5x the e4m3 x e4m3 0.037 and
  e5m2 x e4m3 0.058 it measures); the bf16 gradient it is compared with is itself off
  from float64 by a bf16 GEMM's rounding (2**-8 of |X|^T |dY| at most per element),
  which the bound absorbs (< 0.004 against 0.055)."""
  x, w, dy = inputs(rng)
  recipe = Fp8Recipe.named(fp8)
  sizes = jnp.array(SIZES)
  loss = lambda w, fp8: jnp.vdot(
      jaxgemm.ragged_dot(x, w, sizes, fp8=fp8).astype(F32), dy.astype(F32))
  dw8 = jax.jit(jax.grad(loss), static_argnums=1)(w, fp8)
  dw16 = jax.jit(jax.grad(loss), static_argnums=1)(w, None)
  live = np.array(SIZES) > 0
  assert dw8.dtype == BF16
  assert rel_err(dw8[live], as_f64(dw16[live])) < QUANT_TOL[recipe.grad_dtype]
  assert not np.any(as_f64(dw8[~live]))
  found = jaxgemm.problems_in(jax.grad(lambda w: loss(w, fp8)), w)
  assert sorted((p.op, p.mode) for p in found) == [
      ("scaled_ragged_dot", "ragged-K"), ("scaled_ragged_dot", "ragged-M"),
      ("scaled_ragged_dot", "ragged-M")], found
  wgrad = next(p for p in found if p.ragged_contracting)
  assert (wgrad.groups, wgrad.m, wgrad.k, wgrad.n, wgrad.scale_kind) == (
      len(SIZES), M, K, N, recipe.scaling)


def test_each_vmapped_entry_quantizes_alone(rng):
  """vmap over x runs the path per entry: each its own scales (entries 64x apart, so that
  a shared per-tensor scale would show), bit for bit on the CPU."""
  x, w, dy = inputs(rng, m=24)
  xs = jnp.stack([x, 64 * x, x / 64])
  sizes = jnp.array((5, 0, 9, 2, 8))
  f = jax.jit(lambda x: jaxgemm.ragged_dot(x, w, sizes, fp8="tensor", backend="xla"))
  grad = jax.grad(lambda x: f(x).astype(F32).sum())
  out, g = jax.jit(jax.vmap(lambda x: (f(x), grad(x))))(xs)
  for i in range(3):
    np.testing.assert_array_equal(np.asarray(out[i], F32), np.asarray(f(xs[i]), F32))
  np.testing.assert_array_equal(np.asarray(g[1], F32), np.asarray(jax.jit(grad)(xs[1]), F32))


def test_float32_inputs_get_float32_gradients_and_out_dtype_is_the_result(rng):
  x, w, dy = inputs(rng, F32)
  sizes = jnp.array(SIZES)
  y = jax.eval_shape(lambda x, w: jaxgemm.ragged_dot(
      x, w, sizes, preferred_element_type=jnp.bfloat16, fp8="block"), x, w)
  assert y.dtype == BF16
  dx, dw = jax.eval_shape(jax.grad(
      lambda x, w: jaxgemm.ragged_dot(x, w, sizes, fp8="block").sum(), argnums=(0, 1)), x, w)
  assert (dx.dtype, dw.dtype) == (F32, F32)


@pytest.mark.parametrize("call,error,match", [
    (lambda x, w, s: jaxgemm.ragged_dot(x, w, s, fp8="blocks"), ValueError, "fp8='blocks'"),
    (lambda x, w, s: jaxgemm.ragged_dot(x, w, s, "highest", fp8="block"), ValueError,
     "no precision"),
    (lambda x, w, s: jaxgemm.ragged_dot(x.astype(jnp.float8_e4m3fn), w, s, fp8="block"),
     TypeError, "x must be bfloat16, float16 or float32"),
    (lambda x, w, s: jaxgemm.ragged_dot(x[:, :10], w, s, fp8="block"), ValueError,
     "must share K"),
    (lambda x, w, s: jaxgemm.ragged_dot(x, w[0], s, fp8="block"), TypeError,
     r"w must be 3-D \(G, K, N\)"),
    (lambda x, w, s: jaxgemm.ragged_dot(x, w, s.astype(F32), fp8="block"), TypeError,
     "group_sizes must be integers"),
])
def test_bad_arguments_are_named(call, error, match, rng):
  x, w, _ = inputs(rng)
  with pytest.raises(error, match=match):
    call(x, w, jnp.array(SIZES))
