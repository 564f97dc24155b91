"""`matmul_p`: the one JAX primitive every jaxgemm GEMM goes through.

Canonical form: a batched product whose batch, M, K and N dimensions each span
a contiguous group of dimensions (`ndims` = how many each, default one each),

    a: (*B, *M, *K), or (*B, *K, *M) with trans_a
    b: (*B, *K, *N), or (*B, *N, *K) with trans_b
    c: (*B, *M, *N) = op(a) @ op(b) in out_dtype, accumulated in acc_dtype,

so `A^T B` and `A B^T` (the backward GEMMs) run without materialized
transposes, and `x @ W` with x of shape (batch, seq, d) runs with no reshape
before the primitive: a sharded dimension stays a dimension of its own, which
XLA's partitioner can keep split (a reshape merging a sharded dimension into
another is a gather). The kernels see the 3-D problem `(B, M, K) x (B, K, N)`:
the lowering merges each group, on the local shards, where that is free.
Params also carry `precision`, the static kernel choice (`backend`, and
`variant`/`config`, where None means "the backend's default for this shape"),
which every rule below passes on (the gradient of a Triton GEMM is two Triton
GEMMs, each with tiles chosen for its own shape), and `out_sharding`, the
result's sharding in its type (None: the rule's, as for `lax.dot_general`).

Rules: abstract eval (`lax.dot_general`'s own, for the result's sharding and
shard_map's varying axes, after our shape and dtype checks), the lowering (the
backend's GPU kernel on `cuda`, its interpreter on `cpu`) made partitionable by
`jaxgemm.sharding` with the einsum rule `sharding_rule`, a batching rule and
the bilinear JVP/transpose rules. With those, jit, grad, vjp, jvp, linearize,
vmap, hessian, shard_map and sharded jit compose.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad

from jaxgemm import collective_matmul, registry, sharding
from jaxgemm.gemm import GemmProblem, dimension_groups
from jaxgemm.ops import rules
from jaxgemm.ops.base import Op, normal_operands

matmul_p = Primitive("jaxgemm_matmul")

# (batch, M, K, N): how many dimensions each spans. One each is the 3-D form
# `GemmProblem` describes, and what a bind without `ndims` means.
DEFAULT_NDIMS = (1, 1, 1, 1)


def _size(dims: tuple[int, ...]):
  return dims[0] if len(dims) == 1 else dims


def problem_of(a_aval, b_aval, *, trans_a, trans_b, out_dtype, acc_dtype,
               precision, ndims=DEFAULT_NDIMS, **_) -> GemmProblem:
  """The GemmProblem that `matmul_p.bind(a, b, **params)` computes."""
  ndims = tuple(ndims)
  if len(ndims) != 4 or min(ndims) < 0:
    raise TypeError(f"matmul_p's ndims={ndims} must count the (batch, M, K, N) dimensions, "
                    f"each >= 0 (an empty group has size 1)")
  nb, nm, nk, nn = ndims
  for name, aval, rank in (("a", a_aval, nb + nm + nk), ("b", b_aval, nb + nk + nn)):
    if len(aval.shape) != rank:
      raise TypeError(f"matmul_p takes {rank}-D {name} (batch, M, K, N spanning ndims={ndims} "
                      f"dimensions); {name}.shape={aval.shape}")
  if a_aval.dtype != b_aval.dtype:
    raise TypeError(f"matmul_p operands must share a dtype; got "
                    f"a.dtype={a_aval.dtype}, b.dtype={b_aval.dtype}")
  (batch, m, k_a), (b_batch, k_b, n) = dimension_groups(
      a_aval.shape, b_aval.shape, trans_a=trans_a, trans_b=trans_b, ndims=ndims)
  if batch != b_batch:
    raise TypeError(f"matmul_p batch sizes differ: a.shape={a_aval.shape}, "
                    f"b.shape={b_aval.shape}")
  if k_a != k_b:
    raise TypeError(f"matmul_p contracting sizes differ: a.shape={a_aval.shape} "
                    f"(trans_a={trans_a}) has K={_size(k_a)}, b.shape={b_aval.shape} "
                    f"(trans_b={trans_b}) has K={_size(k_b)}")
  return GemmProblem(math.prod(batch), math.prod(m), math.prod(n), math.prod(k_a),
                     np.dtype(a_aval.dtype), np.dtype(out_dtype), np.dtype(acc_dtype),
                     trans_a, trans_b, precision)


def dimension_numbers(*, trans_a, trans_b, ndims=DEFAULT_NDIMS, **_):
  """`lax.dot_general`'s dimension numbers for these params: the same product."""
  nb, nm, nk, nn = ndims
  batch = tuple(range(nb))
  a_k = range(nb, nb + nk) if trans_a else range(nb + nm, nb + nm + nk)
  b_k = range(nb + nn, nb + nn + nk) if trans_b else range(nb, nb + nk)
  return (tuple(a_k), tuple(b_k)), (batch, batch)


