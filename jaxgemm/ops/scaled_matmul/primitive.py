"""`scaled_matmul_p`: an FP8 GEMM with per-tensor, per-row/column or block scales.

Operands: a, b (fp8), a_scale, b_scale (float32). Canonical form: `matmul_p`'s
(batch and M groups of dimensions, `ndims = (nb, nm, 1, 1)`; K and N one
dimension each; `trans_a`: a stored (*batch, K, *M), `trans_b`: b stored
(*batch, N, K)). The scales are in the logical orientation of op(A) and op(B)
(`ScaledMatmulProblem` lists the shapes; here with the batch and M groups in
full): "tensor" (), (); "row_col" (*batch, *M, 1), (*batch, 1, N); "block"
(*batch, *M, ceil(K/128)), (*batch, ceil(K/128), ceil(N/128)). The param
`out_sharding` is the result's sharding in its type (None: the rule's, as for
`lax.dot_general`).

Rules: abstract eval (lax.dot_general's, for the result's sharding and
shard_map's varying axes), the lowering (per problem, through
`jaxgemm.dispatch`, as matmul_p's), batching (`out_sharding` with the mapped
axis), sharding through `jaxgemm.sharding`. No differentiation: the JVP rule raises (see
`jaxgemm.ops.scaled_matmul`).

Sharding (`sharding_rule`, `_local_call`): batch, M and N shard with no
communication, the row/column scales along with their operands; a sharded K
leaves partial sums that the mechanism adds (scaling is linear, so tensor and
row/column scales apply to each partial sum). Block scales are whole on every
device (their block factors are `replicated`: a block factor cannot take the
mesh axis that shards K or N, which a mesh axis may shard once only); each
device slices the blocks of its own K and N range (`_local_call`). That needs
each device's range to start on a block boundary or to lie in one block: a
local K (N) that is a multiple of 128 or divides 128; other splits raise.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad

from jaxgemm import registry, sharding
from jaxgemm.gemm import BLOCK, FP8_DTYPES, SCALE_DTYPES, dimension_groups
from jaxgemm.ops import rules
from jaxgemm.ops.base import Op
from jaxgemm.ops.rules import moved
from jaxgemm.ops.matmul import primitive as matmul_primitive
from jaxgemm.ops.scaled_matmul.problem import OUT_DTYPES, SCALE_KINDS, ScaledMatmulProblem, blocks

scaled_matmul_p = Primitive("jaxgemm_scaled_matmul")

# The message for a derivative: training goes through the bf16 values (training.py).
NOT_DIFFERENTIABLE = (
    "jaxgemm.scaled_matmul (scaled_matmul_p) has no derivative: it multiplies fp8 values "
    "already quantized, and a gradient through them (and their scales) is not defined here. "
    "Differentiate through the bf16 inputs instead with the FP8 training path, "
    "`jaxgemm.matmul(x, w, fp8='block')` (or 'tensor', or a jaxgemm.Fp8Recipe): it quantizes "
    "on the fly and runs the dgrad and wgrad GEMMs in FP8 too; or wrap the call in "
    "jax.lax.stop_gradient.")


def scale_shapes(a_shape, b_shape, *, trans_a, trans_b, ndims, scale_kind, **_):
  """The full shapes a_scale and b_scale must have for these operands."""
  (batch, m, k), (_, _, n) = dimension_groups(a_shape, b_shape, trans_a=trans_a,
                                              trans_b=trans_b, ndims=ndims)
  k, n = math.prod(k), math.prod(n)
  if scale_kind == "tensor":
    return (), ()
  if scale_kind == "row_col":
    return (*batch, *m, 1), (*batch, 1, n)
  return (*batch, *m, blocks(k)), (*batch, blocks(k), blocks(n))


def problem_of(a, b, a_scale, b_scale, *, trans_a, trans_b, ndims, out_dtype, scale_kind,
               precision=None, **_) -> ScaledMatmulProblem:
  """The ScaledMatmulProblem that `scaled_matmul_p.bind(a, b, a_scale, b_scale, **params)` is."""
  ndims = tuple(ndims)
  nb, nm, nk, nn = ndims
  if nk != 1 or nn != 1:
    raise TypeError(f"scaled_matmul_p takes one K and one N dimension; got ndims={ndims}")
  if scale_kind not in SCALE_KINDS:
    raise TypeError(f"scaled_matmul_p's scale_kind={scale_kind!r} is not one of {SCALE_KINDS}")
  for name, aval, rank in (("a", a, nb + nm + 1), ("b", b, nb + 2)):
    if len(aval.shape) != rank:
      raise TypeError(f"scaled_matmul_p takes {rank}-D {name} (ndims={ndims}); "
                      f"{name}.shape={aval.shape}")
    if np.dtype(aval.dtype) not in FP8_DTYPES:
      raise TypeError(f"scaled_matmul_p's {name} must be fp8 {[d.name for d in FP8_DTYPES]}; "
                      f"got {np.dtype(aval.dtype).name}")
  (batch, m, k_a), (b_batch, k_b, n) = dimension_groups(
      a.shape, b.shape, trans_a=trans_a, trans_b=trans_b, ndims=ndims)
  if batch != b_batch or k_a != k_b:
    raise TypeError(f"scaled_matmul_p operands do not fit: a.shape={a.shape} "
                    f"(trans_a={trans_a}), b.shape={b.shape} (trans_b={trans_b}), ndims={ndims}")
  want = scale_shapes(a.shape, b.shape, trans_a=trans_a, trans_b=trans_b, ndims=ndims,
                      scale_kind=scale_kind)
  scale_dtype = np.dtype(a_scale.dtype)
  for name, aval, shape in (("a_scale", a_scale, want[0]), ("b_scale", b_scale, want[1])):
    if (tuple(aval.shape) != shape or np.dtype(aval.dtype) not in SCALE_DTYPES
        or np.dtype(aval.dtype) != scale_dtype):
      raise TypeError(f"scaled_matmul_p with scale_kind={scale_kind!r} takes {name} of shape "
                      f"{shape} in one of {[d.name for d in SCALE_DTYPES]}, the same dtype "
                      f"for both scales; got {np.dtype(aval.dtype).name}{aval.shape}")
  if np.dtype(out_dtype) not in OUT_DTYPES:
    raise TypeError(f"scaled_matmul_p's out_dtype must be one of "
                    f"{[d.name for d in OUT_DTYPES]}; got {np.dtype(out_dtype).name}")
  return ScaledMatmulProblem(
      math.prod(batch), math.prod(m), math.prod(n), math.prod(k_a), np.dtype(a.dtype),
      np.dtype(out_dtype), np.dtype(np.float32), trans_a, trans_b, precision,
      b_dtype=np.dtype(b.dtype), scale_kind=scale_kind, scale_dtype=scale_dtype)


def bind(a, b, a_scale, b_scale, *, trans_a=False, trans_b=False,
         ndims=matmul_primitive.DEFAULT_NDIMS, out_dtype, scale_kind, precision=None,
         backend="auto", variant=None, config=None, out_sharding=None):
  """scaled_matmul_p.bind with every param (shard_map: invariant operands cast to varying).

  `out_sharding` is None or a NamedSharding (`sharding.canonical_out_sharding`), as
  matmul_p's.
  """
  a, b, a_scale, b_scale = sharding.insert_pvary(a, b, a_scale, b_scale)
  return scaled_matmul_p.bind(
      a, b, a_scale, b_scale, trans_a=bool(trans_a), trans_b=bool(trans_b),
      ndims=tuple(ndims), out_dtype=np.dtype(out_dtype), scale_kind=scale_kind,
      precision=precision, backend=backend, variant=variant, config=config,
      out_sharding=out_sharding)


def _abstract_eval(a, b, a_scale, b_scale, **params):
  problem = problem_of(a, b, a_scale, b_scale, **params)
  # lax.dot_general's rule types the result as matmul_p's does (Explicit mesh axes,
  # jax's "ambiguous" error for a sharded K without out_sharding, shard_map's axes).
  out, _ = lax.dot_general_p.abstract_eval(
      a, b.update(dtype=a.dtype), dimension_numbers=matmul_primitive.dimension_numbers(**params),
      precision=None, preferred_element_type=np.dtype(np.float32),
      out_sharding=params.get("out_sharding"))
  return out.update(dtype=problem.out_dtype, weak_type=False)


def _impl(*args, **params):
  from jax._src import dispatch as jax_dispatch  # noqa: PLC0415 (eager path for primitives)
  return jax_dispatch.apply_primitive(scaled_matmul_p, *args, **params)


# ---------------------------------------------------------------- autodiff


def _jvp(primals, tangents, **params):
  """Zero tangents pass (a constant call inside a differentiated function); others raise."""
  if any(type(t) is not ad.Zero for t in tangents):
    raise NotImplementedError(NOT_DIFFERENTIABLE)
  out = scaled_matmul_p.bind(*primals, **params)
  return out, ad.Zero.from_primal_value(out)


# ---------------------------------------------------------------- batching


def _batch_rule(axis_data, args, dims, *, out_sharding=None, **params):
  """vmap: a mapped a (with its scale) joins M, reusing b and b_scale unbroadcast;
  otherwise the mapped axis becomes a leading batch dimension (unmapped operands
  broadcast). A mapped per-tensor scale becomes per-row/column scales (the
  broadcast costs M + N floats per batch entry). `out_sharding` gets the mapped
  axis inserted, as matmul_p's rule does."""
  if all(d is None for d in dims):   # an axis-aware batcher is called for these too
    return scaled_matmul_p.bind(*args, out_sharding=out_sharding, **params), None
  a, b, a_scale, b_scale = args
  da, db, dsa, dsb = dims
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  nb, nm, _, _ = params["ndims"]
  trans_a, kind = params["trans_a"], params["scale_kind"]
  tensor_mapped = kind == "tensor" and (dsa is not None or dsb is not None)
  if da is not None and db is None and dsb is None and not tensor_mapped:
    a = jnp.moveaxis(a, da, nb + (1 if trans_a else 0))   # the front of a's M group
    if kind != "tensor":
      a_scale = moved(a_scale, dsa, nb, size)
    out = scaled_matmul_p.bind(a, b, a_scale, b_scale, **{
        **params, "ndims": (nb, nm + 1, 1, 1),
        "out_sharding": sharding.with_vmapped_dim(out_sharding, axis_data, nb)})
    return out, nb
  a, b = moved(a, da, 0, size), moved(b, db, 0, size)
  if tensor_mapped:
    shapes = scale_shapes(a.shape, b.shape, **{**params, "ndims": (nb + 1, nm, 1, 1),
                                               "scale_kind": "row_col"})
    def to_row_col(scale, d, shape):   # () or a mapped (size,): constant along M (N)
      return lax.broadcast_in_dim(scale, shape, () if d is None else (0,))
    a_scale = to_row_col(a_scale, dsa, shapes[0])
    b_scale = to_row_col(b_scale, dsb, shapes[1])
    kind = "row_col"
  elif kind != "tensor":
    a_scale, b_scale = moved(a_scale, dsa, 0, size), moved(b_scale, dsb, 0, size)
  out = scaled_matmul_p.bind(
      a, b, a_scale, b_scale, **{**params, "ndims": (nb + 1, nm, 1, 1), "scale_kind": kind,
                                 "out_sharding": sharding.with_vmapped_dim(out_sharding,
                                                                           axis_data, 0)})
  return out, 0


