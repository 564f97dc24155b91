"""`ragged_dot_p`: the primitive of the grouped GEMM, with its rules.

Canonical form (`RaggedDotProblem` has the shapes): lhs (B, M, K), whose rows
fall into G contiguous groups, the rows of group g being
[group_bounds[b, 0, g], group_bounds[b, 1, g]) (`ragged_schedule.group_bounds` makes
them from lax's group sizes: (B, 2, G) int32), and

* ragged-M (`ragged_contracting=False`): rhs (B, G, K, N), or (B, G, N, K)
  with `trans_rhs`; out (B, M, N), each group's rows times its group's rhs,
  rows in no group zero;
* ragged-K (`ragged_contracting=True`): rhs (B, M, N); out (B, G, K, N), the
  sum over each group's rows of lhs^T rhs.

Bounds rather than sizes, so that one device of a sharded call can be given
its own groups within its own rows (`sharding_rule`, `_local_call`).

The two modes are each other's gradients, so every transformation closes over
this one primitive (C = out, dC its cotangent, rows(g) the rows of group g):

    ragged-M   C[rows g] = A[rows g] @ W[g]:
               dA = ragged-M(dC, W, trans_rhs=not trans_rhs)     (dC @ W[g]^T)
               dW = ragged-K(A, dC)  (or ragged-K(dC, A) for a stored W^T)
    ragged-K   C[g] = A[rows g]^T @ D[rows g]:
               dA = ragged-M(D, dC, trans_rhs=True)               (D @ dC[g]^T)
               dD = ragged-M(A, dC)

Each backward GEMM carries the forward's kernel choice and is resolved at
lowering for its own shape, as matmul_p's are. The bounds are an integer
operand: no tangent, no cotangent, and (a device array) no recompile when they
change. vmap folds the mapped axis into B.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jaxgemm import ragged_schedule, registry, sharding
from jaxgemm.ops import rules
from jaxgemm.ops.base import Op, normal_operands
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem

ragged_dot_p = Primitive("jaxgemm_ragged_dot")


def problem_of(lhs, rhs, group_bounds, *, ragged_contracting, trans_rhs, out_dtype, acc_dtype,
               precision, rows_before_groups=False, **_) -> RaggedDotProblem:
  """The RaggedDotProblem that `ragged_dot_p.bind(lhs, rhs, group_bounds, **params)` computes."""
  if len(lhs.shape) != 3:
    raise TypeError(f"ragged_dot_p takes lhs of shape (B, M, K); lhs.shape={lhs.shape}")
  batch, m, k = lhs.shape
  if (len(group_bounds.shape) != 3 or group_bounds.shape[:2] != (batch, 2)
      or group_bounds.dtype != jnp.int32):
    raise TypeError(f"ragged_dot_p takes int32 group_bounds of shape (B, 2, G) with "
                    f"B={batch}; got {group_bounds.dtype}{list(group_bounds.shape)}")
  if lhs.dtype != rhs.dtype:
    raise TypeError(f"ragged_dot_p operands must share a dtype; got lhs.dtype={lhs.dtype}, "
                    f"rhs.dtype={rhs.dtype}")
  groups = group_bounds.shape[2]
  if ragged_contracting:
    n = rhs.shape[-1]
    expected = (batch, m, n)
  else:
    n = rhs.shape[-2] if trans_rhs else rhs.shape[-1]
    expected = (batch, groups, n, k) if trans_rhs else (batch, groups, k, n)
  if tuple(rhs.shape) != expected:
    raise TypeError(f"ragged_dot_p: rhs.shape={rhs.shape} does not fit lhs.shape={lhs.shape} "
                    f"and group_bounds.shape={group_bounds.shape}: expected {expected} "
                    f"({ragged_contracting=}, {trans_rhs=})")
  return RaggedDotProblem(batch, groups, m, k, n, np.dtype(lhs.dtype), np.dtype(out_dtype),
                          np.dtype(acc_dtype), trans_rhs, ragged_contracting, precision,
                          rows_before_groups)


def bind(lhs, rhs, group_bounds, *, ragged_contracting=False, trans_rhs=False, out_dtype,
         acc_dtype, precision, backend, variant, config, rows_before_groups=False):
  """ragged_dot_p.bind with every param."""
  return ragged_dot_p.bind(lhs, rhs, group_bounds, rows_before_groups=rows_before_groups,
                           ragged_contracting=bool(ragged_contracting),
                           trans_rhs=bool(trans_rhs), out_dtype=np.dtype(out_dtype),
                           acc_dtype=np.dtype(acc_dtype), precision=precision,
                           backend=backend, variant=variant, config=config)


def _abstract_eval(lhs, rhs, group_bounds, **params):
  problem = problem_of(lhs, rhs, group_bounds, **params)
  return jax.core.ShapedArray(problem.out_shape, problem.out_dtype)


def _impl(*args, **params):
  from jax._src import dispatch as jax_dispatch  # noqa: PLC0415 (eager path for primitives)
  return jax_dispatch.apply_primitive(ragged_dot_p, *args, **params)


# ---------------------------------------------------------------- autodiff

def _backward(primal_aval, params, lhs, rhs, group_bounds, *, ragged_contracting, trans_rhs):
  """A backward GEMM: in the primal's dtype, with the forward's precision and kernel choice."""
  return bind(lhs.astype(primal_aval.dtype), rhs.astype(primal_aval.dtype), group_bounds,
              ragged_contracting=ragged_contracting, trans_rhs=trans_rhs,
              out_dtype=primal_aval.dtype, acc_dtype=params["acc_dtype"],
              precision=params["precision"], backend=params["backend"],
              variant=params["variant"], config=params["config"],
              rows_before_groups=params["rows_before_groups"])


def _jvp(primals, tangents, **params):
  lhs, rhs, group_bounds = primals
  d_lhs, d_rhs, _ = tangents
  out = ragged_dot_p.bind(lhs, rhs, group_bounds, **params)
  terms = []
  if type(d_lhs) is not ad.Zero:
    terms.append(ragged_dot_p.bind(d_lhs, rhs, group_bounds, **params))
  if type(d_rhs) is not ad.Zero:
    terms.append(ragged_dot_p.bind(lhs, d_rhs, group_bounds, **params))
  if not terms:
    return out, ad.Zero.from_primal_value(out)
  return out, functools.reduce(jnp.add, terms)


def _transpose(ct, lhs, rhs, group_bounds, *, ragged_contracting, trans_rhs, **params):
  if ad.is_undefined_primal(group_bounds):
    raise TypeError("ragged_dot_p is not linear in group_bounds")
  if type(ct) is ad.Zero:
    return [None, None, None]
  lhs_aval = lhs.aval if ad.is_undefined_primal(lhs) else jax.typeof(lhs)
  rhs_aval = rhs.aval if ad.is_undefined_primal(rhs) else jax.typeof(rhs)
  back = functools.partial(_backward, params=params, group_bounds=group_bounds)
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


# ---------------------------------------------------------------- sharding

def sharding_rule(*, ragged_contracting, trans_rhs, **_) -> sharding.EinsumRule:
  """ragged_dot_p's einsum (the bounds' pair dimension `t` is never split):

  * ragged-M ``"b m k, b g k n, b t g -> b m n"``: tokens (m) sharded stay
    local; experts (g) sharded make expert parallelism, each device filling
    the rows of its own groups and the rest zeros, summed over the expert axes;
  * ragged-K ``"b m k, b m n, b t g -> b g k n"``: each device sums its own
    rows (m sharded: one psum), or computes its own experts' blocks (g).

  >>> str(sharding_rule(ragged_contracting=False, trans_rhs=True))
  'b m k, b g n k, b t g -> b m n'
  """
  if ragged_contracting:
    return sharding.EinsumRule.parse("b m k, b m n, b t g -> b g k n", replicated=("t",))
  rhs = "b g n k" if trans_rhs else "b g k n"
  return sharding.EinsumRule.parse(f"b m k, {rhs}, b t g -> b m n", replicated=("t",))


def _local_call(bind_local, operands, params, plan: sharding.Plan):
  """One device's call: its groups' bounds (sharded with g) moved into its own rows."""
  lhs, rhs, bounds = operands
  row_axes = plan.factor_axes.get("m", ())
  if row_axes:
    rows = lhs.shape[1]
    first_row = lax.axis_index(row_axes if len(row_axes) > 1 else row_axes[0]) * rows
    bounds = jnp.clip(bounds - first_row, 0, rows).astype(jnp.int32)
  sharded = bool(row_axes or plan.factor_axes.get("g", ()))
  return bind_local(lhs, rhs, bounds, **{**params, "rows_before_groups": sharded})


# The kernel lowerings (`rules.kernel_lowering`; the operands are in the kernels'
# shapes already, and an empty problem is zeros) move to `ragged_dot_local_p`, bound
# on each device's shards; ragged_dot_p lowers to the partitioned call (one device:
# directly).
ragged_dot_local_p = sharding.make_partitionable(
    ragged_dot_p, sharding_rule,
    {platform: rules.kernel_lowering(problem_of, None, platform=platform,
                                     multiple_results=False, empty="zeros")
     for platform in ("cuda", "cpu")},
    local_call=_local_call)


def _call(problem: RaggedDotProblem, lhs, rhs, group_bounds, *, backend, variant, config):
  return bind(lhs, rhs, group_bounds, ragged_contracting=problem.ragged_contracting,
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
  bounds = ragged_schedule.group_bounds(example_group_sizes(problem, k_sizes), problem.m)
  return [lhs, rhs, bounds]


RAGGED_DOT = registry.register_op(Op(
    name="ragged_dot",
    primitive=ragged_dot_p,
    arity=3,
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=_example_operands,
))
