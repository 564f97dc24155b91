"""The `xla` backend of scaled_matmul: XLA's own program of the scaled product.

What a user writes without jaxgemm, and what `backend="auto"` runs and the
benchmark compares against:

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


class XlaScaledMatmul(registry.Backend):
  op = "scaled_matmul"
  name = "xla"
  kernel_modules = ("jaxgemm.ops.scaled_matmul.xla",)
  config_cls = XlaConfig
  variants = ("dot_general",)

  def check(self, problem: ScaledMatmulProblem, variant: str, config) -> None:
    for what, dtype in (("a", problem.dtype), ("b", problem.b_dtype)):
      if np.dtype(dtype) not in FP8_DTYPES:
        raise NotImplementedError(f"backend='xla' scaled_matmul takes fp8 operands "
                                  f"{[d.name for d in FP8_DTYPES]}; got {what}.dtype="
                                  f"{np.dtype(dtype).name}")

  def default_config(self, problem: ScaledMatmulProblem, variant: str) -> XlaConfig:
    return XlaConfig()

  def impl(self, problem: ScaledMatmulProblem, variant: str, config, platform: str):
    return lambda a, b, a_scale, b_scale: scaled_product(problem, a, b, a_scale, b_scale,
                                                         platform)


registry.register(XlaScaledMatmul())
