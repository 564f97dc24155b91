"""The FP8 training path: `jaxgemm.matmul(x, w, fp8=recipe)` on bf16 (or f16/f32) values.

Every call quantizes its operands on the fly (current scaling: each scale from
the amax of the values at hand, no history) and runs three FP8 GEMMs through
`scaled_matmul`, one forward and two in the VJP, for Y = X W with X (M, K)
(leading dimensions join M) and W (K, N):

    forward  Y  = (X8 * sx) @ (W8 * sw)              scaled_matmul(x8, w8t, sx, swt, trans_b=True)
    dgrad    dX = (dY8 * sdy) @ (W8 * sw)^T          ... (dy8, w8, sdy, sw, trans_b=True)
    wgrad    dW = (X8' * sx')^T @ (dY8' * sdy')      ... (x8t, dy8t, sxt, sdyt, trans_b=True)

FP8 wgmma (and cuBLAS's FP8 GEMM) read both operands K-major, so each tensor is
quantized in both orientations (`quantize_pair`: x8 and x8t = X'8^T, ...) and
every GEMM gets K-major operands, with no transpose left to the GEMM. The
backward reuses the forward's W8 and sw, and X'8^T and its scales, saved at one
byte per element. How the scales cover the operands is the recipe's:

    scaling    X (forward)   W           dY (dgrad)   X' (wgrad)    dY' (wgrad)
    "tensor"   one scale     one         one          X8, sx        dY8, sdy
    "block"    1x128         128x128     1x128        128x1         128x128

With block scales, the wgrad's operands are blocked along M, its contraction
(the DeepSeek-V3 recipe quantizes its wgrad inputs along the contraction too).
`Fp8Recipe.quantize_backend` picks who quantizes: XLA, or one Triton kernel per
tensor that reads it once and writes both orientations ("auto": the kernel on a
GPU, where it partitions with a sharded operand; XLA otherwise).

Gradients come out in the primals' dtypes, the result in `out_dtype` (the
promoted input dtype, as jnp.matmul's). jit, grad (first order; the VJP is a
`jax.custom_vjp`, so forward-mode `jax.jvp` is not defined) and vmap (through
`scaled_matmul_p`'s batching rule) apply; a sharded X or W shards the GEMMs as
`scaled_matmul` does, and per-tensor amaxes reduce over the whole array under
`jit` (XLA inserts the collective). With Explicit mesh axes the result takes
`out_sharding` as jnp.matmul's does (needed where X and W are both sharded
along K), and dX and dW their primals' shardings, as `matmul_p`'s backward.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxgemm import sharding
from jaxgemm.gemm import FP8_DTYPES, SCALE_DTYPES
from jaxgemm.ops.fused_matmul.api import check_epilogue, reference_epilogue
from jaxgemm.ops.scaled_matmul.api import scaled_matmul
from jaxgemm.ops.scaled_matmul.problem import OUT_DTYPES
from jaxgemm.ops.scaled_matmul.quantize import E8M0, QUANTIZE_BACKENDS, quantize_pair

SCALINGS = ("tensor", "block")
E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)


@dataclasses.dataclass(frozen=True)
class Fp8Recipe:
  """How `jaxgemm.matmul(x, w, fp8=recipe)` quantizes its GEMMs' operands.

  Attributes:
    scaling: "tensor" (one scale per operand) or "block" (1x128 activation and
      gradient blocks, 128x128 weight blocks: the DeepSeek-V3 recipe; see
      `jaxgemm.ops.scaled_matmul.training`). A NaN or Inf makes its scale NaN
      (the scale is the amax over the values it covers): per tensor, one NaN in
      x or w makes the whole output NaN (a bf16 GEMM: its row or column only);
      with blocks, the outputs its block feeds (a 1x128 block of x: its row).
    dtype: the fp8 type of X and W (float8_e4m3fn: 3 mantissa bits, max 448).
    grad_dtype: the fp8 type of dY. float8_e5m2 (2 mantissa bits, max 57344)
      spans the wider range a gradient needs under one per-tensor scale; with
      block scales each block has its own range, and e4m3's extra bit wins.
    scale_dtype: "float32", or "float8_e8m0fnu" for power-of-two scales
      (`jaxgemm.quantize`'s scale_dtype): each scale rounded up to a power of
      two, at most one binade of fp8 range lost, so that XLA's cuBLAS FP8
      GEMMs (the per-tensor recipe's mixed e5m2 x e4m3 dgrad and wgrad) write
      bf16 directly instead of fp32 and a convert (1.9 ms of the per-tensor
      step on an H100, the fp8-fused-quant probe's run8b at 21b052b).
    backend: the scaled_matmul backend of all three GEMMs ("auto", "xla",
      "triton", "pallas").
    quantize_backend: who quantizes each operand in both orientations
      (`quantize_pair`): "xla" (jnp: XLA fuses the amaxes, casts and fp8
      transposes into its own passes), "triton" (one cast-transpose kernel per
      tensor), or "auto": "triton" on a GPU, "xla" elsewhere. The kernel
      partitions like its operand: each device quantizes its own block of it
      (with block scales, where its rows and columns are whole 128-blocks;
      otherwise that dimension is gathered for it,
      `jaxgemm.ops.scaled_matmul.cast_transpose`).

  The named recipes, as `fp8=` takes them: "tensor" = Fp8Recipe("tensor",
  grad_dtype=e5m2, scale_dtype=e8m0) and "block" = Fp8Recipe("block",
  grad_dtype=e4m3). Per tensor, the power-of-two scales and the Triton
  quantizer took the bench's FP8 step from 1.14-1.15x to 1.245-1.255x of XLA's
  bf16 step (H100, paired timing, the fp8-fused-quant probe's runs 10-13 at f0b6981 to 7d3d88d),
  the loss after 100 steps 0.01-0.12% from bf16's; with block scales the
  quantizer took it from 0.93-0.95x to 1.07-1.09x.

  >>> Fp8Recipe.named("block")
  Fp8Recipe(scaling='block', dtype='float8_e4m3fn', grad_dtype='float8_e4m3fn', scale_dtype='float32', backend='auto', quantize_backend='auto')
  """

  scaling: str = "block"
  dtype: str = "float8_e4m3fn"
  grad_dtype: str = "float8_e4m3fn"
  scale_dtype: str = "float32"
  backend: str = "auto"
  quantize_backend: str = "auto"

  def __post_init__(self):
    if self.scaling not in SCALINGS:
      raise ValueError(f"Fp8Recipe's scaling={self.scaling!r} must be one of {SCALINGS}")
    for field, allowed in (("dtype", FP8_DTYPES), ("grad_dtype", FP8_DTYPES),
                           ("scale_dtype", SCALE_DTYPES)):
      value = getattr(self, field)
      try:
        name = np.dtype(value).name
      except TypeError:
        name = None
      if name not in [d.name for d in allowed]:
        raise TypeError(f"Fp8Recipe's {field}={value!r} must be one of "
                        f"{[d.name for d in allowed]}")
      object.__setattr__(self, field, name)   # a name: hashable, printable, serializable
    if not isinstance(self.backend, str):
      raise TypeError(f"Fp8Recipe's backend={self.backend!r} must be a backend name")
    if self.quantize_backend not in ("auto", *QUANTIZE_BACKENDS):
      raise ValueError(f"Fp8Recipe's quantize_backend={self.quantize_backend!r} must be one "
                       f"of {('auto', *QUANTIZE_BACKENDS)}")

  @classmethod
  def named(cls, recipe) -> "Fp8Recipe":
    """`recipe` itself, or the recipe a name ("tensor", "block") stands for."""
    if isinstance(recipe, cls):
      return recipe
    if recipe == "tensor":
      return cls("tensor", grad_dtype=E5M2.name, scale_dtype=E8M0.name)
    if recipe == "block":
      return cls("block", grad_dtype=E4M3.name)
    raise ValueError(f"fp8={recipe!r} must be an Fp8Recipe or one of {SCALINGS}")

  def blocks(self, role: str):
    """quantize's block for each operand role (see the module docstring's table)."""
    if self.scaling == "tensor":
      return None
    return {"x": (1, 128), "w": (128, 128), "dy": (1, 128),
            "x_wgrad": (128, 1), "dy_wgrad": (128, 128)}[role]

  def quantize_pair(self, x, role: str):
    """(q, scale, q_t, scale_t) of operand `role` ("x", "w", "dy") and of its transpose as
    the GEMM that reads it transposed takes it (X^T and dY^T: the wgrad's; W^T: the
    forward's)."""
    dtype = self.grad_dtype if role == "dy" else self.dtype
    block = self.blocks(role)
    block_t = block if role == "w" else self.blocks(role + "_wgrad")
    if block_t is not None:
      block_t = block_t[::-1]   # quantize's block over x^T
    return quantize_pair(x, dtype, block, block_t, scale_dtype=self.scale_dtype,
                         backend=self._quantizer())

  def _quantizer(self) -> str:
    if self.quantize_backend != "auto":
      return self.quantize_backend
    # The kernel took the step from 1.15x to 1.245-1.255x of XLA's bf16 step per
    # tensor (with power-of-two scales) and from 0.94x to 1.07-1.09x with block
    # scales (H100, the fp8-fused-quant probe's runs 10-13,
    # at f0b6981 to 7d3d88d), and partitions with
    # its operand.
    return "triton" if jax.default_backend() == "gpu" else "xla"


def fp8_matmul(x, w, recipe: Fp8Recipe, out_dtype, out_sharding=None) -> jax.Array:
  """`x @ w` with X (..., K) and W (K, N) through three FP8 GEMMs (the module docstring).

  `out_sharding` (None or a NamedSharding, `jaxgemm.sharding.canonical_out_sharding`)
  is the (..., N) result's, as jnp.matmul's; the dgrad and wgrad take their primals'.

  >>> import jax, jax.numpy as jnp
  >>> x = jnp.ones((256, 256), jnp.bfloat16); w = jnp.full((256, 128), 0.5, jnp.bfloat16)
  >>> recipe = Fp8Recipe("tensor", backend="xla")
  >>> float(fp8_matmul(x, w, recipe, jnp.bfloat16)[0, 0])
  128.0
  >>> jax.grad(lambda w: fp8_matmul(x, w, recipe, jnp.float32).sum())(w).dtype
  dtype(bfloat16)
  """
  k, n = w.shape
  # The GEMMs take X as 2-D rows. With Explicit axes, jax merges X's leading dimensions
  # only where the sharded ones lead (a sequence-sharded (B, S, K) x has no such rows), so
  # those go first: a transpose of each device's own block, undone on the result. Per
  # tensor the rows' order changes no quantized value (only the wgrad's summation order);
  # block scales group the wgrad's 128 rows in order, so there it would (3.5% of dW in
  # tests/sharding_on_8_devices.py's x-on-seq case), and it is refused.
  order = _sharded_first(x)
  if order and recipe.scaling == "block":
    spec = sharding.padded_spec(sharding.type_sharding(jax.typeof(x)).spec, x.ndim)
    raise ValueError(
        f"matmul with fp8 block scales quantizes the weight gradient's operands in blocks of "
        f"128 of x's rows in order, which x's sharding {spec} (Explicit axes) splits across "
        f"devices: shard x's leading dimension instead (or reshape x to 2-D), or use "
        f"fp8='tensor', whose values do not depend on the rows' order")
  x = jnp.transpose(x, order) if order else x
  if order and out_sharding is not None:
    out_spec = sharding.padded_spec(out_sharding.spec, x.ndim)
    out_sharding = out_sharding.update(spec=P(*(out_spec[d] for d in order)))
  x2 = x.reshape(-1, k)
  rows_out = None if out_sharding is None else sharding.leading_dims_merged(out_sharding, x.ndim)
  y = _fp8_matmul(recipe, (np.dtype(out_dtype), rows_out), _type_of(x2), _type_of(w), x2, w)
  y = y.reshape(*x.shape[:-1], n, out_sharding=out_sharding)
  return jnp.transpose(y, tuple(np.argsort(order))) if order else y


def _sharded_first(x) -> tuple[int, ...] | None:
  """The permutation of x's dimensions that puts its sharded leading dimensions (Explicit
  axes) before the unsharded ones, the last dimension last; None where they lead already."""
  typed = sharding.type_sharding(jax.typeof(x))
  if typed is None or x.ndim < 3:
    return None
  spec = sharding.padded_spec(typed.spec, x.ndim)[:-1]
  order = ([d for d, e in enumerate(spec) if e is not None]
           + [d for d, e in enumerate(spec) if e is None])
  return None if order == sorted(order) else (*order, x.ndim - 1)


def _type_of(x):
  """(dtype, sharding or None): the type a GEMM gives x's gradient (`_backward`)."""
  return np.dtype(x.dtype), sharding.type_sharding(jax.typeof(x))


def _gemm(recipe, a8, b8, sa, sb, out_type, **trans):
  out_dtype, out_sharding = out_type
  return scaled_matmul(a8, b8, sa, sb, out_dtype=out_dtype, out_sharding=out_sharding,
                       backend=recipe.backend, **trans)


def _forward(recipe, out_type, x_type, w_type, x, w):
  """Y of a 2-D X, and what the backward needs (arrays only)."""
  x8, sx, x8t, sxt = recipe.quantize_pair(x, "x")
  w8, sw, w8t, swt = recipe.quantize_pair(w, "w")
  y = _gemm(recipe, x8, w8t, sx, swt, out_type, trans_b=True)
  return y, (x8t, sxt, w8, sw)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _fp8_matmul(recipe, out_type, x_type, w_type, x, w):
  return _forward(recipe, out_type, x_type, w_type, x, w)[0]


def _backward(recipe, out_type, x_type, w_type, saved, dy):
  # Each gradient in its primal's dtype and sharding, as matmul_p's backward GEMMs:
  # with Explicit mesh axes the dgrad over a sharded N and the wgrad over sharded
  # rows would otherwise be "ambiguous" (jax's ShardingTypeError).
  x8t, sxt, w8, sw = saved
  dy8, sdy, dy8t, sdyt = recipe.quantize_pair(dy, "dy")
  dx = _gemm(recipe, dy8, w8, sdy, sw, x_type, trans_b=True)
  dw = _gemm(recipe, x8t, dy8t, sxt, sdyt, w_type, trans_b=True)
  return dx, dw


_fp8_matmul.defvjp(_forward, _backward)


def matmul(a, b, fp8, *, bias=None, activation=None, residual=None, precision=None,
           preferred_element_type=None, out_sharding=None, backend="auto", variant=None,
           config=None) -> jax.Array:
  """`jaxgemm.matmul(a, b, fp8=...)`: the arguments checked, then `fp8_matmul` and the
  epilogue (bias, activation, residual) as XLA ops after it. `out_sharding` is the
  forward GEMM's, as jnp.matmul's (needed where a sharded K makes it ambiguous); the
  backward's GEMMs give each gradient its primal's sharding."""
  recipe = Fp8Recipe.named(fp8)
  if backend != "auto":
    if recipe.backend not in ("auto", backend):
      raise ValueError(f"backend={backend!r} and fp8's backend={recipe.backend!r} differ; "
                       f"name the backend once")
    recipe = dataclasses.replace(recipe, backend=backend)
  for name, value in (("variant", variant), ("config", config), ("precision", precision)):
    if value is not None:
      raise ValueError(f"matmul with fp8={fp8!r} takes no {name} (got {name}={value!r}): "
                       f"it runs three GEMMs of different shapes, each scaled_matmul's own "
                       f"choice; call jaxgemm.scaled_matmul for one kernel of your choosing")
  out_sharding = sharding.canonical_out_sharding(out_sharding, "matmul")
  a, b = jnp.asarray(a), jnp.asarray(b)
  if b.ndim != 2:
    raise ValueError(f"matmul with fp8= takes a 2-D weight b (K, N); got b.shape={b.shape} "
                     f"(vmap over a stack of weights instead)")
  if a.ndim < 1 or a.shape[-1] != b.shape[0]:
    raise ValueError(f"matmul with fp8= takes a (..., K) with K = b.shape[0] = {b.shape[0]}; "
                     f"got a.shape={a.shape}")
  for name, x in (("a", a), ("b", b)):
    if not jnp.issubdtype(x.dtype, jnp.floating) or np.dtype(x.dtype) in FP8_DTYPES:
      raise TypeError(f"matmul with fp8= quantizes floating {name} (bfloat16, float16, "
                      f"float32) itself; got {name}.dtype={x.dtype} (for operands already "
                      f"in fp8, call jaxgemm.scaled_matmul)")
  out_dtype = np.dtype(preferred_element_type or jnp.result_type(a, b))
  if out_dtype not in OUT_DTYPES:
    raise TypeError(f"matmul with fp8= returns one of {[d.name for d in OUT_DTYPES]}; got "
                    f"result dtype {out_dtype.name} (pass preferred_element_type)")
  out_shape = (*a.shape[:-1], b.shape[1])
  check_epilogue(out_shape, out_dtype, bias, activation, residual)
  y = fp8_matmul(a, b, recipe, out_dtype, out_sharding)   # a 1-D a is one row
  return reference_epilogue(y, bias, activation, residual)