# ---------------------------------------------------------------- sharding


def sharding_rule(*, trans_a, trans_b, ndims, scale_kind, **_) -> sharding.EinsumRule:
  """matmul_p's einsum with the scales': none for per-tensor scales, ``"b m one"`` and
  ``"b one n"`` per row and column (sharded with their operands), ``"b m kb"`` and
  ``"b kb nb"`` for blocks, whose block factors stay whole (`_local_call` slices them).

  >>> str(sharding_rule(trans_a=False, trans_b=True, ndims=(0, 2, 1, 1), scale_kind="block"))
  'm0 m1 k, n k, m0 m1 kb, kb nb -> m0 m1 n'
  """
  base = matmul_primitive.sharding_rule(trans_a=trans_a, trans_b=trans_b, ndims=ndims)
  (a, b), out = base.operands, base.result
  batch, m = out[:ndims[0]], out[ndims[0]:len(out) - 1]
  if scale_kind == "tensor":
    return sharding.EinsumRule((a, b, (), ()), out)
  if scale_kind == "row_col":
    return sharding.EinsumRule((a, b, batch + m + ("one",), batch + ("one", "n")), out,
                               replicated=("one",))
  return sharding.EinsumRule((a, b, batch + m + ("kb",), batch + ("kb", "nb")), out,
                             replicated=("kb", "nb"))


