"""The `xla` backend of scaled_matmul: XLA's own programs of the scaled product.

What a user writes without jaxgemm, and what `backend="auto"` runs and the
benchmark compares against. Two variants:

"dot_general" (the default, XLA's FP8 GEMM; exact up to fp32 accumulation and
the output's rounding):

* "tensor" and "row_col": `(dot(a8, b8, preferred_element_type=f32) * (sa * sb)).astype(out)`,
  the scales applied to the fp32 accumulator (the issue's "scaled form"); with
  power-of-two scales and a bf16 result on the GPU,
  `dot(a8, b8, preferred_element_type=bf16) * (sa * sb)`, the same values;
* "block": a sum over 128-wide K blocks of fp32 partial products, each times its
  blocks' scales (a_scale[:, m, kb] * b_scale[:, kb, n // 128]), in a
  `lax.fori_loop` (K zero-padded to whole blocks), so memory stays that of the
  result: XLA has no fused block-scaled GEMM on Hopper.

Accumulation is fp32 (XLA's dot of fp8 operands with an fp32 result) at
precision HIGHEST unless the call names one: at XLA's default, its cuBLASLt FP8
GEMM accumulates in the tensor cores' reduced precision (fast accumulation), off
the exact dequantized product by 2.6e-3 at 8192^3 where HIGHEST and the
kernels are 1.7e-3, i.e. the bf16 output's rounding alone, for 6% more time
(H100, the FP8 kernel probe's run 2 at eeb0d94). The one rounding is
to out_dtype at the end.

"dequantize_bf16" (`dequantized_product`): the operands dequantized to bfloat16
and XLA's bf16 dot of them, accumulated in fp32: what a user without an FP8
kernel writes (issue 44: with block scales at 128 rows our kernels ran 0.51x
(H100) and 0.39x (H200) of it; XLA's block loop above is slower still). Where
the scales factor out of the sum ("tensor", "row_col") the fp8 values are
widened to bf16, which is exact (e4m3 and e5m2 values have 4 and 3 significant
bits and exponents inside bf16's), and the scales multiply the fp32 accumulator
as above: the same numbers as "dot_general" up to summation order. With block
scales each element times its block's scale is rounded to bf16 before the dot.
That is a real extra error: bf16 keeps 8 significant bits, so each dequantized
element is off by up to u = 2**-8 of itself, each product by up to 2u, and an
element of the result by up to 2u * (|A| @ |B|) (rigorous). Norm-wise, for
random-signed data with independent roundings, about sqrt(2/3) * u * 0.74 =
2.3e-3 of ||C|| (two operands, uniform rounding within a step, log-distributed
mantissas), beside the bf16 output's own 1.7e-3: together about 2.9e-3 (read
2.8e-3 to 3.2e-3 on the CPU, against 1.6e-3 to 1.8e-3 for "dot_general";
tests/test_scaled_matmul_xla.py). With power-of-two scales (float8_e8m0fnu)
the dequantized values are exact while they stay within bf16's normal range
(fp32's, where `jaxgemm.quantize`'s are), and there is no extra error.
`tuning_candidates` offers it to the autotuner where that extra error is none
or of the output's own rounding's size (a bf16 result: 1.4x it), not with
float32 block scales and a float16 or float32 result, whose rounding is 8x and
2**16x finer than the operands' bf16 (named, it runs there too).

Not a variant (reasoned, not measured): "XLA's FP8 dot with b transposed to
(N, K) first". XLA's GEMM rewriter already does that for a b stored (K, N):
cuBLASLt's FP8 GEMM takes both operands K-major, so it inserts a transpose of b
before the custom call (`gemm_rewriter.cc`: "cuBLASLt requires the second
operand to be column-major"), a pass over the weight on every call, and writing
the transpose ourselves builds the same program. XLA's FP8 GEMM is fast (1141
TFLOP/s at 2048x5120x5120 per tensor, where our kernel ran 819 on (K, N); issue
44) on a weight *stored* (N, K): the transpose paid once, outside the step,
which only the caller can do, by storing it so and calling with `trans_b=True`
(the benchmark measures XLA on both layouts). A variant would pay the same
transpose per call, or count on XLA constant-folding it, which it does not for a
weight passed as an argument; so it is not a candidate.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import registry
from jaxgemm.ops.matmul.xla import XlaConfig
from jaxgemm.gemm import BLOCK, FP8_DTYPES
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem

F32, BF16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)


def _dims(problem: ScaledMatmulProblem):
  """dot_general's dimension numbers on the canonical 3-D operands."""
  return (((1 if problem.trans_a else 2,), (2 if problem.trans_b else 1,)), ((0,), (0,)))


