"""Rule pieces every op shares (`matmul`, `ragged_dot`, `fused_matmul`, `glu`, `scaled_matmul`).

`kernel_lowering` is their lowering rule, written once: the problem from the avals, the
kernel from `jaxgemm.dispatch` (`resolve_kernel`), the operands reshaped to the
problem's canonical shapes (merging a group of dimensions is a bitcast), and under
backend="auto" XLA when the chosen kernel cannot be built; `without_sharding_types` is
how a kernel lowering sees its operands. `moved` is the batching rules' one operand
move; `is_zero`, `add_terms` and `bias_to_out` are the JVP rules' pieces.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad, mlir

from jaxgemm import dispatch, measure, registry
from jaxgemm.ops.base import Problem

# What an empty problem (K = 0, or nothing to store) lowers to: "xla", the fallback
# backend's program (an epilogue still applies: act(bias) + residual), or "zeros", a
# product that sums nothing (no kernel and no dot in the program).
EMPTY_RESULTS = ("xla", "zeros")


def resolve_kernel(problem: Problem, params, platform: str | None = None,
                   num_devices: int = 1) -> dispatch.Choice:
  """The kernel that runs `problem`: the params' choice, completed per problem.

  variant=None and config=None (and backend="auto") are resolved here, by
  `jaxgemm.measure.decide` (a measurement where the problem has none, then
  `jaxgemm.dispatch.choose`), so that each GEMM of a gradient gets the kernel
  and tiles that suit its own shape. num_devices: of the program being lowered.
  """
  return measure.decide(problem, params, platform, num_devices)


def devices_of(ctx) -> int:
  """How many devices the program `ctx` lowers runs on (1 where jax does not say)."""
  context = ctx.module_context.axis_context
  count = getattr(context, "num_devices", None)
  if count is None:
    mesh = getattr(context, "mesh", None)
    count = mesh.size if mesh is not None else 1
  return count


def _lower_choice(ctx, operands, problem, choice: dispatch.Choice, platform, canonical,
                  multiple_results):
  impl = registry.get_backend(choice.backend, problem.op).impl(
      problem, choice.variant, choice.config, platform)
  if canonical is None:   # the operands are in the impl's shapes already, and so is the result
    return mlir.lower_fun(impl, multiple_results=multiple_results)(ctx, *operands)
  out_shape = ctx.avals_out[0].shape

  def as_3d(*operands):
    outs = impl(*(x.reshape(s) for x, s in zip(operands, canonical)))
    if not multiple_results:
      return outs.reshape(out_shape)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [y.reshape(out_shape) for y in outs]

  return mlir.lower_fun(as_3d, multiple_results=multiple_results)(ctx, *operands)


def _lower_zeros(ctx, operands, multiple_results):
  avals = ctx.avals_out
  zeros = lambda *_: ([jnp.zeros(a.shape, a.dtype) for a in avals] if multiple_results
                      else jnp.zeros(avals[0].shape, avals[0].dtype))
  return mlir.lower_fun(zeros, multiple_results=multiple_results)(ctx, *operands)


def without_sharding_types(ctx):
  """`ctx` with plain avals (shape and dtype) in and out, for a kernel's lowering: the
  kernel runs on one device's operands, to which their (global) sharding types do not
  apply, and they would make its reshapes ask for a sharding."""
  plain = lambda avals: [jax.core.ShapedArray(x.shape, x.dtype) for x in avals]
  return ctx.replace(avals_in=plain(ctx.avals_in), avals_out=plain(ctx.avals_out))


def kernel_lowering(problem_of: Callable, canonical_shapes: Callable | None, *,
                    platform: str, multiple_results: bool, empty: str = "xla") -> Callable:
  """The lowering rule of a primitive on `platform` (what `sharding.make_partitionable`
  registers on the op's local primitive).

  problem_of: (avals..., **params) -> the op's Problem.
  canonical_shapes: problem -> the shapes the backends' impls take, one per operand;
    the result is reshaped back to the primitive's. None: the operands and the
    result are in those shapes already.
  multiple_results: the primitive returns a list (the impl a tuple or one array).
  empty: what an empty problem lowers to, one of EMPTY_RESULTS.
  """
  if empty not in EMPTY_RESULTS:
    raise ValueError(f"{empty=} must be one of {EMPTY_RESULTS}")

  def lowering(ctx, *operands, **params):
    problem = problem_of(*ctx.avals_in, **params)
    ctx = without_sharding_types(ctx)
    canonical = None if canonical_shapes is None else canonical_shapes(problem)
    lower = lambda choice: _lower_choice(ctx, operands, problem, choice, platform,
                                         canonical, multiple_results)
    if problem.is_empty:   # K = 0 (or nothing to store): no kernel
      if empty == "zeros":
        return _lower_zeros(ctx, operands, multiple_results)
      return lower(dispatch.choose(problem, dispatch.FALLBACK, platform=platform))
    choice = resolve_kernel(problem, params, platform, devices_of(ctx))
    if params["backend"] != dispatch.AUTO or choice.backend == dispatch.FALLBACK:
      return lower(choice)
    try:
      # A kernel is compiled while it is lowered, so a failure leaves no launch behind.
      return lower(choice)
    except Exception as e:  # noqa: BLE001 (auto must compute what the jnp expression does)
      return lower(dispatch.fall_back(problem, choice, e, platform))
  return lowering


def is_zero(tangent) -> bool:
  """Whether a tangent (or cotangent) is JAX's symbolic zero."""
  return type(tangent) is ad.Zero


def add_terms(terms: Sequence):
  """The sum of the terms that are not None, or None where none is."""
  terms = [t for t in terms if t is not None]
  return functools.reduce(jnp.add, terms) if terms else None


def bias_to_out(bias, out_shape, nb: int, nn: int, kind: str):
  """A bias ((*N,) "shared", or (*batch, *N) "batched") broadcast to the output's full
  shape, whose first `nb` dimensions are the batch and last `nn` the N dimensions."""
  n_dims = tuple(range(len(out_shape) - nn, len(out_shape)))
  dims = n_dims if kind == "shared" else (*range(nb), *n_dims)
  return lax.broadcast_in_dim(bias, out_shape, dims)


def moved(x, d, to, size):
  """`x` with its mapped axis `d` at `to`, or broadcast to have one of `size` there."""
  if d is None:
    return jnp.broadcast_to(jnp.expand_dims(x, to), (*x.shape[:to], size, *x.shape[to:]))
  return jnp.moveaxis(x, d, to)
