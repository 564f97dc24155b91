"""The FP8 training path of grouped GEMMs: `jaxgemm.ragged_dot(x, w, group_sizes, fp8=recipe)`.

As `jaxgemm.matmul(x, w, fp8=)` (`jaxgemm.ops.scaled_matmul.training`, whose `Fp8Recipe`
this takes), every call quantizes its operands on the fly (current scaling: each scale
from the amax of the values at hand) and runs its GEMMs in FP8 through
`scaled_ragged_dot`, for Y = ragged_dot(X, W) with X (M, K) (tokens sorted by expert)
and W (G, K, N):

    forward  Y  = ragged_dot(X8 * sx, W8 * sw)        scaled_ragged_dot(x8, w8, gs, sx, sw)
    dgrad    dX = ragged_dot(dY8 * sdy, (W8 * sw)^T)  scaled_ragged_dot(dy8, w8^T, gs, sdy, sw^T)
    wgrad    dW[g] = X[rows g]^T @ dY[rows g]         jaxgemm.ragged_dot_general, in X's dtype

    scaling    X       W (each expert's)   dY
    "tensor"   one     one                 one
    "block"    1x128   128x128             1x128   (the DeepSeek-V3 recipe)

The dgrad reuses the forward's W8 and its scales, transposed: a 128x128 block of W is a
block of W^T, and a per-tensor scale is the same. The weight gradient is a grouped GEMM
contracting each expert's rows (ragged K); its FP8 form (`scaled_ragged_dot` has the
ragged-M form only) is still to come (issue 45), so it runs on jaxgemm's bf16 grouped
kernels from the saved X and the incoming dY, and that GEMM costs what bf16 training's
does.

Gradients come out in the primals' dtypes, the result in `out_dtype`; group_sizes gets
no gradient (integers). jit, grad (first order: a `jax.custom_vjp`, so forward-mode
`jax.jvp` is not defined) and vmap apply (through `scaled_ragged_dot_p`'s and
`ragged_dot_p`'s batching rules).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm.ops.ragged_dot.api import ragged_dot_general
from jaxgemm.ops.scaled_matmul.quantize import quantize
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe
from jaxgemm.ops.scaled_ragged_dot.api import scaled_ragged_dot

# dW[g] = X[rows g]^T @ dY[rows g]: lhs X (M, K) ragged in M, M contracted with dY (M, N).
WGRAD_NUMBERS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[])


def fp8_ragged_dot(x, w, group_sizes, recipe, out_dtype=None) -> jax.Array:
  """`ragged_dot(x, w, group_sizes)` whose GEMMs run in FP8 (module docstring).

  Args:
    x: (M, K) floating, rows sorted by group; w: (G, K, N) floating.
    group_sizes: (G,) integers.
    recipe: an `Fp8Recipe`, or "tensor" / "block" (`Fp8Recipe.named`).
    out_dtype: the result's dtype (default: x and w promoted, as lax.ragged_dot's).

  >>> import jax, jax.numpy as jnp, jaxgemm
  >>> x = jnp.ones((6, 256), jnp.bfloat16); w = jnp.ones((2, 256, 8), jnp.bfloat16)
  >>> y = jaxgemm.ragged_dot(x, w, jnp.array([2, 3]), fp8="block")  # row 5: no group
  >>> y[:, 0].tolist()
  [256.0, 256.0, 256.0, 256.0, 256.0, 0.0]
  >>> dw = jax.grad(lambda w: jaxgemm.ragged_dot(x, w, jnp.array([2, 3]), fp8="block")
  ...               .astype(jnp.float32).sum())(w)
  >>> dw[:, 0, 0].tolist()                   # each expert's rows
  [2.0, 3.0]
  """
  recipe = Fp8Recipe.named(recipe)
  x, w, group_sizes = jnp.asarray(x), jnp.asarray(w), jnp.asarray(group_sizes)
  for name, a, ndim, shape in (("x", x, 2, "(M, K)"), ("w", w, 3, "(G, K, N)")):
    if a.ndim != ndim:
      raise TypeError(f"ragged_dot(fp8=): {name} must be {ndim}-D {shape}; got "
                      f"{name}.shape={a.shape}")
    if not jnp.issubdtype(a.dtype, jnp.floating) or np.dtype(a.dtype).itemsize == 1:
      raise TypeError(f"ragged_dot(fp8=) quantizes its operands itself: {name} must be "
                      f"bfloat16, float16 or float32; got {name}.dtype={a.dtype}")
  if x.shape[1] != w.shape[1]:
    raise ValueError(f"ragged_dot(fp8=): x (M, K) and w (G, K, N) must share K; got "
                     f"x.shape={x.shape}, w.shape={w.shape}")
  if group_sizes.shape != (w.shape[0],) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"ragged_dot(fp8=): group_sizes must be integers of shape (G,) = "
                    f"({w.shape[0]},); got {group_sizes.dtype} {group_sizes.shape}")
  out_dtype = np.dtype(out_dtype or jnp.promote_types(x.dtype, w.dtype))
  return _fp8_ragged_dot(recipe, out_dtype, x, w, group_sizes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fp8_ragged_dot(recipe, out_dtype, x, w, group_sizes):
  return _forward(recipe, out_dtype, x, w, group_sizes)[0]


def _quantized(recipe, a, role: str, dtype: str):
  return quantize(a, dtype, recipe.blocks(role), scale_dtype=recipe.scale_dtype)


def _forward(recipe, out_dtype, x, w, group_sizes):
  x8, sx = _quantized(recipe, x, "x", recipe.dtype)
  w8, sw = _quantized(recipe, w, "w", recipe.dtype)   # G is a batch dimension: per expert
  y = scaled_ragged_dot(x8, w8, group_sizes, sx, sw, out_dtype=out_dtype,
                        backend=recipe.backend)
  # W's dtype travels as a zero-size array: residuals must be arrays.
  return y, (x, w8, sw, group_sizes, jnp.zeros((0,), w.dtype))


def _backward(recipe, out_dtype, saved, dy):
  x, w8, sw, group_sizes, w_dtype = saved
  dy8, sdy = _quantized(recipe, dy, "dy", recipe.grad_dtype)
  sw_t = sw if sw.ndim == 0 else jnp.swapaxes(sw, 1, 2)
  dx = scaled_ragged_dot(dy8, jnp.swapaxes(w8, 1, 2), group_sizes, sdy, sw_t,
                         out_dtype=x.dtype, backend=recipe.backend)
  dw = ragged_dot_general(x, dy.astype(x.dtype), group_sizes, WGRAD_NUMBERS,
                          preferred_element_type=w_dtype.dtype, backend=recipe.backend)
  return dx, dw, None


_fp8_ragged_dot.defvjp(_forward, _backward)