def scaled_product(problem: ScaledMatmulProblem, a, b, a_scale, b_scale, platform="cpu"):
  """The problem's result from canonical operands, in XLA ops (see the module docstring)."""
  dims = _dims(problem)
  precision = problem.precision or lax.Precision.HIGHEST   # fp32 accumulation (docstring)
  dot = lambda x, y, out=F32: lax.dot_general(x, y, dims, precision=precision,
                                              preferred_element_type=out)
  a_scale, b_scale = a_scale.astype(F32), b_scale.astype(F32)
  if problem.scale_kind != "block":
    scale = a_scale * b_scale   # () or (B, M, 1) * (B, 1, N): the accumulator's shape
    if problem.pow2_scales and problem.out_dtype == BF16 and platform == "cuda":
      # cuBLASLt rounds its fp32 sum to bf16 once, and a power of two times a bf16
      # value is exact (bf16 spans fp32's exponents): the same result as the fp32 form
      # below, without its fp32 write and convert pass (the FP8 step: 30.7 -> 28.8 ms
      # on an H100, the FP8 step probe's run7 at ec8d3b6). XLA:CPU is not
      # known to accumulate a bf16 dot in fp32, so it keeps the fp32 form.
      return dot(a, b, BF16) * scale.astype(BF16)
    return (dot(a, b) * scale).astype(problem.out_dtype)
  kb = problem.k_blocks
  if kb == 0:
    return jnp.zeros(problem.out_shape, problem.out_dtype)
  ka, kb_axis = (1 if problem.trans_a else 2), (2 if problem.trans_b else 1)
  pad = kb * BLOCK - problem.k
  if pad:
    a = jnp.pad(a, [(0, pad) if d == ka else (0, 0) for d in range(3)])
    b = jnp.pad(b, [(0, pad) if d == kb_axis else (0, 0) for d in range(3)])
  # b's scale per column: each 128-column block's scale repeated over its columns.
  b_cols = jnp.repeat(b_scale, BLOCK, axis=2, total_repeat_length=problem.n_blocks * BLOCK)
  b_cols = b_cols[:, :, :problem.n]   # (B, Kb, N)

  def step(i, acc):
    a_i = lax.dynamic_slice_in_dim(a, i * BLOCK, BLOCK, axis=ka)
    b_i = lax.dynamic_slice_in_dim(b, i * BLOCK, BLOCK, axis=kb_axis)
    sa = lax.dynamic_slice_in_dim(a_scale, i, 1, axis=2)      # (B, M, 1)
    sb = lax.dynamic_slice_in_dim(b_cols, i, 1, axis=1)       # (B, 1, N)
    return acc + dot(a_i, b_i) * sa * sb

  acc = lax.fori_loop(0, kb, step, jnp.zeros(problem.out_shape, F32))
  return acc.astype(problem.out_dtype)


def _block_scales_expanded(problem: ScaledMatmulProblem, a_scale, b_scale):
  """Each element's scale, as the operands are stored: a_scale (B, M, Kb) repeated over
  its 1x128 blocks, b_scale (B, Kb, Nb) over its 128x128 blocks (partial last blocks cut)."""
  k, m, n = problem.k, problem.m, problem.n
  kb, nb = problem.k_blocks, problem.n_blocks
  a_full = jnp.repeat(a_scale, BLOCK, axis=2, total_repeat_length=kb * BLOCK)[:, :, :k]
  b_full = jnp.repeat(b_scale, BLOCK, axis=1, total_repeat_length=kb * BLOCK)[:, :k]
  b_full = jnp.repeat(b_full, BLOCK, axis=2, total_repeat_length=nb * BLOCK)[:, :, :n]
  if problem.trans_a:
    a_full = jnp.swapaxes(a_full, 1, 2)   # (B, K, M), as a is stored
  if problem.trans_b:
    b_full = jnp.swapaxes(b_full, 1, 2)   # (B, N, K)
  return a_full, b_full


