"""`scaled_ragged_dot_p`: the FP8 grouped GEMM with scales, and its rules.

Operands: lhs (B, M, K) and rhs (B, G, K, N) in fp8, group_bounds (B, 2, G) int32
(`ragged_schedule.group_bounds`: each group's first and end row, a device array, as
`ragged_dot_p` takes them), lhs_scale and rhs_scale in the canonical shapes of
their `scale_kind` (`ScaledRaggedDotProblem` lists them). out (B, M, N): each
group's rows times its expert's matrix, scaled, rows in no group zero. With
`ragged_contracting` (the ragged-K form, the weight gradient, as ragged_dot_p's):
rhs (B, M, N), out (B, G, K, N), each group's rows of lhs^T times its rows of rhs.

Rules: abstract eval, the lowering (per problem, through `jaxgemm.dispatch`, by
`rules.kernel_lowering`), batching (the mapped axis joins B, as ragged_dot_p's;
a mapped per-tensor scale becomes per-row/column scales), sharding through
`jaxgemm.sharding.make_partitionable`. No differentiation: the JVP rule raises
(`NOT_DIFFERENTIABLE`), as scaled_matmul_p's does.

Sharding (`sharding_rule`, `_local_call`): ragged_dot_p's einsum with the scales'
factors. Tokens (m) sharded stay local, the per-row and block scales of lhs with
them; experts (g) sharded are expert parallelism: the bounds and rhs_scale are
sharded with the weights, each device fills its own experts' rows, and the
mechanism's all-reduce over the expert axis assembles the result. K and N split
as in scaled_matmul_p: block scales stay whole (their block factors replicated)
and each device slices the blocks of its own K and N ranges.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jaxgemm import ragged_schedule, registry, sharding
from jaxgemm.gemm import BLOCK, FP8_DTYPES, SCALE_DTYPES, dtype_names
from jaxgemm.ops import rules
from jaxgemm.ops.base import Op
from jaxgemm.ops.ragged_dot.primitive import example_group_sizes
# Block scales on a split K or N: the device's own blocks, as scaled_matmul_p slices them.
from jaxgemm.ops.scaled_matmul.primitive import _local_blocks
from jaxgemm.ops.scaled_ragged_dot.problem import (OUT_DTYPES, RAGGED_K_SCALE_KINDS, SCALE_KINDS,
                                                   ScaledRaggedDotProblem, blocks)

scaled_ragged_dot_p = Primitive("jaxgemm_scaled_ragged_dot")

# The message for a derivative: the FP8 grouped training path is `ragged_dot(fp8=)`.
NOT_DIFFERENTIABLE = (
    "jaxgemm.scaled_ragged_dot (scaled_ragged_dot_p) has no derivative: it multiplies fp8 "
    "values already quantized, and a gradient through them (and their scales) is not "
    "defined here. FP8 grouped GEMMs are differentiated through the bf16 inputs, "
    "quantized on the fly: `jaxgemm.ragged_dot(x, w, group_sizes, fp8=\"block\")` "
    "(or \"tensor\", or a jaxgemm.Fp8Recipe); or wrap this call in jax.lax.stop_gradient.")


def scale_shapes(batch, groups, m, k, n, scale_kind, ragged_contracting=False
                 ) -> tuple[tuple, tuple]:
  """The canonical shapes of lhs_scale and rhs_scale."""
  shapes = ScaledRaggedDotProblem(batch, groups, m, k, n, FP8_DTYPES[0], OUT_DTYPES[0],
                                  scale_kind=scale_kind, ragged_contracting=ragged_contracting)
  return shapes.lhs_scale_shape, shapes.rhs_scale_shape


def problem_of(lhs, rhs, group_bounds, lhs_scale, rhs_scale, *, out_dtype, scale_kind,
               rows_before_groups=False, ragged_contracting=False,
               **_) -> ScaledRaggedDotProblem:
  """The problem `scaled_ragged_dot_p.bind(lhs, rhs, group_bounds, lhs_scale, rhs_scale,
  **params)` computes; TypeError naming what does not fit."""
  if len(lhs.shape) != 3:
    raise TypeError(f"scaled_ragged_dot_p takes lhs of shape (B, M, K); lhs.shape={lhs.shape}")
  batch, m, k = lhs.shape
  if (len(group_bounds.shape) != 3 or group_bounds.shape[:2] != (batch, 2)
      or group_bounds.dtype != jnp.int32):
    raise TypeError(f"scaled_ragged_dot_p takes int32 group_bounds of shape (B, 2, G) with "
                    f"B={batch}; got {group_bounds.dtype}{list(group_bounds.shape)}")
  groups = group_bounds.shape[2]
  if ragged_contracting:
    if len(rhs.shape) != 3 or tuple(rhs.shape[:2]) != (batch, m):
      raise TypeError(f"scaled_ragged_dot_p (ragged-K): rhs.shape={rhs.shape} does not fit "
                      f"lhs.shape={lhs.shape}: expected ({batch}, {m}, N)")
    n = rhs.shape[2]
  else:
    if len(rhs.shape) != 4 or tuple(rhs.shape[:3]) != (batch, groups, k):
      raise TypeError(f"scaled_ragged_dot_p: rhs.shape={rhs.shape} does not fit "
                      f"lhs.shape={lhs.shape} and group_bounds.shape={group_bounds.shape}: "
                      f"expected ({batch}, {groups}, {k}, N)")
    n = rhs.shape[3]
  for name, aval in (("lhs", lhs), ("rhs", rhs)):
    if np.dtype(aval.dtype) not in FP8_DTYPES:
      raise TypeError(f"scaled_ragged_dot_p's {name} must be fp8 {dtype_names(FP8_DTYPES)}; "
                      f"got {np.dtype(aval.dtype).name}")
  kinds = RAGGED_K_SCALE_KINDS if ragged_contracting else SCALE_KINDS
  if scale_kind not in kinds:
    raise TypeError(f"scaled_ragged_dot_p's scale_kind={scale_kind!r} is not one of {kinds}"
                    f"{' (ragged-K)' if ragged_contracting else ''}")
  want = scale_shapes(batch, groups, m, k, n, scale_kind, ragged_contracting)
  scale_dtype = np.dtype(lhs_scale.dtype)
  for name, aval, shape in (("lhs_scale", lhs_scale, want[0]), ("rhs_scale", rhs_scale, want[1])):
    if (tuple(aval.shape) != shape or np.dtype(aval.dtype) not in SCALE_DTYPES
        or np.dtype(aval.dtype) != scale_dtype):
      raise TypeError(f"scaled_ragged_dot_p with scale_kind={scale_kind!r} takes {name} of "
                      f"shape {shape} in one of {dtype_names(SCALE_DTYPES)}, the same dtype for "
                      f"both scales; got {np.dtype(aval.dtype).name}{aval.shape}")
  if np.dtype(out_dtype) not in OUT_DTYPES:
    raise TypeError(f"scaled_ragged_dot_p's out_dtype must be one of {dtype_names(OUT_DTYPES)}; "
                    f"got {np.dtype(out_dtype).name}")
  return ScaledRaggedDotProblem(batch, groups, m, k, n, np.dtype(lhs.dtype),
                                np.dtype(out_dtype), np.dtype(rhs.dtype), scale_kind,
                                scale_dtype, rows_before_groups, bool(ragged_contracting))


def bind(lhs, rhs, group_bounds, lhs_scale, rhs_scale, *, out_dtype, scale_kind, backend,
         variant, config, rows_before_groups=False, ragged_contracting=False):
  """scaled_ragged_dot_p.bind with every param (shard_map: invariant operands cast to
  varying)."""
  operands = sharding.insert_pvary(lhs, rhs, group_bounds, lhs_scale, rhs_scale)
  return scaled_ragged_dot_p.bind(
      *operands, out_dtype=np.dtype(out_dtype), scale_kind=scale_kind,
      rows_before_groups=bool(rows_before_groups),
      ragged_contracting=bool(ragged_contracting), backend=backend, variant=variant,
      config=config)


def _abstract_eval(*avals, **params):
  problem = problem_of(*avals, **params)
  return jax.core.ShapedArray(problem.out_shape, problem.out_dtype)


def _impl(*args, **params):
  from jax._src import dispatch as jax_dispatch  # noqa: PLC0415 (eager path for primitives)
  return jax_dispatch.apply_primitive(scaled_ragged_dot_p, *args, **params)


# ---------------------------------------------------------------- autodiff


def _jvp(primals, tangents, **params):
  """Zero tangents pass (a constant call inside a differentiated function); others raise.
  The bounds' tangent (an integer operand's) is never one."""
  lhs_t, rhs_t, _, lhs_scale_t, rhs_scale_t = tangents
  if any(type(t) is not ad.Zero for t in (lhs_t, rhs_t, lhs_scale_t, rhs_scale_t)):
    raise NotImplementedError(NOT_DIFFERENTIABLE)
  out = scaled_ragged_dot_p.bind(*primals, **params)
  return out, ad.Zero.from_primal_value(out)


# ---------------------------------------------------------------- batching


def _batch_rule(args, dims, *, scale_kind, **params):
  """vmap: the mapped axis joins B (an operand not mapped is broadcast to it: the one
  copy), as ragged_dot_p's rule does. Per-tensor scales not mapped stay scalars (shared
  by every batch entry); a mapped one becomes per-row/column scales (M + G*N floats per
  batch entry), the one kind that can differ per entry; in the ragged-K form, which has
  no per-row kind, blocks of 128 tokens ((M/128) * (K + N) floats per entry)."""
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  lhs, rhs, bounds, lhs_scale, rhs_scale = args
  d_lhs, d_rhs, d_bounds, d_lhs_scale, d_rhs_scale = dims
  fold = lambda x, d: (lambda y: y.reshape(size * y.shape[1], *y.shape[2:]))(
      rules.moved(x, d, 0, size))
  lhs, rhs, bounds = fold(lhs, d_lhs), fold(rhs, d_rhs), fold(bounds, d_bounds)
  if scale_kind == "tensor" and (d_lhs_scale is not None or d_rhs_scale is not None):
    batch, m, k = lhs.shape
    ragged_k = params["ragged_contracting"]
    groups, n = bounds.shape[2], rhs.shape[-1]
    scale_kind = "block" if ragged_k else "row_col"
    lhs_shape, rhs_shape = scale_shapes(batch, groups, m, k, n, scale_kind, ragged_k)
    per_entry = lambda s, d, shape: lax.broadcast_in_dim(
        rules.moved(s, d, 0, size).reshape(size, 1), (size, batch // size, *shape[1:]),
        (0, 1)).reshape(shape)
    lhs_scale = per_entry(lhs_scale, d_lhs_scale, lhs_shape)
    rhs_scale = per_entry(rhs_scale, d_rhs_scale, rhs_shape)
  elif scale_kind != "tensor":
    lhs_scale, rhs_scale = fold(lhs_scale, d_lhs_scale), fold(rhs_scale, d_rhs_scale)
  out = scaled_ragged_dot_p.bind(lhs, rhs, bounds, lhs_scale, rhs_scale,
                                 scale_kind=scale_kind, **params)
  return out.reshape(size, -1, *out.shape[1:]), 0


scaled_ragged_dot_p.def_impl(_impl)
scaled_ragged_dot_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[scaled_ragged_dot_p] = _jvp
batching.primitive_batchers[scaled_ragged_dot_p] = _batch_rule


# ---------------------------------------------------------------- sharding


def sharding_rule(*, scale_kind, ragged_contracting=False, **_) -> sharding.EinsumRule:
  """ragged_dot_p's ragged-M einsum ``"b m k, b g k n, b t g -> b m n"`` (the bounds'
  pair dimension `t` never split) with the scales': none per tensor; ``"b m one"``
  and ``"b g one n"`` per row and column (sharded with their operands: a device of an
  expert-parallel call holds its experts' scales); ``"b m kb"`` and ``"b g kb nb"``
  for blocks, whose block factors stay whole (`_local_call` slices them).

  The ragged-K form is ragged_dot_p's ``"b m k, b m n, b t g -> b g k n"`` (m sharded:
  each device sums its own rows, then one psum; g sharded: each device its own
  experts' blocks) with its block scales' ``"b mb k"`` and ``"b mb n"``: K and N
  sharded with their operands, the token blocks `mb` whole (`_local_call` takes a
  device's own, `_on_the_global_grid`).

  >>> str(sharding_rule(scale_kind="block"))
  'b m k, b g k n, b t g, b m kb, b g kb nb -> b m n'
  >>> str(sharding_rule(scale_kind="block", ragged_contracting=True))
  'b m k, b m n, b t g, b mb k, b mb n -> b g k n'
  """
  if ragged_contracting:
    base = "b m k, b m n, b t g"
    if scale_kind == "tensor":
      return sharding.EinsumRule.parse(f"{base}, , -> b g k n", replicated=("t",))
    return sharding.EinsumRule.parse(f"{base}, b mb k, b mb n -> b g k n",
                                     replicated=("t", "mb"))
  base = "b m k, b g k n, b t g"
  if scale_kind == "tensor":
    return sharding.EinsumRule.parse(f"{base}, , -> b m n", replicated=("t",))
  if scale_kind == "row_col":
    return sharding.EinsumRule.parse(f"{base}, b m one, b g one n -> b m n",
                                     replicated=("t", "one"))
  return sharding.EinsumRule.parse(f"{base}, b m kb, b g kb nb -> b m n",
                                   replicated=("t", "kb", "nb"))


def _on_the_global_grid(lhs, rhs, bounds, lhs_scale, rhs_scale, first_row, row_axes):
  """A device's share of the ragged-K form with block scales (M sharded over `row_axes`,
  its rows from `first_row`), laid out so that its 128-row grid is the global one.

  Its rows are whole scale blocks (rows % 128 == 0): its own blocks of the scales
  (scaled_matmul's `_local_blocks`). Otherwise (a device's rows start inside a block) its
  rows are placed at first_row % 128 in 128 more zero rows (in no group: the bounds move
  with them) and the scales sliced from block first_row // 128: the same sums, each of
  the device's rows times its global block's scales, for 128 zero rows a device."""
  rows = lhs.shape[1]
  if rows % BLOCK == 0:
    return (lhs, rhs, bounds, _local_blocks(lhs_scale, 1, rows, "M", row_axes),
            _local_blocks(rhs_scale, 1, rows, "M", row_axes))
  offset = first_row % BLOCK
  place = lambda x: lax.dynamic_update_slice_in_dim(
      jnp.zeros((x.shape[0], rows + BLOCK, x.shape[2]), x.dtype), x, offset, axis=1)
  count = blocks(rows + BLOCK)
  mine = lambda s: lax.dynamic_slice_in_dim(
      jnp.pad(s, [(0, 0), (0, count), (0, 0)], constant_values=1), first_row // BLOCK, count,
      axis=1)
  return (place(lhs), place(rhs), (bounds + offset).astype(jnp.int32), mine(lhs_scale),
          mine(rhs_scale))


def _local_call(bind_local, operands, params, plan: sharding.Plan):
  """One device's call: its groups' bounds (sharded with g) moved into its own rows, as
  ragged_dot_p's `_local_call` does, and with block scales the blocks of its own K and
  N ranges, as scaled_matmul_p's does (ragged-K: of its own rows)."""
  lhs, rhs, bounds, lhs_scale, rhs_scale = operands
  row_axes = plan.factor_axes.get("m", ())
  if row_axes:
    rows = lhs.shape[1]
    first_row = lax.axis_index(row_axes if len(row_axes) > 1 else row_axes[0]) * rows
    bounds = jnp.clip(bounds - first_row, 0, rows).astype(jnp.int32)
  if params["scale_kind"] == "block" and params.get("ragged_contracting"):
    if row_axes:
      lhs, rhs, bounds, lhs_scale, rhs_scale = _on_the_global_grid(
          lhs, rhs, bounds, lhs_scale, rhs_scale, first_row, row_axes)
  elif params["scale_kind"] == "block":
    k, n = lhs.shape[2], rhs.shape[3]
    k_axes = plan.factor_axes.get("k", ())
    lhs_scale = _local_blocks(lhs_scale, 2, k, "K", k_axes)
    rhs_scale = _local_blocks(rhs_scale, 2, k, "K", k_axes)
    rhs_scale = _local_blocks(rhs_scale, 3, n, "N", plan.factor_axes.get("n", ()))
  sharded = bool(row_axes or plan.factor_axes.get("g", ()))
  return bind_local(lhs, rhs, bounds, lhs_scale, rhs_scale,
                    **{**params, "rows_before_groups": sharded})


# The kernel lowerings (`rules.kernel_lowering`; the operands are in the backends'
# shapes already, and an empty problem is zeros) move to `scaled_ragged_dot_local_p`,
# bound on each device's shards; scaled_ragged_dot_p lowers to the partitioned call
# (one device: directly).
scaled_ragged_dot_local_p = sharding.make_partitionable(
    scaled_ragged_dot_p, sharding_rule,
    {platform: rules.kernel_lowering(problem_of, None, platform=platform,
                                     multiple_results=False, empty="zeros")
     for platform in ("cuda", "cpu")},
    local_call=_local_call)


def _call(problem: ScaledRaggedDotProblem, lhs, rhs, group_bounds, lhs_scale, rhs_scale, *,
          backend, variant, config):
  """The primitive on canonical operands (what the autotuner times)."""
  return bind(lhs, rhs, group_bounds, lhs_scale, rhs_scale, out_dtype=problem.out_dtype,
              scale_kind=problem.scale_kind, backend=backend, variant=variant, config=config,
              ragged_contracting=problem.ragged_contracting)


def _example_operands(problem: ScaledRaggedDotProblem, key):
  """Standard-normal fp8 operands, a Dirichlet(2) routing of the rows summing to M
  (ragged_dot's), and scales of 2**-4 .. 2**4 (never zero; whole powers of two for
  power-of-two scales), as scaled_matmul's."""
  k_lhs, k_rhs, k_sizes, k_ls, k_rs = jax.random.split(key, 5)
  lhs = jax.random.normal(k_lhs, problem.lhs_shape, jnp.float32).astype(problem.dtype)
  rhs = jax.random.normal(k_rhs, problem.rhs_shape, jnp.float32).astype(problem.rhs_dtype)
  bounds = ragged_schedule.group_bounds(example_group_sizes(problem, k_sizes), problem.m)
  exponent = jnp.round if problem.pow2_scales else (lambda e: e)
  scale = lambda k, s: (2.0 ** exponent(jax.random.uniform(k, s, jnp.float32, -4, 4))
                        ).astype(problem.scale_dtype)
  return [lhs, rhs, bounds, scale(k_ls, problem.lhs_scale_shape),
          scale(k_rs, problem.rhs_scale_shape)]


SCALED_RAGGED_DOT = registry.register_op(Op(
    name="scaled_ragged_dot",
    primitive=scaled_ragged_dot_p,
    arity=5,
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=_example_operands,
))
