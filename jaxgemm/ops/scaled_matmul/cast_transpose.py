"""The Triton cast-transpose quantizer as a primitive that partitions like its operand.

`quantize_pair(x, ..., backend="triton")` runs `kernels/triton/quantize/cast_transpose.py`,
which reads x (R, C) once and writes q, q^T and their scales. A jax-triton call alone has
no sharding rule, so XLA's partitioner would gather a sharded x for it. Bound through
`cast_transpose_p`, each device quantizes its own block of x (`jaxgemm.sharding`):

* per tensor (modes ("tensor", "tensor"), operands (x, scale)): elementwise given the
  scale, which the caller took from the whole tensor's amax (XLA's reduction: an
  all-reduce where x is sharded). Rule "r c, -> r c, c r": q keeps x's sharding and
  q^T the transposed one.
* in blocks (modes "row" (1x128) or "tile" (128x128) for q and for q^T; operand x
  alone). The scales' block dimensions, "nr" = ceil(R/128) and "nc" = ceil(C/128), are
  in no operand, and the rule keeps them whole. Where a device's rows (columns) are
  whole scale blocks, it quantizes its own block of x and the scales' block dimensions
  are all-gathered (1/128 of x's size or less); otherwise that dimension of x is
  gathered first, as before, and the results sliced back to the device's share.

    mode   q's scale (R, C)             q^T's scale (C, R)
    row    (R, NC): "r nc"              (C, NR): "c nr"
    tile   (NR, NC): "nr nc"            (NC, NR): "nc nr"
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import PartitionSpec as P

from jaxgemm import sharding
from jaxgemm.ops import rules
from jaxgemm.gemm import BLOCK, scale_shape

cast_transpose_p = Primitive("jaxgemm_cast_transpose")
cast_transpose_p.multiple_results = True


def bind(x, scale, *, dtype, scale_dtype, modes):
  """(q, q^T) for modes ("tensor", "tensor") with the given `scale`; else
  (q, q_scale, q^T, q^T_scale) for two block modes ("row", "tile"), `scale` None
  (`quantize_pair` has checked them)."""
  operands = (x, scale) if modes == ("tensor", "tensor") else (x,)
  return cast_transpose_p.bind(*operands, dtype=np.dtype(dtype),
                               scale_dtype=np.dtype(scale_dtype), modes=modes, shape=x.shape)


@cast_transpose_p.def_abstract_eval
def _abstract_eval(x, *_, dtype, scale_dtype, modes, shape):
  """The results' types, with the shardings `sharding_rule` gives them (Explicit mesh
  axes): q x's, q^T its transpose, a scale's row (column) dimension x's rows' (columns'),
  its block dimensions whole."""
  del shape
  r, c = x.shape
  shapes = [(r, c), (c, r)]
  dtypes = [dtype, dtype]
  if modes != ("tensor", "tensor"):
    shapes = [shapes[0], scale_shape(modes[0], r, c), shapes[1], scale_shape(modes[1], c, r)]
    dtypes = [dtype, scale_dtype, dtype, scale_dtype]
  return [x.update(shape=s, dtype=d, weak_type=False, sharding=typed)
          for s, d, typed in zip(shapes, dtypes, _result_shardings(x, modes))]


def _result_shardings(x, modes):
  """Each result's sharding by the rule: a factor of x takes x's mesh axes; the block
  factors, which the rule keeps whole, none (a scalar scale operand is replicated)."""
  rule = sharding_rule(modes=modes)
  axes = dict(zip(rule.operands[0], x.sharding.spec))
  return [x.sharding.update(spec=P(*(axes.get(f) for f in dims))) for dims in rule.results]


def _kernel(x, scale, *, dtype, scale_dtype, modes, platform):
  """The Triton kernel's results, as `bind` returns them."""
  from jaxgemm.kernels.triton.quantize import cast_transpose  # noqa: PLC0415 (needs triton)
  q, q_scale, q_t, q_t_scale = cast_transpose.cast_transpose(
      x, dtype=dtype, row_block=modes[0], col_block=modes[1], scale=scale,
      scale_dtype=scale_dtype, platform=platform)
  return (q, q_t) if modes == ("tensor", "tensor") else (q, q_scale, q_t, q_t_scale)


def _lowering(platform):
  def lowering(ctx, x, *scale, dtype, scale_dtype, modes, shape):
    del shape
    kernel = lambda x, *scale: _kernel(x, scale[0] if scale else None, dtype=dtype,
                                       scale_dtype=scale_dtype, modes=modes, platform=platform)
    return mlir.lower_fun(kernel, multiple_results=True)(rules.without_sharding_types(ctx),
                                                         x, *scale)
  return lowering


@cast_transpose_p.def_impl
def _impl(*args, **params):
  # Eager calls compile the primitive alone, like any jax.lax op does.
  from jax._src import dispatch  # noqa: PLC0415 (the standard eager path for primitives)
  return dispatch.apply_primitive(cast_transpose_p, *args, **params)


_PER_TENSOR_RULE = sharding.EinsumRule.parse("r c, -> r c, c r")
_SCALE_DIMS = {"row": (("r", "nc"), ("c", "nr")), "tile": (("nr", "nc"), ("nc", "nr"))}


def sharding_rule(*, modes, **_) -> sharding.EinsumRule:
  """The rule by modes (the module docstring).

  >>> str(sharding_rule(modes=("row", "tile")))
  'r c -> r c, r nc, c r, nc nr'
  """
  if modes == ("tensor", "tensor"):
    return _PER_TENSOR_RULE
  q_scale, q_t_scale = _SCALE_DIMS[modes[0]][0], _SCALE_DIMS[modes[1]][1]
  return sharding.EinsumRule((("r", "c"),), ("r", "c"), replicated=("nr", "nc"),
                             more_results=(q_scale, ("c", "r"), q_t_scale))


def _local_call(bind_local, operands, params, plan: sharding.Plan):
  """One device's quantization: its own block of x where it holds whole scale blocks,
  else with that dimension of x gathered; the scales' block dimensions made whole."""
  if params["modes"] == ("tensor", "tensor"):
    return bind_local(*operands, **params)
  (x,) = operands
  axes = [plan.factor_axes.get(f, ()) for f in ("r", "c")]
  local = {}        # x's dimension -> (mesh axes, local size): a device holds its own rows
  for dim, (dim_axes, size) in enumerate(zip(axes, params["shape"])):
    if not dim_axes:
      continue
    shards = math.prod(lax.axis_size(a) for a in dim_axes)
    if x.shape[dim] % BLOCK == 0 and x.shape[dim] * shards == size:
      local[dim] = (dim_axes, x.shape[dim])
    else:   # a device's share is not whole blocks: quantize the whole dimension
      whole = lax.all_gather(x, _axis_name(dim_axes), axis=dim, tiled=True)
      x = lax.slice_in_dim(whole, 0, size, axis=dim)
  q, q_scale, q_t, q_t_scale = bind_local(x, **params)
  mine = lambda y, y_dim, dim: _own_share(y, y_dim, axes[dim], params["shape"][dim])
  block_whole = lambda s, s_dim, dim: (
      lax.all_gather(s, _axis_name(local[dim][0]), axis=s_dim, tiled=True) if dim in local else s)
  # q (r, c) and q^T (c, r): each gathered dimension back to the device's share.
  for dim in (0, 1):
    if axes[dim] and dim not in local:
      q, q_t = mine(q, dim, dim), mine(q_t, 1 - dim, dim)
  scale_dims = _SCALE_DIMS[params["modes"][0]][0], _SCALE_DIMS[params["modes"][1]][1]
  scales = []
  for s, dims in zip((q_scale, q_t_scale), scale_dims):
    for s_dim, factor in enumerate(dims):
      dim = "rc".index(factor[-1])
      if factor in ("r", "c"):   # a row of x (or of x^T): sharded as x is
        if axes[dim] and dim not in local:
          s = mine(s, s_dim, dim)
      else:                      # a block dimension: whole on every device
        s = block_whole(s, s_dim, dim)
    scales.append(s)
  return q, scales[0], q_t, scales[1]


def _axis_name(axes):
  return axes if len(axes) > 1 else axes[0]


def _own_share(y, y_dim, axes, size):
  """This device's share of `y`'s whole dimension `y_dim` (of `size`), as XLA pads it."""
  if not axes:
    return y
  shards = math.prod(lax.axis_size(a) for a in axes)
  local = -(-size // shards)
  y = jnp.pad(y, [(0, local * shards - size if d == y_dim else 0) for d in range(y.ndim)])
  start = lax.axis_index(_axis_name(axes)) * local
  return lax.dynamic_slice_in_dim(y, start, local, axis=y_dim)


cast_transpose_local_p = sharding.make_partitionable(
    cast_transpose_p, sharding_rule,
    {platform: _lowering(platform) for platform in ("cpu", "cuda")}, local_call=_local_call)