def _factors(letter: str, count: int) -> tuple[str, ...]:
  return (letter,) if count == 1 else tuple(f"{letter}{i}" for i in range(count))


def sharding_rule(*, trans_a, trans_b, ndims=DEFAULT_NDIMS, **_) -> sharding.EinsumRule:
  """matmul_p's einsum: ``"b m k, b k n -> b m n"``, factors permuted by the transpose
  flags (``"b k m"`` with trans_a) and numbered where a group spans several dimensions.

  >>> str(sharding_rule(trans_a=False, trans_b=True, ndims=(0, 2, 1, 1)))
  'm0 m1 k, n k -> m0 m1 n'
  """
  batch, m, k, n = (_factors(letter, count) for letter, count in zip("bmkn", ndims))
  a = batch + (k + m if trans_a else m + k)
  b = batch + (n + k if trans_b else k + n)
  return sharding.EinsumRule((a, b), batch + m + n)


def bind(a, b, *, trans_a=False, trans_b=False, out_dtype, acc_dtype, precision, backend,
         variant, config, ndims=DEFAULT_NDIMS, out_sharding=None, overlap=None):
  """matmul_p.bind with every param, after lax.dot_general's preamble: under shard_map,
  an operand invariant over an axis its partner varies over is cast to varying (pvary).

  `out_sharding` is None or a NamedSharding on the abstract mesh (as
  `sharding.canonical_out_sharding` returns). `overlap` (None, True, False): whether
  a collective the call needs on a mesh runs as a ring under the local GEMMs
  (`jaxgemm.collective_matmul`).
  """
  a, b = sharding.insert_pvary(a, b)
  return matmul_p.bind(a, b, trans_a=trans_a, trans_b=trans_b,
                       out_dtype=np.dtype(out_dtype), acc_dtype=np.dtype(acc_dtype),
                       precision=precision, backend=backend, variant=variant,
                       config=config, ndims=tuple(ndims), out_sharding=out_sharding,
                       overlap=overlap)


def _abstract_eval(a, b, **params):
  problem = problem_of(a, b, **params)   # our checks and messages first
  # lax.dot_general's rule gives the result's sharding (Explicit mesh axes; the
  # "ambiguous" error for a sharded K without out_sharding) and, under
  # shard_map, the axes it varies over: jax's own rules, nothing reimplemented.
  out, _ = lax.dot_general_p.abstract_eval(
      a, b, dimension_numbers=dimension_numbers(**params), precision=None,
      preferred_element_type=None, out_sharding=params.get("out_sharding"))
  return out.update(dtype=problem.out_dtype, weak_type=False)


def _impl(*args, **params):
  # Eager calls compile the primitive alone, like any jax.lax op does.
  from jax._src import dispatch  # noqa: PLC0415 (the standard eager path for primitives)
  return dispatch.apply_primitive(matmul_p, *args, **params)


# ---------------------------------------------------------------- autodiff
#
# C = op_a(A) op_b(B). With dC the cotangent of C:
#   d op_a(A) = dC op_b(B)^T      d op_b(B) = op_a(A)^T dC
# and each is again a matmul_p, choosing transpose flags so that A, B and dC
# are read in the layout they are stored in (the groups permute with them:
# dA's K is the forward's N). The backward GEMMs run in the operands' dtype (a
# cotangent in a wider out_dtype is rounded to it first, keeping 16-bit
# backward GEMMs on tensor cores), accumulate in acc_dtype with the forward's
# precision, kernel choice and `overlap`, and return the primal's dtype and sharding.

