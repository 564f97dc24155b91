"""`matmul` with an epilogue: `activation(a @ b + bias) + residual` in one kernel.

`jaxgemm.matmul(a, b, bias=..., activation=..., residual=...)` lands here
(`jaxgemm.ops.router`). The operands take matmul's canonical layout
(`jaxgemm.gemm.canonical_layout`),
the epilogue's arguments are checked against it, and the call binds
`fused_matmul_p`; what the kernels do not take (integer operands, a
precision they do not know, out_sharding) goes to the jnp expression under
backend="auto" and raises for a named backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import collective_matmul, gemm, sharding
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.primitive import bind
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem


def reference(a, b, bias, activation, residual, **matmul_kwargs):
  """The jnp expression fused_matmul computes (what backend="auto" falls back to)."""
  return reference_epilogue(jnp.matmul(a, b, **matmul_kwargs), bias, activation, residual)


def reference_epilogue(y, bias, activation, residual):
  """`activation(y + bias) + residual` in XLA ops (None: left out)."""
  if bias is not None:
    y = y + bias
  y = activations.apply(activation, y)
  return y if residual is None else y + residual


def check_epilogue(out_shape, out_dtype, bias, activation, residual, *, has_n=True) -> None:
  """ValueError/TypeError naming the argument that does not fit the result."""
  activations.check(activation)
  n = out_shape[-1] if out_shape else None
  if bias is not None:
    if not has_n:
      raise ValueError(f"bias needs b with a column dimension (b.ndim >= 2): a @ b of a 1-D b "
                       f"has no N for bias.shape={jnp.shape(bias)} to run along")
    if jnp.shape(bias) != (n,):
      raise ValueError(f"bias must have shape (N,) = ({n},), the result's last dimension "
                       f"(result shape {out_shape}); got bias.shape={jnp.shape(bias)}")
    if jnp.result_type(bias) != out_dtype:
      raise TypeError(f"bias must be in the result's dtype {out_dtype.name}; got "
                      f"bias.dtype={jnp.result_type(bias).name} (cast it with .astype)")
  if residual is not None:
    if jnp.shape(residual) != tuple(out_shape):
      raise ValueError(f"residual must have the result's shape {tuple(out_shape)}; got "
                       f"residual.shape={jnp.shape(residual)}")
    if jnp.result_type(residual) != out_dtype:
      raise TypeError(f"residual must be in the result's dtype {out_dtype.name}; got "
                      f"residual.dtype={jnp.result_type(residual).name}")


def check_activation_dtype(activation, out_dtype, api_name: str) -> None:
  """The TypeError the jnp expression raises where `activation` cannot take the result's
  dtype (`jax.nn.silu` and `sigmoid` refuse integers), up front and naming what works.

  >>> import numpy as np
  >>> check_activation_dtype("relu", np.dtype("int32"), "glu")   # relu takes integers
  """
  def refusal(name):   # jax.nn's TypeError for `name` on out_dtype, or None
    try:
      jax.eval_shape(lambda z: activations.apply(name, z), jax.ShapeDtypeStruct((), out_dtype))
    except TypeError as e:
      return e
    return None

  if activation is None or jnp.issubdtype(out_dtype, jnp.inexact):   # jax.nn takes these
    return
  if (error := refusal(activation)) is None:
    return
  working = [name for name in activations.ACTIVATIONS if refusal(name) is None]
  raise TypeError(
      f"{api_name}: activation={activation!r} does not take the result's dtype "
      f"{np.dtype(out_dtype).name}, and neither does the jnp expression "
      f"({str(error).rstrip('.')}). Pass floating operands or "
      f"preferred_element_type=jnp.float32, or one of the activations that take "
      f"{np.dtype(out_dtype).name}: {working}")


def fused_matmul(a, b, *, bias=None, activation=None, residual=None, precision=None,
                 preferred_element_type=None, out_sharding=None, backend="auto", variant=None,
                 config=None, overlap=None) -> jax.Array:
  """`activation(a @ b + bias) + residual`, one kernel (see `jaxgemm.matmul`; with
  overlap=True on a mesh, each chunk of a ring is one such kernel).

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> x, w = jnp.ones((2, 4, 8)), jnp.ones((8, 16))
    >>> y = jaxgemm.matmul(x, w, bias=jnp.ones(16), activation="relu", backend="xla")
    >>> y.shape, float(y[0, 0, 0])
    ((2, 4, 16), 9.0)
  """
  collective_matmul.check_overlap(overlap)
  dtype, out_dtype = gemm.matmul_dtypes(a, b, preferred_element_type)
  check_activation_dtype(activation, out_dtype, "matmul")
  layout = gemm.canonical_layout(a, b)
  bias = None if bias is None else jnp.asarray(bias)
  residual = None if residual is None else jnp.asarray(residual)
  check_epilogue(layout.out_shape, out_dtype, bias, activation, residual,
                 has_n=bool(layout.n_dims))
  problem, why_not = gemm.gemm_problem(layout.batch, layout.rows, layout.n, layout.k, dtype,
                                       out_dtype, False, False, precision)
  if out_sharding is not None:
    problem, why_not = None, "out_sharding is not supported with an epilogue"
  jnp_kwargs = dict(precision=precision, preferred_element_type=preferred_element_type,
                    out_sharding=sharding.canonical_out_sharding(out_sharding, "matmul"))
  if problem is not None:
    problem = FusedMatmulProblem(
        **{f: getattr(problem, f) for f in problem.__dataclass_fields__},
        activation=activation, bias="shared" if bias is not None else None,
        residual=residual is not None)
  params = gemm.kernel_params(problem, backend, variant, config, why_not)
  if params is None:
    return reference(a, b, bias, activation, residual, **jnp_kwargs)

  # A 1-D operand has no M (N) dimension; the kernels want one of each.
  a2 = a[None] if a.ndim == 1 else a
  b2 = b[:, None] if b.ndim == 1 else b
  layout2 = gemm.canonical_layout(a2, b2)
  a3, b3 = layout2.operands(a2.astype(dtype), b2.astype(dtype))
  extras = [x for x in (bias, None if residual is None else residual.reshape(layout2.out_shape))
            if x is not None]
  (y,) = bind(a3, b3, *extras, ndims=layout2.ndims, out_dtype=out_dtype,
              acc_dtype=problem.acc_dtype, precision=problem.precision,
              activation=activation, bias="shared" if bias is not None else None,
              residual=residual is not None, overlap=overlap, **params)
  return y.reshape(layout.out_shape)
