"""`scaled_matmul`: `(a * a_scale) @ (b * b_scale)` of fp8 operands, accumulated in fp32.

The public function checks every argument (naming the one that is wrong),
reads the scale kind from the scales' shapes, brings the call to
`scaled_matmul_p`'s canonical form (matmul's: batch dimensions, a shared b
with a's batch joined to M, transpose flags, no reshape of a sharded
dimension) and binds it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import gemm, sharding
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import FP8_DTYPES, SCALE_DTYPE, SCALE_DTYPES, dtype_among, dtype_names
from jaxgemm.ops.scaled_matmul.primitive import bind
from jaxgemm.ops.scaled_matmul.problem import OUT_DTYPES, ScaledMatmulProblem, blocks

_RANK = {"tensor": 0, "row_col": 1, "block": 2}


def _check_operand(x, name: str) -> None:
  if x.ndim < 2:
    raise ValueError(f"scaled_matmul's {name} must have at least 2 dimensions (..., rows, "
                     f"cols); got {name}.shape={x.shape}")
  if np.dtype(x.dtype) not in FP8_DTYPES:
    raise TypeError(f"scaled_matmul's {name} must be fp8, one of {dtype_names(FP8_DTYPES)} "
                    f"(quantize it with jaxgemm.quantize); got {name}.dtype={x.dtype}")


def _scale_kind(scale, name: str, batch: tuple[int, ...], kinds: dict, transposed: bool,
                what: dict):
  """(kind, the scale in logical orientation) from its shape; ValueError naming `name`.

  kinds: kind -> the logical trailing shape it must have; transposed: the operand is
  stored transposed, so the scale is too (its last two dimensions are swapped here).
  """
  scale = jnp.asarray(scale)
  if np.dtype(scale.dtype) not in SCALE_DTYPES:
    raise TypeError(f"scaled_matmul's {name} must be float32 or float8_e8m0fnu (powers of "
                    f"two); got {name}.dtype={scale.dtype} (cast it with "
                    f".astype(jnp.float32))")
  if scale.ndim == 0:
    return "tensor", scale
  stored = {k: (s[::-1] if transposed else s) for k, s in kinds.items()}
  kind = None
  if scale.ndim >= 2:
    lead = scale.shape[:-2]
    fits = len(lead) <= len(batch) and all(d in (1, b) for d, b in zip(lead[::-1], batch[::-1]))
    if fits:
      kind = next((k for k, s in stored.items() if tuple(scale.shape[-2:]) == s), None)
  if kind is None:
    listed = "; ".join(f"{stored[k]} {w}" for k, w in what.items())
    raise ValueError(
        f"scaled_matmul's {name} has shape {scale.shape}; it takes () (one scale per "
        f"tensor); {listed}{' (as the operand is stored, transposed)' if transposed else ''}, "
        f"with leading dimensions that broadcast to the operand's batch {batch}")
  return kind, (jnp.swapaxes(scale, -1, -2) if transposed else scale)


def scaled_matmul(a, b, a_scale, b_scale, *, out_dtype=jnp.bfloat16, precision=None,
                  trans_a: bool = False, trans_b: bool = False, out_sharding=None,
                  backend: str = "auto", variant: str | None = None,
                  config: KernelConfig | None = None) -> jax.Array:
  """`(a * a_scale) @ (b * b_scale)` of fp8 operands, accumulated in fp32, in `out_dtype`.

  Args:
    a: (..., M, K) in float8_e4m3fn or float8_e5m2; (..., K, M) with trans_a.
    b: (..., K, N), fp8 (either; e4m3 x e5m2 mixes); (..., N, K) with trans_b.
      Leading batch dimensions broadcast as in jnp.matmul; a b with none (a
      weight) is shared by every batch entry, not copied (with trans_a=False:
      a transposed a keeps its batch, and b is broadcast to it).
    a_scale, b_scale: float32, or both float8_e8m0fnu (powers of two, from
      `quantize(..., scale_dtype=jnp.float8_e8m0fnu)`: then XLA's cuBLAS FP8 GEMM
      writes bfloat16 itself and the scales follow exactly, where float32
      scales need an fp32 result and a convert), shaped as `jaxgemm.quantize`
      returns them for the operand as stored (so a transposed operand's scale
      is transposed too):

        per tensor        ()                          ()
        per row / column  a: (..., M, 1)              b: (..., 1, N)
        blocks            a: (..., M, ceil(K/128))    b: (..., ceil(K/128), ceil(N/128))
                          (1x128 blocks along K)      (128x128 blocks)

      A per-tensor scale combines with the other operand's per-row/column or
      block scales (it is broadcast to that kind, a few floats), as does a
      per-row a_scale with block b scales; a per-column b_scale does not
      combine with block a scales. Leading dimensions broadcast to the
      operand's batch dimensions.
    out_dtype: bfloat16, float16 or float32 (the one rounding, from fp32).
    precision: passed to XLA's dot (`backend="xla"`); fp8 products are exact in fp32.
    trans_a, trans_b: the operand is stored transposed (a (..., K, M), b (..., N, K)),
      which is how a backward pass reuses the forward's fp8 tensors: for
      Y = X W with X (M, K) in 1x128 blocks and W (K, N) in 128x128 blocks,
      dgrad dX = dY W^T is `scaled_matmul(dy8, w8, dy_scale, w_scale, trans_b=True)`
      (the same w8 and w_scale), and wgrad dW = X^T dY is
      `scaled_matmul(x8, dy8, x_scale, dy_scale, trans_a=True)` with x8 quantized
      in blocks along M (`quantize(x, block=(128, 1))`, scale (ceil(M/128), K)).
    out_sharding: the result's sharding on a mesh with Explicit axes (a
      NamedSharding, or a PartitionSpec under `jax.set_mesh`), as for
      `jnp.matmul`: needed where K is sharded on both operands and the result's
      sharding is ambiguous (jax's ShardingTypeError says so). None: the
      sharding `lax.dot_general` gives the product.
    backend: "auto" (on a GPU, measured when first compiled: `jaxgemm.measure`;
      the fastest known choice, XLA's program where nothing is known), or one of
      `jaxgemm.backends("scaled_matmul")`.
    variant, config: a kernel of the backend and its config, as for `jaxgemm.matmul`.

  Not differentiable (`jax.grad` raises): to train in FP8, differentiate through
  the bf16 values with `jaxgemm.matmul(x, w, fp8=...)`, which runs its forward,
  dgrad and wgrad GEMMs here.

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> x, w = jnp.ones((4, 256)), jnp.full((256, 8), 0.5)
    >>> x8, sx = jaxgemm.quantize(x, block=(1, 128))
    >>> w8, sw = jaxgemm.quantize(w, block=(128, 128))
    >>> y = jaxgemm.scaled_matmul(x8, w8, sx, sw, out_dtype=jnp.float32, backend="xla")
    >>> y.shape, round(float(y[0, 0]), 3)
    ((4, 8), 128.0)
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  _check_operand(a, "a")
  _check_operand(b, "b")
  out_dtype = dtype_among(out_dtype, OUT_DTYPES, "scaled_matmul", "out_dtype")
  out_sharding = sharding.canonical_out_sharding(out_sharding, "scaled_matmul")
  m, k = (a.shape[-1], a.shape[-2]) if trans_a else a.shape[-2:]
  k_b, n = (b.shape[-1], b.shape[-2]) if trans_b else b.shape[-2:]
  if k != k_b:
    raise TypeError(f"scaled_matmul contracting dimensions differ: a.shape={a.shape} "
                    f"(trans_a={trans_a}) has K={k}, b.shape={b.shape} (trans_b={trans_b}) "
                    f"has K={k_b}")
  a_batch, b_batch = a.shape[:-2], b.shape[:-2]
  kb, nb = blocks(k), blocks(n)
  a_kind, a_scale = _scale_kind(
      a_scale, "a_scale", a_batch, {"row_col": (m, 1), "block": (m, kb)}, trans_a,
      {"row_col": "(one per row of a)", "block": "(1x128 blocks of a along K)"})
  b_kind, b_scale = _scale_kind(
      b_scale, "b_scale", b_batch, {"row_col": (1, n), "block": (kb, nb)}, trans_b,
      {"row_col": "(one per column of b)", "block": "(128x128 blocks of b)"})
  kind = max(a_kind, b_kind, key=_RANK.get)
  if kind == "block" and b_kind == "row_col":
    raise ValueError(f"scaled_matmul's b_scale is per column, shape {b_scale.shape}, and "
                     f"a_scale has 1x128 blocks: a column scale is not a 128x128 block "
                     f"scale. Quantize b in blocks too (jaxgemm.quantize(b, block=(128, 128))) "
                     f"or a per row (block=(1, None))")
  # Power-of-two scales stay so only in pairs: one float32 scale makes the product's
  # scale any float32.
  scale_dtype = np.dtype(a_scale.dtype) if a_scale.dtype == b_scale.dtype else SCALE_DTYPE
  # The lower kind's scale broadcast to the other's (a few floats).
  if a_kind != kind:
    a_scale = jnp.broadcast_to(a_scale[..., None, None] if a_kind == "tensor" else a_scale,
                               (*a_scale.shape[:-2], m, 1 if kind == "row_col" else kb))
  if b_kind != kind:
    b_scale = jnp.broadcast_to(b_scale, (1, n) if kind == "row_col" else (kb, nb))

  shared = not trans_a and math.prod(b_batch) == 1
  if shared:   # x @ W: a's batch joins M, b and b_scale are not copied
    batch = a_batch
    b = b.reshape(b.shape[-2:])
    if kind != "tensor":
      a_scale = jnp.broadcast_to(a_scale, (*a_batch, *a_scale.shape[-2:]))
      b_scale = b_scale.reshape(b_scale.shape[-2:])
    ndims = (0, len(a_batch) + 1, 1, 1)
  else:
    try:
      batch = tuple(jnp.broadcast_shapes(a_batch, b_batch))
    except ValueError as e:
      raise ValueError(f"scaled_matmul batch dimensions do not broadcast: a.shape={a.shape}, "
                       f"b.shape={b.shape}") from e
    a = jnp.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = jnp.broadcast_to(b, (*batch, *b.shape[-2:]))
    if kind != "tensor":
      a_scale = jnp.broadcast_to(a_scale, (*batch, *a_scale.shape[-2:]))
      b_scale = jnp.broadcast_to(b_scale, (*batch, *b_scale.shape[-2:]))
    ndims = (len(batch), 1, 1, 1)
  if precision is not None:
    precision = gemm.canonical_precision(precision)
  problem = ScaledMatmulProblem(
      math.prod(batch) if not shared else 1, m * (math.prod(batch) if shared else 1), n, k,
      np.dtype(a.dtype), out_dtype, np.dtype(np.float32), bool(trans_a), bool(trans_b),
      precision, b_dtype=np.dtype(b.dtype), scale_kind=kind, scale_dtype=scale_dtype)
  params = gemm.kernel_params(problem, backend, variant, config, None)
  return bind(a, b, a_scale.astype(scale_dtype), b_scale.astype(scale_dtype),
              trans_a=trans_a, trans_b=trans_b, ndims=ndims, out_dtype=out_dtype,
              scale_kind=kind, precision=precision, out_sharding=out_sharding, **params)