def _backward(x_aval, params, lhs, rhs, trans_lhs, trans_rhs, ndims):
  # The result is stored as the primal operand is, so it takes that sharding, as
  # dot_general's transpose does: with Explicit axes a backward GEMM over a
  # sharded K (the weight gradient of data parallel) is otherwise "ambiguous".
  return bind(lhs, rhs, trans_a=trans_lhs, trans_b=trans_rhs,
              out_dtype=x_aval.dtype, acc_dtype=params["acc_dtype"],
              precision=params["precision"], backend=params["backend"],
              variant=params["variant"], config=params["config"], ndims=ndims,
              out_sharding=sharding.type_sharding(x_aval), overlap=params.get("overlap"))


def _transpose_lhs(ct, a, b, *, trans_a, trans_b, ndims=DEFAULT_NDIMS, **params):
  nb, nm, nk, nn = ndims
  ct = ct.astype(b.dtype)
  if trans_a:  # a stored (K, M): dA = op_b(B) dC^T
    return _backward(a.aval, params, b, ct, trans_b, True, (nb, nk, nn, nm))
  return _backward(a.aval, params, ct, b, False, not trans_b, (nb, nm, nn, nk))


def _transpose_rhs(ct, a, b, *, trans_a, trans_b, ndims=DEFAULT_NDIMS, **params):
  nb, nm, nk, nn = ndims
  ct = ct.astype(a.dtype)
  if trans_b:  # b stored (N, K): dB = dC^T op_a(A)
    return _backward(b.aval, params, ct, a, True, trans_a, (nb, nn, nm, nk))
  return _backward(b.aval, params, a, ct, not trans_a, False, (nb, nk, nm, nn))


# ---------------------------------------------------------------- batching

def _batch_rule(axis_data, args, dims, *, trans_a, trans_b, ndims=DEFAULT_NDIMS,
                out_sharding=None, **params):
  """vmap: the mapped axis becomes one more batch dimension, or one more M (N)
  dimension when only a (b) is mapped, which reuses the unmapped operand instead
  of broadcasting it. It stays a dimension of its own (no reshape), so a sharded
  mapped axis stays sharded; `out_sharding` gets it inserted, as lax's rule does.
  """
  a, b = args
  da, db = dims
  nb, nm, nk, nn = ndims
  if da is None and db is None:
    return bind(a, b, trans_a=trans_a, trans_b=trans_b, ndims=ndims,
                out_sharding=out_sharding, **params), None
  if da is not None and db is not None:
    a, b = jnp.moveaxis(a, da, 0), jnp.moveaxis(b, db, 0)
    ndims, out_dim = (nb + 1, nm, nk, nn), 0
  elif da is not None:
    a = jnp.moveaxis(a, da, nb + (nk if trans_a else 0))   # the front of a's M group
    ndims, out_dim = (nb, nm + 1, nk, nn), nb
  else:
    b = jnp.moveaxis(b, db, nb + (0 if trans_b else nk))   # the front of b's N group
    ndims, out_dim = (nb, nm, nk, nn + 1), nb + nm
  out = bind(a, b, trans_a=trans_a, trans_b=trans_b, ndims=ndims,
             out_sharding=sharding.with_vmapped_dim(out_sharding, axis_data, out_dim),
             **params)
  return out, out_dim


matmul_p.def_impl(_impl)
matmul_p.def_abstract_eval(_abstract_eval)
ad.defbilinear(matmul_p, _transpose_lhs, _transpose_rhs)
sharding.AXIS_AWARE_BATCHERS[matmul_p] = _batch_rule
# The kernel lowerings (`rules.kernel_lowering`: each group of dimensions merged,
# a bitcast, into the 3-D operands the kernels take; an empty product is zeros, K=0
# summing nothing) move to `matmul_local_p`, bound on each device's shards;
# matmul_p lowers to the partitioned call (one device: the kernel, directly).
matmul_local_p = sharding.make_partitionable(
    matmul_p, sharding_rule,
    {platform: rules.kernel_lowering(
        problem_of, lambda p: (p.a_shape, p.b_shape), platform=platform,
        multiple_results=False, empty="zeros") for platform in ("cuda", "cpu")},
    overlap=collective_matmul.ring_for)


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