def dequantized_product(problem: ScaledMatmulProblem, a, b, a_scale, b_scale, platform="cpu"):
  """The "dequantize_bf16" variant: the operands dequantized to bf16, XLA's bf16 dot.

  Exact widening and the scales on the fp32 accumulator for "tensor" and
  "row_col" scales; block-scaled operands rounded to bf16 once dequantized (the
  module docstring says what that costs). fp32 accumulation; with a bf16 result
  on the GPU the dot writes it directly (cuBLAS sums in fp32 and rounds once).

  Example: 0.3 quantizes to 448 times a block scale of 0.3 / 448, which dequantizes
  to 0.3 in fp32 ("dot_general": 38.4) and to 0.30078125 in bf16 (256 * 0.5 * that):
    >>> import jax.numpy as jnp, jaxgemm
    >>> x8, sx = jaxgemm.quantize(jnp.full((4, 256), 0.3), block=(1, 128))
    >>> w8, sw = jaxgemm.quantize(jnp.full((256, 8), 0.5), block=(128, 128))
    >>> y = jaxgemm.scaled_matmul(x8, w8, sx, sw, out_dtype=jnp.float32, backend="xla",
    ...                           variant="dequantize_bf16")
    >>> float(y[0, 0])
    38.5
  """
  dims = _dims(problem)
  dot = lambda x, y, out: lax.dot_general(x, y, dims, precision=problem.precision,
                                          preferred_element_type=out)
  a_scale, b_scale = a_scale.astype(F32), b_scale.astype(F32)
  if problem.scale_kind != "block":
    a16, b16 = a.astype(BF16), b.astype(BF16)   # exact: every fp8 value is a bf16 value
    scale = a_scale * b_scale
    if problem.pow2_scales and problem.out_dtype == BF16 and platform == "cuda":
      return dot(a16, b16, BF16) * scale.astype(BF16)   # exact scaling, as scaled_product's
    return (dot(a16, b16, F32) * scale).astype(problem.out_dtype)
  a_full, b_full = _block_scales_expanded(problem, a_scale, b_scale)
  # The product in fp32 (exact but for fp32's rounding of the fp32 scale's digits), then
  # the one rounding to bf16: XLA fuses the expansion, multiply and convert into one pass.
  a16 = (a.astype(F32) * a_full).astype(BF16)
  b16 = (b.astype(F32) * b_full).astype(BF16)
  direct = problem.out_dtype == BF16 and platform == "cuda"
  return dot(a16, b16, BF16 if direct else F32).astype(problem.out_dtype)


def dequantize_rounds(problem: ScaledMatmulProblem) -> bool:
  """Whether "dequantize_bf16" rounds the dequantized operands (float32 block scales),
  an error beyond "dot_general"'s (the module docstring)."""
  return problem.scale_kind == "block" and not problem.pow2_scales


class XlaScaledMatmul(registry.Backend):
  op = "scaled_matmul"
  name = "xla"
  # Both variants' code is this module: an edit stales the records of both.
  kernel_modules = ("jaxgemm.ops.scaled_matmul.xla",)
  config_cls = XlaConfig
  # "dot_general" last: it is the backend's default (`default_variant`) and the rung
  # XLA's own tuning record is kept under (`jaxgemm.tuning`, the xla backend's last).
  variants = ("dequantize_bf16", "dot_general")
  PROGRAMS = {"dequantize_bf16": dequantized_product, "dot_general": scaled_product}

  def check(self, problem: ScaledMatmulProblem, variant: str, config) -> None:
    for what, dtype in (("a", problem.dtype), ("b", problem.b_dtype)):
      if np.dtype(dtype) not in FP8_DTYPES:
        raise NotImplementedError(f"backend='xla' scaled_matmul (variant={variant!r}) takes "
                                  f"fp8 operands {[d.name for d in FP8_DTYPES]}; got "
                                  f"{what}.dtype={np.dtype(dtype).name}")

  def default_variant(self, problem: ScaledMatmulProblem) -> str:
    """"dot_general", XLA's FP8 GEMM, whatever the problem: "dequantize_bf16" may round
    the operands (the module docstring), so it runs where named or measured faster."""
    return "dot_general"

  def tuning_candidates(self, problem: ScaledMatmulProblem):
    """XLA's FP8 GEMM, then the dequantized bf16 dot where its extra error is within the
    output's own rounding: everywhere but float32 block scales with a float16 or
    float32 result (whose rounding is 8x and 2**16x finer than the operands' bf16)."""
    out = [("dot_general", XlaConfig())]
    if not dequantize_rounds(problem) or np.dtype(problem.out_dtype) == BF16:
      out.append(("dequantize_bf16", XlaConfig()))
    return out

  def default_config(self, problem: ScaledMatmulProblem, variant: str) -> XlaConfig:
    return XlaConfig()

  def impl(self, problem: ScaledMatmulProblem, variant: str, config, platform: str):
    program = self.PROGRAMS[variant]
    return lambda a, b, a_scale, b_scale: program(problem, a, b, a_scale, b_scale, platform)


registry.register(XlaScaledMatmul())