def _local_blocks(scale, axis, local_size, what, axes):
  """`scale`'s blocks (along `axis`) that cover this device's `local_size` elements of a
  dimension sharded over mesh `axes`."""
  if not axes:
    return scale
  if local_size % BLOCK and BLOCK % local_size:
    raise ValueError(
        f"jaxgemm.scaled_matmul with block scales: {what} is sharded over mesh axes {axes} "
        f"into {local_size} per device, which neither is a multiple of {BLOCK} nor divides "
        f"{BLOCK}, so a device's range does not line up with the scale blocks. Shard {what} "
        f"into multiples of {BLOCK} per device, or keep it whole.")
  count = blocks(local_size)
  start = lax.axis_index(axes if len(axes) > 1 else axes[0]) * local_size // BLOCK
  padded = jnp.pad(scale, [(0, count) if d == axis else (0, 0) for d in range(scale.ndim)],
                   constant_values=1)
  return lax.dynamic_slice_in_dim(padded, start, count, axis=axis)


def _local_call(bind_local, operands, params, plan: sharding.Plan):
  """One device's call; with block scales, the blocks of its own K and N ranges."""
  a, b, a_scale, b_scale = operands
  if params["scale_kind"] == "block":
    k = a.shape[-2] if params["trans_a"] else a.shape[-1]
    n = b.shape[-2] if params["trans_b"] else b.shape[-1]
    k_axes = plan.factor_axes.get("k", ())
    a_scale = _local_blocks(a_scale, a_scale.ndim - 1, k, "K", k_axes)
    b_scale = _local_blocks(b_scale, b_scale.ndim - 2, k, "K", k_axes)
    b_scale = _local_blocks(b_scale, b_scale.ndim - 1, n, "N", plan.factor_axes.get("n", ()))
  return bind_local(a, b, a_scale, b_scale, **params)


