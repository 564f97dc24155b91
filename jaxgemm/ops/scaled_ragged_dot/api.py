"""`scaled_ragged_dot`: an FP8 grouped GEMM, `lax.ragged_dot` of scaled fp8 operands.

The public function checks every argument (errors name the argument and list what
is valid), reads the scale kind from the scales' shapes (those `jaxgemm.quantize`
returns), brings the call to `scaled_ragged_dot_p`'s canonical form (a leading batch
dimension of one, the group sizes as each group's row bounds) and binds it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import gemm, ragged_schedule
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import (BLOCK, FP8_DTYPES, SCALE_DTYPE, SCALE_DTYPES, dtype_among,
                          dtype_names)
from jaxgemm.ops.ragged_dot.api import RAGGED_DOT_NUMBERS
from jaxgemm.ops.scaled_ragged_dot.primitive import bind
from jaxgemm.ops.scaled_ragged_dot.problem import OUT_DTYPES, ScaledRaggedDotProblem, blocks

_RANK = {"tensor": 0, "row_col": 1, "block": 2}

# The ragged-K form's dimension numbers (`ragged_dot_general`'s weight gradient): lhs
# (M, K) ragged in M, M contracted with rhs (M, N), out (G, K, N).
RAGGED_K_NUMBERS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[])


def _check_group_sizes(group_sizes, groups: int, what: str) -> None:
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"scaled_ragged_dot's group_sizes must have an integer dtype; got "
                    f"group_sizes.dtype={group_sizes.dtype}")
  if tuple(group_sizes.shape) != (groups,):
    raise TypeError(f"scaled_ragged_dot's group_sizes.shape={group_sizes.shape} must be "
                    f"({groups},), {what}")


def _check_operand(x, name: str, ndim: int, shape: str) -> None:
  if x.ndim != ndim:
    raise TypeError(f"scaled_ragged_dot's {name} must be {ndim}-D {shape}; got "
                    f"{name}.shape={x.shape}")
  if np.dtype(x.dtype) not in FP8_DTYPES:
    raise TypeError(f"scaled_ragged_dot's {name} must be fp8, one of {dtype_names(FP8_DTYPES)} "
                    f"(quantize it with jaxgemm.quantize); got {name}.dtype={x.dtype}")


def _scale_kind(scale, name: str, kinds: dict[str, tuple[tuple[int, ...], str]]):
  """(kind, scale) from the scale's shape; TypeError/ValueError naming `name` and listing
  the valid shapes. kinds: kind -> (its shape, what it is)."""
  scale = jnp.asarray(scale)
  if np.dtype(scale.dtype) not in SCALE_DTYPES:
    raise TypeError(f"scaled_ragged_dot's {name} must be one of {dtype_names(SCALE_DTYPES)} "
                    f"(float8_e8m0fnu: powers of two); got {name}.dtype={scale.dtype} "
                    f"(cast it with .astype(jnp.float32))")
  if scale.ndim == 0:
    return "tensor", scale
  # row_col before block: where K <= 128 a (M, 1) scale is both, and means the same.
  kind = next((k for k, (shape, _) in kinds.items() if tuple(scale.shape) == shape), None)
  if kind is None:
    valid = "; ".join(["() per tensor"] + [f"{shape} {what}" for shape, what in kinds.values()])
    raise ValueError(f"scaled_ragged_dot's {name} has shape {scale.shape}; valid: {valid}")
  return kind, scale


def scaled_ragged_dot(lhs, rhs, group_sizes, lhs_scale, rhs_scale, *, out_dtype=jnp.bfloat16,
                      ragged_dot_dimension_numbers: lax.RaggedDotDimensionNumbers | None = None,
                      backend: str = "auto", variant: str | None = None,
                      config: KernelConfig | None = None) -> jax.Array:
  """An FP8 grouped GEMM: `lax.ragged_dot(lhs * lhs_scale, rhs * rhs_scale, group_sizes)`
  of fp8 operands, accumulated in fp32, in `out_dtype`.

  The rows of `lhs` (tokens, sorted by expert) are split, in order, into
  `len(group_sizes)` contiguous groups, and each group is multiplied by its own
  expert's matrix: ``out[rows of g] = (lhs * lhs_scale)[rows of g] @ (rhs[g] *
  rhs_scale[g])``. Rows past ``sum(group_sizes)`` are zeros; a group's rows end at
  M. `group_sizes` is a device array: under `jax.jit` it can change every step with
  no recompile and no host sync.

  Args:
    lhs: (M, K) in float8_e4m3fn or float8_e5m2.
    rhs: (G, K, N), fp8 (either; e4m3 x e5m2 mixes), one matrix per expert.
    group_sizes: (G,) integer array, rows per expert.
    lhs_scale, rhs_scale: float32, or both float8_e8m0fnu (powers of two), shaped as
      `jaxgemm.quantize` returns them for the operand (G is a batch dimension of rhs,
      so its blocks are per expert):

        per tensor        ()                        ()
        per row / column  lhs: (M, 1)               rhs: (G, 1, N)
        blocks            lhs: (M, ceil(K/128))     rhs: (G, ceil(K/128), ceil(N/128))
                          quantize(lhs, block=(1, 128))  quantize(rhs, block=(128, 128))

      A per-tensor scale combines with the other operand's per-row/column or block
      scales, as does a per-row lhs_scale with block rhs scales; a per-column
      rhs_scale does not combine with block lhs scales (a column scale is not
      constant over a 128x128 block).
    out_dtype: bfloat16, float16 or float32 (the one rounding, from fp32).
    backend: "auto" (the fastest known choice; XLA's program while no kernel is
      registered: the `xla` backend, `lax.ragged_dot` of the fp8 values widened to
      bf16 with the scales applied to its fp32 partial sums, every 128 of K with
      block scales), or one of `jaxgemm.backends("scaled_ragged_dot")`.
    variant, config: a kernel of the backend and its config; None picks them.

  The ragged-K form (a mixture-of-experts weight gradient, as `ragged_dot_general`'s),
  with ``ragged_dot_dimension_numbers=RAGGED_K_NUMBERS`` (lax's numbers contracting
  lhs (M, K) ragged in M with rhs (M, N)): ``out[g] = (lhs * lhs_scale)[rows of g]^T
  @ (rhs * rhs_scale)[rows of g]``, out (G, K, N), an empty group's zeros; both
  operands fp8 with their rows in the groups, the scales per tensor (()) or in blocks
  of 128 tokens along the contracted M, as `jaxgemm.quantize` returns them:

      lhs_scale   (ceil(M/128), K)   quantize(lhs, block=(128, 1))
                  (ceil(M/128), ceil(K/128))   quantize(lhs, block=(128, 128))
      rhs_scale   (ceil(M/128), N)   quantize(rhs, block=(128, 1))
                  (ceil(M/128), ceil(N/128))   quantize(rhs, block=(128, 128))

  (any pairing, a per-tensor scale with blocks too). The blocks lie on the global
  128-row grid, whatever the groups: partial sums are promoted to fp32 per 128-row
  block, each group summing its own rows of the blocks it touches.

  Not differentiable (`jax.grad` raises NotImplementedError): FP8 grouped GEMMs are
  trained through the bf16 values, quantized on the fly, with
  `jaxgemm.ragged_dot(x, w, group_sizes, fp8=...)`. It composes with jit and vmap,
  and partitions on a mesh: tokens sharded stay local, experts sharded run expert
  parallel (each device its own experts' rows, one all-reduce).

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> x = jnp.ones((6, 256)); w = jnp.stack([jnp.full((256, 8), 0.5), jnp.ones((256, 8))])
    >>> x8, sx = jaxgemm.quantize(x, block=(1, 128))
    >>> w8, sw = jaxgemm.quantize(w, block=(128, 128))       # (2, 2, 1): per expert
    >>> y = jaxgemm.scaled_ragged_dot(x8, w8, jnp.array([2, 3]), sx, sw,
    ...                               out_dtype=jnp.float32)   # rows 0-1, 2-4; row 5 zero
    >>> [round(v, 3) for v in y[:, 0].tolist()]
    [128.0, 128.0, 256.0, 256.0, 256.0, 0.0]

  The ragged-K form, per group X[rows g]^T @ dY[rows g] (row 5 in no group):
    >>> from jaxgemm.ops.scaled_ragged_dot.api import RAGGED_K_NUMBERS
    >>> dy8, sdy = jaxgemm.quantize(jnp.ones((6, 8)), block=(128, 1))    # (1, 8)
    >>> x8, sx = jaxgemm.quantize(x, block=(128, 1))                    # (1, 256)
    >>> dw = jaxgemm.scaled_ragged_dot(x8, dy8, jnp.array([2, 3]), sx, sdy,
    ...                                ragged_dot_dimension_numbers=RAGGED_K_NUMBERS)
    >>> dw.shape, dw[:, 0, 0].tolist()
    ((2, 256, 8), [2.0, 3.0])
  """
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  numbers = ragged_dot_dimension_numbers
  if numbers is not None and not isinstance(numbers, lax.RaggedDotDimensionNumbers):
    raise TypeError(f"scaled_ragged_dot's ragged_dot_dimension_numbers must be None or a "
                    f"lax.RaggedDotDimensionNumbers, e.g. RAGGED_K_NUMBERS = "
                    f"{RAGGED_K_NUMBERS} (the ragged-K form); got {type(numbers).__name__} "
                    f"{numbers!r}")
  if numbers is None or numbers == RAGGED_DOT_NUMBERS:
    pass
  elif numbers == RAGGED_K_NUMBERS:
    return _ragged_k(lhs, rhs, group_sizes, lhs_scale, rhs_scale, out_dtype, backend,
                     variant, config)
  else:
    raise ValueError(f"scaled_ragged_dot's ragged_dot_dimension_numbers={numbers!r} is not "
                     f"one of its forms: None or {RAGGED_DOT_NUMBERS} (ragged-M, "
                     f"lax.ragged_dot's), or {RAGGED_K_NUMBERS} (ragged-K, the weight "
                     f"gradient: RAGGED_K_NUMBERS)")
  _check_operand(lhs, "lhs", 2, "(M, K)")
  _check_operand(rhs, "rhs", 3, "(G, K, N)")
  m, k = lhs.shape
  groups, k_rhs, n = rhs.shape
  if k != k_rhs:
    raise TypeError(f"scaled_ragged_dot's contracting dimensions differ: lhs.shape={lhs.shape} "
                    f"has K={k}, rhs.shape={rhs.shape} has K={k_rhs}")
  _check_group_sizes(group_sizes, groups, "one size per expert of rhs")
  out_dtype = dtype_among(out_dtype, OUT_DTYPES, "scaled_ragged_dot", "out_dtype")
  kb, nb = blocks(k), blocks(n)
  lhs_kind, lhs_scale = _scale_kind(lhs_scale, "lhs_scale", {
      "row_col": ((m, 1), "per row (quantize(lhs, block=(1, None)))"),
      "block": ((m, kb), "1x128 blocks along K (quantize(lhs, block=(1, 128)))")})
  rhs_kind, rhs_scale = _scale_kind(rhs_scale, "rhs_scale", {
      "row_col": ((groups, 1, n), "per column of each expert (quantize(rhs, block=(None, 1)))"),
      "block": ((groups, kb, nb), "128x128 blocks of each expert "
                                  "(quantize(rhs, block=(128, 128)))")})
  kind = max(lhs_kind, rhs_kind, key=_RANK.get)
  if kind == "block" and rhs_kind == "row_col":
    raise ValueError(f"scaled_ragged_dot's rhs_scale is per column, shape {rhs_scale.shape}, "
                     f"and lhs_scale has 1x128 blocks: a column scale is not a 128x128 block "
                     f"scale. Valid with block lhs scales: rhs_scale () or {(groups, kb, nb)} "
                     f"(quantize(rhs, block=(128, 128))); or quantize lhs per row "
                     f"(block=(1, None)) or per tensor")
  # Power-of-two scales stay so only in pairs: one float32 scale makes the product's
  # scale any float32.
  scale_dtype = (np.dtype(lhs_scale.dtype) if lhs_scale.dtype == rhs_scale.dtype
                 else SCALE_DTYPE)
  # The lower kind's scale broadcast to the other's (a few floats).
  if lhs_kind != kind:
    lhs_scale = jnp.broadcast_to(lhs_scale, (m, 1 if kind == "row_col" else kb))
  if rhs_kind != kind:
    rhs_scale = jnp.broadcast_to(rhs_scale, (groups, 1, n) if kind == "row_col"
                                 else (groups, kb, nb))
  if kind != "tensor":   # the canonical batch dimension
    lhs_scale, rhs_scale = lhs_scale[None], rhs_scale[None]
  problem = ScaledRaggedDotProblem(1, groups, m, k, n, np.dtype(lhs.dtype), out_dtype,
                                   np.dtype(rhs.dtype), kind, scale_dtype)
  params = gemm.kernel_params(problem, backend, variant, config, None)
  out = bind(lhs[None], rhs[None], ragged_schedule.group_bounds(group_sizes[None], m),
             lhs_scale.astype(scale_dtype), rhs_scale.astype(scale_dtype),
             out_dtype=out_dtype, scale_kind=kind, **params)
  return out[0]


def _ragged_k(lhs, rhs, group_sizes, lhs_scale, rhs_scale, out_dtype, backend, variant, config):
  """The ragged-K form (`scaled_ragged_dot`'s docstring): checked, its scales brought to the
  canonical kind (blocks of 128 tokens broadcast over their 128 columns where quantized
  128x128; a per-tensor scale beside blocks broadcast to them), bound."""
  _check_operand(lhs, "lhs", 2, "(M, K) in the ragged-K form")
  _check_operand(rhs, "rhs", 2, "(M, N) in the ragged-K form")
  m, k = lhs.shape
  m_rhs, n = rhs.shape
  if m != m_rhs:
    raise TypeError(f"scaled_ragged_dot's contracting dimensions differ (ragged-K): "
                    f"lhs.shape={lhs.shape} has M={m}, rhs.shape={rhs.shape} has M={m_rhs}")
  if group_sizes.ndim != 1:
    raise TypeError(f"scaled_ragged_dot's group_sizes.shape={group_sizes.shape} must be "
                    f"(G,) in the ragged-K form")
  groups = group_sizes.shape[0]
  _check_group_sizes(group_sizes, groups, "one size per group")
  out_dtype = dtype_among(out_dtype, OUT_DTYPES, "scaled_ragged_dot", "out_dtype")
  mb = blocks(m)
  scales = []
  for name, scale, cols, col in (("lhs_scale", lhs_scale, k, "K"),
                                 ("rhs_scale", rhs_scale, n, "N")):
    kind, scale = _scale_kind(scale, name, {
        "block": ((mb, cols), f"128x1 blocks: 128 tokens of each of the {col} columns "
                              f"(quantize({name[:3]}, block=(128, 1)))"),
        "tile": ((mb, blocks(cols)), f"128x128 blocks (quantize({name[:3]}, "
                                     f"block=(128, 128)))")})
    if kind == "tile":   # each block's scale over its 128 columns: the canonical 128x1
      scale = jnp.repeat(scale, BLOCK, axis=1, total_repeat_length=blocks(cols) * BLOCK
                         )[:, :cols]
    scales.append((kind, scale))
  (lhs_kind, lhs_scale), (rhs_kind, rhs_scale) = scales
  kind = "tensor" if lhs_kind == rhs_kind == "tensor" else "block"
  scale_dtype = (np.dtype(lhs_scale.dtype) if lhs_scale.dtype == rhs_scale.dtype
                 else SCALE_DTYPE)
  if kind == "block":   # a per-tensor scale beside blocks: broadcast (a few floats)
    lhs_scale = jnp.broadcast_to(lhs_scale, (mb, k))[None]
    rhs_scale = jnp.broadcast_to(rhs_scale, (mb, n))[None]
  problem = ScaledRaggedDotProblem(1, groups, m, k, n, np.dtype(lhs.dtype), out_dtype,
                                   np.dtype(rhs.dtype), kind, scale_dtype,
                                   ragged_contracting=True)
  params = gemm.kernel_params(problem, backend, variant, config, None)
  out = bind(lhs[None], rhs[None], ragged_schedule.group_bounds(group_sizes[None], m),
             lhs_scale.astype(scale_dtype), rhs_scale.astype(scale_dtype),
             out_dtype=out_dtype, scale_kind=kind, ragged_contracting=True, **params)
  return out[0]
