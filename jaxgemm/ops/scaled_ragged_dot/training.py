"""The FP8 training path of grouped GEMMs: `jaxgemm.ragged_dot(x, w, group_sizes, fp8=recipe)`.

As `jaxgemm.matmul(x, w, fp8=)` (`jaxgemm.ops.scaled_matmul.training`, whose `Fp8Recipe`
this takes), every call quantizes its operands on the fly (current scaling: each scale
from the amax of the values at hand) and runs its GEMMs in FP8 through
`scaled_ragged_dot`, for Y = ragged_dot(X, W) with X (M, K) (tokens sorted by expert)
and W (G, K, N):

    forward  Y  = ragged_dot(X8 * sx, W8 * sw)        scaled_ragged_dot(x8, w8, gs, sx, sw)
    dgrad    dX = ragged_dot(dY8 * sdy, (W8 * sw)^T)  scaled_ragged_dot(dy8, w8^T, gs, sdy, sw^T)
    wgrad    dW[g] = (X8' * sx')[rows g]^T @ (dY8' * sdy')[rows g]
                                                      scaled_ragged_dot(x8', dy8', gs, sx', sdy',
                                                        ragged_dot_dimension_numbers=RAGGED_K)

    scaling    X       W (each expert's)   dY      X' (wgrad)   dY' (wgrad)
    "tensor"   one     one                 one     X8, sx       dY8, sdy
    "block"    1x128   128x128             1x128   128x1        128x128

"block" is the DeepSeek-V3 recipe, and `Fp8Recipe.blocks` names the wgrad's blocks as the
dense path's (`jaxgemm.ops.scaled_matmul.training`): the weight gradient contracts the
tokens, so its operands are quantized along them, in blocks of 128 tokens on the global
row grid, which a group's rows need not start on (the ragged-K form walks each group's
rows on that grid, `scaled_ragged_dot`). The dgrad reuses the forward's W8 and its
scales, transposed: a 128x128 block of W is a block of W^T, and a per-tensor scale is
the same. Per tensor the wgrad takes the forward's X8 and the dgrad's dY8 as they are
(no pass of its own); with blocks, X' is quantized in the forward (saved at one byte an
element, where the bf16 wgrad kept X at two) and dY' beside dY8, by `jaxgemm.quantize`
in the (M, K) layout the ragged-K form takes.

Gradients come out in the primals' dtypes, the result in `out_dtype`; group_sizes gets
no gradient (integers). jit, grad (first order: a `jax.custom_vjp`, so forward-mode
`jax.jvp` is not defined) and vmap apply (through `scaled_ragged_dot_p`'s batching
rule, both forms).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm.ops.scaled_matmul.quantize import quantize
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe
from jaxgemm.ops.scaled_ragged_dot.api import RAGGED_K_NUMBERS, scaled_ragged_dot


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


def _wgrad_operand(recipe, a, a8, scale, role: str, dtype: str):
  """(fp8 values, scale) of the weight gradient's operand `role` ("x", "dy") along the
  tokens: per tensor the GEMM's own (a8, scale: one scale holds along any dimension);
  with blocks, `a` quantized in the recipe's wgrad blocks (128 tokens of each column or
  128x128), the scale layouts the ragged-K form takes as they are."""
  if recipe.scaling == "tensor":
    return a8, scale
  return _quantized(recipe, a, role + "_wgrad", dtype)


def _forward(recipe, out_dtype, x, w, group_sizes):
  x8, sx = _quantized(recipe, x, "x", recipe.dtype)
  w8, sw = _quantized(recipe, w, "w", recipe.dtype)   # G is a batch dimension: per expert
  y = scaled_ragged_dot(x8, w8, group_sizes, sx, sw, out_dtype=out_dtype,
                        backend=recipe.backend)
  xw8, sxw = _wgrad_operand(recipe, x, x8, sx, "x", recipe.dtype)
  # The primals' dtypes travel as zero-size arrays: residuals must be arrays.
  return y, (xw8, sxw, w8, sw, group_sizes, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))


def _backward(recipe, out_dtype, saved, dy):
  xw8, sxw, w8, sw, group_sizes, x_dtype, w_dtype = saved
  dy8, sdy = _quantized(recipe, dy, "dy", recipe.grad_dtype)
  sw_t = sw if sw.ndim == 0 else jnp.swapaxes(sw, 1, 2)
  dx = scaled_ragged_dot(dy8, jnp.swapaxes(w8, 1, 2), group_sizes, sdy, sw_t,
                         out_dtype=x_dtype.dtype, backend=recipe.backend)
  # The weight gradient in FP8 too, the ragged-K form: per group, X'^T @ dY' over its rows,
  # partial sums promoted to fp32 every 128 tokens (it had run on the bf16 grouped
  # kernels, at bf16's cost, while scaled_ragged_dot had no ragged-K form).
  dyw8, sdyw = _wgrad_operand(recipe, dy, dy8, sdy, "dy", recipe.grad_dtype)
  dw = scaled_ragged_dot(xw8, dyw8, group_sizes, sxw, sdyw, out_dtype=w_dtype.dtype,
                         ragged_dot_dimension_numbers=RAGGED_K_NUMBERS,
                         backend=recipe.backend)
  return dx, dw, None


_fp8_ragged_dot.defvjp(_forward, _backward)
