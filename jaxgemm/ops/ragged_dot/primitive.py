"""`ragged_dot_p`: the primitive of the grouped GEMM, with its rules.

Canonical form (`RaggedDotProblem` has the shapes): lhs (B, M, K), whose M rows
fall into G contiguous groups of `group_sizes` (B, G) rows, and

* ragged-M (`ragged_contracting=False`): rhs (B, G, K, N), or (B, G, N, K)
  with `trans_rhs`; out (B, M, N), each group's rows times its group's rhs,
  rows past sum(group_sizes) zero;
* ragged-K (`ragged_contracting=True`): rhs (B, M, N); out (B, G, K, N), the
  sum over each group's rows of lhs^T rhs.

The two modes are each other's gradients, so every transformation closes over
this one primitive (C = out, dC its cotangent, rows(g) the rows of group g):

    ragged-M   C[rows g] = A[rows g] @ W[g]:
               dA = ragged-M(dC, W, trans_rhs=not trans_rhs)     (dC @ W[g]^T)
               dW = ragged-K(A, dC)  (or ragged-K(dC, A) for a stored W^T)
    ragged-K   C[g] = A[rows g]^T @ D[rows g]:
               dA = ragged-M(D, dC, trans_rhs=True)               (D @ dC[g]^T)
               dD = ragged-M(A, dC)

Each backward GEMM carries the forward's kernel choice and is resolved at
lowering for its own shape, as matmul_p's are. `group_sizes` is an integer
operand: no tangent, no cotangent, and (a device array) no recompile when it
changes. vmap folds the mapped axis into B.
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
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem

ragged_dot_p = Primitive("jaxgemm_ragged_dot")


def problem_of(lhs, rhs, group_sizes, *, ragged_contracting, trans_rhs, out_dtype, acc_dtype,
               precision, **_) -> RaggedDotProblem:
  """The RaggedDotProblem that `ragged_dot_p.bind(lhs, rhs, group_sizes, **params)` computes."""
  if len(lhs.shape) != 3:
    raise TypeError(f"ragged_dot_p takes lhs of shape (B, M, K); lhs.shape={lhs.shape}")
  batch, m, k = lhs.shape
  if len(group_sizes.shape) != 2 or group_sizes.shape[0] != batch:
    raise TypeError(f"ragged_dot_p takes group_sizes of shape (B, G) with B={batch}; "
                    f"group_sizes.shape={group_sizes.shape}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"ragged_dot_p's group_sizes must be integers, got {group_sizes.dtype}")
  if lhs.dtype != rhs.dtype:
    raise TypeError(f"ragged_dot_p operands must share a dtype; got lhs.dtype={lhs.dtype}, "
                    f"rhs.dtype={rhs.dtype}")
  groups = group_sizes.shape[1]
  if ragged_contracting:
    n = rhs.shape[-1]
    expected = (batch, m, n)
  else:
    n = rhs.shape[-2] if trans_rhs else rhs.shape[-1]
    expected = (batch, groups, n, k) if trans_rhs else (batch, groups, k, n)
  if tuple(rhs.shape) != expected:
    raise TypeError(f"ragged_dot_p: rhs.shape={rhs.shape} does not fit lhs.shape={lhs.shape} "
                    f"and group_sizes.shape={group_sizes.shape}: expected {expected} "
                    f"({ragged_contracting=}, {trans_rhs=})")
  return RaggedDotProblem(batch, groups, m, k, n, np.dtype(lhs.dtype), np.dtype(out_dtype),
                          np.dtype(acc_dtype), trans_rhs, ragged_contracting, precision)


def bind(lhs, rhs, group_sizes, *, ragged_contracting=False, trans_rhs=False, out_dtype,
         acc_dtype, precision, backend, variant, config):
  """ragged_dot_p.bind with every param (group sizes as int32)."""
  return ragged_dot_p.bind(lhs, rhs, group_sizes.astype(jnp.int32),
                           ragged_contracting=bool(ragged_contracting),
                           trans_rhs=bool(trans_rhs), out_dtype=np.dtype(out_dtype),
                           acc_dtype=np.dtype(acc_dtype), precision=precision,
                           backend=backend, variant=variant, config=config)


def _abstract_eval(lhs, rhs, group_sizes, **params):
  problem = problem_of(lhs, rhs, group_sizes, **params)
  return jax.core.ShapedArray(problem.out_shape, problem.out_dtype)


def _lower_choice(ctx, args, problem, choice: dispatch.Choice, platform):
  impl = registry.get_backend(choice.backend, problem.op).impl(
      problem, choice.variant, choice.config, platform)
  return mlir.lower_fun(impl, multiple_results=False)(ctx, *args)


def _lowering(ctx, lhs, rhs, group_sizes, *, platform, **params):
  problem = problem_of(*ctx.avals_in, **params)
  if problem.is_empty:
    impl = lambda *_: jnp.zeros(problem.out_shape, problem.out_dtype)
    return mlir.lower_fun(impl, multiple_results=False)(ctx, lhs, rhs, group_sizes)
  args = (lhs, rhs, group_sizes)
  choice = dispatch.choose(problem, params["backend"], params["variant"], params["config"],
                           platform=platform)
  if params["backend"] != dispatch.AUTO or choice.backend == dispatch.FALLBACK:
    return _lower_choice(ctx, args, problem, choice, platform)
  try:
    return _lower_choice(ctx, args, problem, choice, platform)
  except Exception as e:  # noqa: BLE001 (auto must compute what lax.ragged_dot computes)
    return _lower_choice(ctx, args, problem,
                         dispatch.fall_back(problem, choice, e, platform), platform)


def _impl(*args, **params):
  from jax._src import dispatch as jax_dispatch  # noqa: PLC0415 (eager path for primitives)
  return jax_dispatch.apply_primitive(ragged_dot_p, *args, **params)


# ---------------------------------------------------------------- autodiff

def _backward(primal_aval, params, lhs, rhs, group_sizes, *, ragged_contracting, trans_rhs):
  """A backward GEMM: in the primal's dtype, with the forward's precision and kernel choice."""
  return bind(lhs.astype(primal_aval.dtype), rhs.astype(primal_aval.dtype), group_sizes,
              ragged_contracting=ragged_contracting, trans_rhs=trans_rhs,
              out_dtype=primal_aval.dtype, acc_dtype=params["acc_dtype"],
              precision=params["precision"], backend=params["backend"],
              variant=params["variant"], config=params["config"])


def _jvp(primals, tangents, **params):
  lhs, rhs, group_sizes = primals
  d_lhs, d_rhs, _ = tangents
  out = ragged_dot_p.bind(lhs, rhs, group_sizes, **params)
  terms = []
  if type(d_lhs) is not ad.Zero:
    terms.append(ragged_dot_p.bind(d_lhs, rhs, group_sizes, **params))
  if type(d_rhs) is not ad.Zero:
    terms.append(ragged_dot_p.bind(lhs, d_rhs, group_sizes, **params))
  if not terms:
    return out, ad.Zero.from_primal_value(out)
  return out, functools.reduce(jnp.add, terms)


def _transpose(ct, lhs, rhs, group_sizes, *, ragged_contracting, trans_rhs, **params):
  if ad.is_undefined_primal(group_sizes):
    raise TypeError("ragged_dot_p is not linear in group_sizes")
  if type(ct) is ad.Zero:
    return [None, None, None]
  lhs_aval = lhs.aval if ad.is_undefined_primal(lhs) else jax.typeof(lhs)
  rhs_aval = rhs.aval if ad.is_undefined_primal(rhs) else jax.typeof(rhs)
  back = functools.partial(_backward, params=params, group_sizes=group_sizes)
  d_lhs = d_rhs = None
  if ragged_contracting:          # C[g] = A[rows g]^T D[rows g]
    if ad.is_undefined_primal(lhs):
      d_lhs = back(lhs_aval, lhs=rhs, rhs=ct, ragged_contracting=False, trans_rhs=True)
    if ad.is_undefined_primal(rhs):
      d_rhs = back(rhs_aval, lhs=lhs, rhs=ct, ragged_contracting=False, trans_rhs=False)
  else:                           # C[rows g] = A[rows g] op(W[g])
    if ad.is_undefined_primal(lhs):
      d_lhs = back(lhs_aval, lhs=ct, rhs=rhs, ragged_contracting=False,
                   trans_rhs=not trans_rhs)
    if ad.is_undefined_primal(rhs):
      a, d = (ct, lhs) if trans_rhs else (lhs, ct)
      d_rhs = back(rhs_aval, lhs=a, rhs=d, ragged_contracting=True, trans_rhs=False)
  return [d_lhs, d_rhs, None]


# ---------------------------------------------------------------- batching

def _batch_rule(args, dims, **params):
  """vmap: the mapped axis joins B (an operand not mapped is broadcast to it: the one copy)."""
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  moved = []
  for x, d in zip(args, dims):
    x = (jnp.broadcast_to(x, (size, *x.shape)) if d is None
         else jnp.moveaxis(x, d, 0))
    moved.append(x.reshape(size * x.shape[1], *x.shape[2:]))
  out = ragged_dot_p.bind(*moved, **params)
  return out.reshape(size, -1, *out.shape[1:]), 0


ragged_dot_p.def_impl(_impl)
ragged_dot_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[ragged_dot_p] = _jvp
ad.primitive_transposes[ragged_dot_p] = _transpose
batching.primitive_batchers[ragged_dot_p] = _batch_rule
for _platform in ("cuda", "cpu"):
  mlir.register_lowering(ragged_dot_p, functools.partial(_lowering, platform=_platform),
                         platform=_platform)


def _call(problem: RaggedDotProblem, lhs, rhs, group_sizes, *, backend, variant, config):
  return bind(lhs, rhs, group_sizes, ragged_contracting=problem.ragged_contracting,
              trans_rhs=problem.trans_rhs, out_dtype=problem.out_dtype,
              acc_dtype=problem.acc_dtype, precision=problem.precision, backend=backend,
              variant=variant, config=config)


def example_group_sizes(problem: RaggedDotProblem, key) -> jax.Array:
  """(B, G) random group sizes summing to M: a Dirichlet(2) split of the rows, the
  routing of a trained mixture-of-experts router (uneven, rarely empty)."""
  shares = jax.random.dirichlet(key, jnp.full((problem.groups,), 2.0),
                                (problem.batch,))
  sizes = jnp.floor(shares * problem.m).astype(jnp.int32)
  # The rows rounding left over go to the first group: the sizes sum to M.
  return sizes.at[:, 0].add(problem.m - sizes.sum(axis=1))


def _example_operands(problem: RaggedDotProblem, key):
  k_ops, k_sizes = jax.random.split(key)
  lhs, rhs = normal_operands([(problem.lhs_shape, problem.dtype),
                              (problem.rhs_shape, problem.dtype)], k_ops)
  return [lhs, rhs, example_group_sizes(problem, k_sizes)]


RAGGED_DOT = registry.register_op(Op(
    name="ragged_dot",
    primitive=ragged_dot_p,
    arity=3,
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=_example_operands,
))
