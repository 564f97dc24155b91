"""Rule pieces the epilogue and FP8 ops share (`fused_matmul`, `glu`, `scaled_matmul`).

`kernel_lowering` is their lowering rule, written once: the problem from the avals, the
kernel from `jaxgemm.dispatch`, the operands reshaped to the problem's canonical 3-D
shapes (merging a group of dimensions is a bitcast), and under backend="auto" XLA when the
chosen kernel cannot be built; `without_sharding_types` is how a kernel lowering sees
its operands. `moved` is the batching rules' one operand move.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.interpreters import mlir

from jaxgemm import dispatch, registry


def _lower_choice(ctx, operands, problem, choice: dispatch.Choice, platform, canonical,
                  multiple_results):
  impl = registry.get_backend(choice.backend, problem.op).impl(
      problem, choice.variant, choice.config, platform)
  out_shape = ctx.avals_out[0].shape

  def as_3d(*operands):
    outs = impl(*(x.reshape(s) for x, s in zip(operands, canonical)))
    if not multiple_results:
      return outs.reshape(out_shape)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [y.reshape(out_shape) for y in outs]

  return mlir.lower_fun(as_3d, multiple_results=multiple_results)(ctx, *operands)


def without_sharding_types(ctx):
  """`ctx` with plain avals (shape and dtype) in and out, for a kernel's lowering: the
  kernel runs on one device's operands, to which their (global) sharding types do not
  apply, and they would make its reshapes ask for a sharding."""
  plain = lambda avals: [jax.core.ShapedArray(x.shape, x.dtype) for x in avals]
  return ctx.replace(avals_in=plain(ctx.avals_in), avals_out=plain(ctx.avals_out))


def kernel_lowering(problem_of: Callable, canonical_shapes: Callable, *, platform: str,
                    multiple_results: bool) -> Callable:
  """The lowering rule of a primitive on `platform`.

  problem_of: (avals..., **params) -> the op's Problem.
  canonical_shapes: problem -> the shapes the backends' impls take, one per operand.
  """
  def lowering(ctx, *operands, **params):
    problem = problem_of(*ctx.avals_in, **params)
    ctx = without_sharding_types(ctx)
    lower = lambda choice: _lower_choice(ctx, operands, problem, choice, platform,
                                         canonical_shapes(problem), multiple_results)
    if problem.is_empty:   # K = 0 (or nothing to store): XLA's program handles it
      return lower(dispatch.choose(problem, dispatch.FALLBACK, platform=platform))
    choice = dispatch.choose(problem, params["backend"], params["variant"], params["config"],
                             platform=platform)
    if params["backend"] != dispatch.AUTO or choice.backend == dispatch.FALLBACK:
      return lower(choice)
    try:
      # A kernel is compiled while it is lowered, so a failure leaves no launch behind.
      return lower(choice)
    except Exception as e:  # noqa: BLE001 (auto must compute what the jnp expression does)
      return lower(dispatch.fall_back(problem, choice, e, platform))
  return lowering


def moved(x, d, to, size):
  """`x` with its mapped axis `d` at `to`, or broadcast to have one of `size` there."""
  if d is None:
    return jnp.broadcast_to(jnp.expand_dims(x, to), (*x.shape[:to], size, *x.shape[to:]))
  return jnp.moveaxis(x, d, to)