scaled_matmul_p.def_impl(_impl)
scaled_matmul_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[scaled_matmul_p] = _jvp
sharding.AXIS_AWARE_BATCHERS[scaled_matmul_p] = _batch_rule
scaled_matmul_local_p = sharding.make_partitionable(
    scaled_matmul_p, sharding_rule,
    {platform: rules.kernel_lowering(
        problem_of, lambda p: (p.a_shape, p.b_shape, p.a_scale_shape, p.b_scale_shape),
        platform=platform, multiple_results=False) for platform in ("cuda", "cpu")},
    local_call=_local_call)


def _call(problem: ScaledMatmulProblem, a, b, a_scale, b_scale, *, backend, variant, config):
  """The primitive on canonical 3-D operands (what the autotuner times)."""
  return bind(a, b, a_scale, b_scale, trans_a=problem.trans_a, trans_b=problem.trans_b,
              out_dtype=problem.out_dtype, scale_kind=problem.scale_kind,
              precision=problem.precision, backend=backend, variant=variant, config=config)


def _example_operands(problem: ScaledMatmulProblem, key):
  """Standard-normal fp8 operands and scales of 2**-4 .. 2**4 (never zero; whole powers
  of two for power-of-two scales)."""
  ka, kb, ks, kt = jax.random.split(key, 4)
  a = jax.random.normal(ka, problem.a_shape, jnp.float32).astype(problem.dtype)
  b = jax.random.normal(kb, problem.b_shape, jnp.float32).astype(problem.b_dtype)
  exponent = jnp.round if problem.pow2_scales else (lambda e: e)
  scale = lambda k, s: (2.0 ** exponent(jax.random.uniform(k, s, jnp.float32, -4, 4))
                        ).astype(problem.scale_dtype)
  return [a, b, scale(ks, problem.a_scale_shape), scale(kt, problem.b_scale_shape)]


SCALED_MATMUL = registry.register_op(Op(
    name="scaled_matmul",
    primitive=scaled_matmul_p,
    arity=4,
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=_example_operands,
))
