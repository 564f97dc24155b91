"""`matmul_p`: the one JAX primitive every jaxgemm GEMM goes through.

Canonical form: a batched product of 3-D operands with a transpose flag each,

    a: (B, M, K), or (B, K, M) with trans_a
    b: (B, K, N), or (B, N, K) with trans_b
    c: (B, M, N) = op(a) @ op(b) in out_dtype, accumulated in acc_dtype,

so `A^T B` and `A B^T` (the backward GEMMs) run without materialized
transposes. Params also carry `precision` and the static kernel choice
(`backend`, and `variant`/`config`, where None means "the backend's default
for this shape"), which every rule below passes on: the gradient of a Triton
GEMM is two Triton GEMMs, each with tiles chosen for its own shape.

Rules: abstract eval (shape and dtype checks), a lowering per platform (the
backend's GPU kernel on `cuda`, its interpreter on `cpu`), a batching rule and
the bilinear JVP/transpose rules. With those, jit, grad, vjp, jvp, linearize,
vmap, hessian and their compositions all work.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxgemm import dispatch, registry
from jaxgemm.ops.base import Op, normal_operands
from jaxgemm.ops.matmul.problem import GemmProblem

matmul_p = Primitive("jaxgemm_matmul")


def problem_of(a_aval, b_aval, *, trans_a, trans_b, out_dtype, acc_dtype,
               precision, **_) -> GemmProblem:
  """The GemmProblem that `matmul_p.bind(a, b, **params)` computes."""
  for name, aval in (("a", a_aval), ("b", b_aval)):
    if len(aval.shape) != 3:
      raise TypeError(f"matmul_p takes 3-D (B, rows, cols) operands; "
                      f"{name}.shape={aval.shape}")
  if a_aval.dtype != b_aval.dtype:
    raise TypeError(f"matmul_p operands must share a dtype; got "
                    f"a.dtype={a_aval.dtype}, b.dtype={b_aval.dtype}")
  batch, *a_rows_cols = a_aval.shape
  b_batch, *b_rows_cols = b_aval.shape
  k_a, m = a_rows_cols if trans_a else a_rows_cols[::-1]
  n, k_b = b_rows_cols if trans_b else b_rows_cols[::-1]
  if batch != b_batch:
    raise TypeError(f"matmul_p batch sizes differ: a.shape={a_aval.shape}, "
                    f"b.shape={b_aval.shape}")
  if k_a != k_b:
    raise TypeError(f"matmul_p contracting sizes differ: a.shape={a_aval.shape} "
                    f"(trans_a={trans_a}) has K={k_a}, b.shape={b_aval.shape} "
                    f"(trans_b={trans_b}) has K={k_b}")
  return GemmProblem(batch, m, n, k_a, np.dtype(a_aval.dtype), np.dtype(out_dtype),
                     np.dtype(acc_dtype), trans_a, trans_b, precision)


def bind(a, b, *, trans_a=False, trans_b=False, out_dtype, acc_dtype,
         precision, backend, variant, config):
  return matmul_p.bind(a, b, trans_a=trans_a, trans_b=trans_b,
                       out_dtype=np.dtype(out_dtype), acc_dtype=np.dtype(acc_dtype),
                       precision=precision, backend=backend, variant=variant,
                       config=config)


def resolve_kernel(problem: GemmProblem, params, platform: str | None = None) -> dispatch.Choice:
  """The kernel that runs `problem`: the params' choice, completed per problem.

  variant=None and config=None (and backend="auto") are resolved here, by
  `jaxgemm.dispatch.choose`, so that each GEMM of a gradient gets the kernel
  and tiles that suit its own shape.
  """
  return dispatch.choose(problem, params["backend"], params["variant"], params["config"],
                         platform=platform)


def _lower_choice(ctx, a, b, problem, choice: dispatch.Choice, platform):
  backend = registry.get_backend(choice.backend, problem.op)
  impl = backend.impl(problem, choice.variant, choice.config, platform)
  return mlir.lower_fun(impl, multiple_results=False)(ctx, a, b)


def _abstract_eval(a, b, **params):
  problem = problem_of(a, b, **params)
  return jax.core.ShapedArray(problem.out_shape, problem.out_dtype)


def _lowering(ctx, a, b, *, platform, **params):
  a_aval, b_aval = ctx.avals_in
  problem = problem_of(a_aval, b_aval, **params)
  if problem.is_empty:
    # No kernel for an empty product: K=0 sums nothing, so the answer is zeros.
    impl = lambda a, b: jnp.zeros(problem.out_shape, problem.out_dtype)
    return mlir.lower_fun(impl, multiple_results=False)(ctx, a, b)
  choice = resolve_kernel(problem, params, platform)
  if params["backend"] != dispatch.AUTO or choice.backend == dispatch.FALLBACK:
    return _lower_choice(ctx, a, b, problem, choice, platform)
  try:
    # A kernel is compiled while it is lowered (Triton, Mosaic GPU), before
    # its launch is emitted, so a failure here leaves no launch behind.
    return _lower_choice(ctx, a, b, problem, choice, platform)
  except Exception as e:  # noqa: BLE001 (auto must compute what jnp.matmul computes)
    return _lower_choice(ctx, a, b, problem, dispatch.fall_back(problem, choice, e, platform),
                         platform)


def _impl(*args, **params):
  # Eager calls compile the primitive alone, like any jax.lax op does.
  from jax._src import dispatch  # noqa: PLC0415 (the standard eager path for primitives)
  return dispatch.apply_primitive(matmul_p, *args, **params)


# ---------------------------------------------------------------- autodiff
#
# C = op_a(A) op_b(B). With dC the cotangent of C:
#   d op_a(A) = dC op_b(B)^T      d op_b(B) = op_a(A)^T dC
# and each is again a matmul_p, choosing transpose flags so that A, B and dC
# are read in the layout they are stored in. The backward GEMMs run in the
# operands' dtype (a cotangent in a wider out_dtype is rounded to it first,
# keeping 16-bit backward GEMMs on tensor cores), accumulate in acc_dtype with
# the forward's precision and kernel choice, and return the primal's dtype.

def _backward(x_aval, params, lhs, rhs, trans_lhs, trans_rhs):
  return bind(lhs, rhs, trans_a=trans_lhs, trans_b=trans_rhs,
              out_dtype=x_aval.dtype, acc_dtype=params["acc_dtype"],
              precision=params["precision"], backend=params["backend"],
              variant=params["variant"], config=params["config"])


def _transpose_lhs(ct, a, b, *, trans_a, trans_b, **params):
  ct = ct.astype(b.dtype)
  if trans_a:  # a stored (K, M): dA = op_b(B) dC^T
    return _backward(a.aval, params, b, ct, trans_b, True)
  return _backward(a.aval, params, ct, b, False, not trans_b)


def _transpose_rhs(ct, a, b, *, trans_a, trans_b, **params):
  ct = ct.astype(a.dtype)
  if trans_b:  # b stored (N, K): dB = dC^T op_a(A)
    return _backward(b.aval, params, ct, a, True, trans_a)
  return _backward(b.aval, params, a, ct, not trans_a, False)


# ---------------------------------------------------------------- batching

def _batch_rule(args, dims, *, trans_a, trans_b, **params):
  """vmap: fold the mapped axis into B, or into M (N) when only a (b) is mapped.

  Folding into M or N reuses the unmapped operand instead of broadcasting it.
  """
  a, b = args
  da, db = dims
  bind_ = functools.partial(bind, **params)
  if da is not None and db is not None:
    a, b = jnp.moveaxis(a, da, 0), jnp.moveaxis(b, db, 0)
    v, batch = a.shape[:2]
    # Explicit sizes, not -1: any of them may be 0 (vmap over an empty axis).
    out = bind_(a.reshape(v * batch, *a.shape[2:]), b.reshape(v * batch, *b.shape[2:]),
                trans_a=trans_a, trans_b=trans_b)
    return out.reshape(v, batch, *out.shape[1:]), 0
  if da is not None:
    # Put the mapped axis right before M in a's storage, then merge the two.
    m_axis = 2 if trans_a else 1
    a = jnp.moveaxis(a, da, m_axis)
    v, m = a.shape[m_axis:m_axis + 2]
    a = a.reshape(*a.shape[:m_axis], v * m, *a.shape[m_axis + 2:])
    out = bind_(a, b, trans_a=trans_a, trans_b=trans_b)   # (B, V*M, N)
    return out.reshape(out.shape[0], v, m, out.shape[2]), 1
  n_axis = 1 if trans_b else 2
  b = jnp.moveaxis(b, db, n_axis)
  v, n = b.shape[n_axis:n_axis + 2]
  b = b.reshape(*b.shape[:n_axis], v * n, *b.shape[n_axis + 2:])
  out = bind_(a, b, trans_a=trans_a, trans_b=trans_b)     # (B, M, V*N)
  return out.reshape(*out.shape[:2], v, n), 2


matmul_p.def_impl(_impl)
matmul_p.def_abstract_eval(_abstract_eval)
ad.defbilinear(matmul_p, _transpose_lhs, _transpose_rhs)
batching.primitive_batchers[matmul_p] = _batch_rule
for _platform in ("cuda", "cpu"):
  mlir.register_lowering(matmul_p, functools.partial(_lowering, platform=_platform),
                         platform=_platform)


def _call(problem: GemmProblem, a, b, *, backend, variant, config):
  return bind(a, b, trans_a=problem.trans_a, trans_b=problem.trans_b,
              out_dtype=problem.out_dtype, acc_dtype=problem.acc_dtype,
              precision=problem.precision, backend=backend, variant=variant, config=config)


MATMUL = registry.register_op(Op(
    name="matmul",
    primitive=matmul_p,
    arity=2,
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=lambda p, key: normal_operands(
        [(p.a_shape, p.dtype), (p.b_shape, p.dtype)], key),
))
