"""`glu`: `activation(x @ w_gate + bias_gate) * (x @ w_up + bias_up)` as one dual-GEMM kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgemm import collective_matmul, gemm
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.api import check_activation_dtype, check_epilogue
from jaxgemm.ops.glu.primitive import bind
from jaxgemm.ops.glu.problem import GluProblem


def reference(x, w_gate, w_up, activation, bias_gate, bias_up, **matmul_kwargs):
  """The jnp expression glu computes (what backend="auto" falls back to)."""
  zg, zu = jnp.matmul(x, w_gate, **matmul_kwargs), jnp.matmul(x, w_up, **matmul_kwargs)
  zg = zg if bias_gate is None else zg + bias_gate
  zu = zu if bias_up is None else zu + bias_up
  return activations.apply(activation, zg) * zu


def glu(x, w_gate, w_up, *, activation: str = "silu", bias_gate=None, bias_up=None,
        precision=None, preferred_element_type=None, backend: str = "auto",
        variant: str | None = None, config=None, overlap: bool | None = None) -> jax.Array:
  """A gated linear unit in one kernel: `activation(x @ w_gate + bias_gate) * (x @ w_up + bias_up)`.

  SwiGLU is activation="silu" (the default), GeGLU "gelu". Each tile of x is
  read once for both products, and the gate is applied to the two fp32
  accumulators before the one store.

  Args:
    x: (..., M, K). w_gate, w_up: (K, N), or batched (..., K, N), the same shape.
    activation: one of "relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh" (jax.nn's).
    bias_gate, bias_up: None or shape (N,) in the result's dtype (one alone: the
      other is zero).
    precision, preferred_element_type, backend, variant, config, overlap: as for
      `jaxgemm.matmul`; variants are `jaxgemm.variants(backend, "glu")`. With
      overlap=True on a mesh, x gathered on its rows runs as a ring of chunks, each
      chunk's GLU one kernel (`jaxgemm.collective_matmul`).

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> x, wg, wu = jnp.ones((4, 8)), jnp.ones((8, 16)), jnp.ones((8, 16))
    >>> jaxgemm.glu(x, wg, wu, backend="xla").shape
    (4, 16)
  """
  x, w_gate, w_up = jnp.asarray(x), jnp.asarray(w_gate), jnp.asarray(w_up)
  activations.check(activation, allow_none=False)
  collective_matmul.check_overlap(overlap)
  if w_gate.shape != w_up.shape:
    raise ValueError(f"w_up must have w_gate's shape {w_gate.shape}; got w_up.shape={w_up.shape}")
  if x.ndim < 1 or w_gate.ndim < 2:
    raise ValueError(f"glu takes x of ndim >= 1 and weights of ndim >= 2; got x.shape={x.shape}, "
                     f"w_gate.shape={w_gate.shape}")
  dtype, out_dtype = gemm.matmul_dtypes(x, w_gate, preferred_element_type)
  check_activation_dtype(activation, out_dtype, "glu")
  if jnp.result_type(w_up) != jnp.result_type(w_gate):
    raise TypeError(f"w_up must have w_gate's dtype {w_gate.dtype}; got {w_up.dtype}")
  layout = gemm.canonical_layout(x, w_gate, "glu")
  for name, bias in (("bias_gate", bias_gate), ("bias_up", bias_up)):
    try:
      check_epilogue(layout.out_shape, out_dtype, None if bias is None else jnp.asarray(bias),
                     None, None)
    except (ValueError, TypeError) as e:
      raise type(e)(str(e).replace("bias", name, 1)) from None
  problem, why_not = gemm.gemm_problem(layout.batch, layout.rows, layout.n, layout.k, dtype,
                                       out_dtype, False, False, precision)
  has_bias = bias_gate is not None or bias_up is not None
  if problem is not None:
    problem = GluProblem(**{f: getattr(problem, f) for f in problem.__dataclass_fields__},
                         activation=activation, bias="shared" if has_bias else None)
  params = gemm.kernel_params(problem, backend, variant, config, why_not)
  if params is None:
    return reference(x, w_gate, w_up, activation, bias_gate, bias_up, precision=precision,
                     preferred_element_type=preferred_element_type)
  x2 = x[None] if x.ndim == 1 else x
  layout2 = gemm.canonical_layout(x2, w_gate, "glu")
  x3, wg3 = layout2.operands(x2.astype(dtype), w_gate.astype(dtype))
  _, wu3 = layout2.operands(x2.astype(dtype), w_up.astype(dtype))
  biases = []
  if has_bias:
    zero = jnp.zeros((layout.n,), out_dtype)
    biases = [zero if b is None else jnp.asarray(b) for b in (bias_gate, bias_up)]
  (h,) = bind(x3, wg3, wu3, *biases, ndims=layout2.ndims, out_dtype=out_dtype,
              acc_dtype=problem.acc_dtype, precision=problem.precision, activation=activation,
              bias="shared" if has_bias else None, overlap=overlap, **params)
  return h.reshape(layout.out_shape)
