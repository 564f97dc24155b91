"""How the tensor-core rungs get operands laid out the way wgmma wants them.

Layout preparation is part of what a tuned config's speed depends on, so it
lives with the kernels (the tuning records' version hashes this package).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxgemm.gemm import GemmProblem


def misaligned_rows(problem: GemmProblem) -> str | None:
  """Why some operand rows are not 16-byte aligned (None if all are): TMA needs them, vector loads want them."""
  itemsize = np.dtype(problem.dtype).itemsize
  rows = {"a": problem.m if problem.trans_a else problem.k,
          "b": problem.k if problem.trans_b else problem.n}
  for name, length in rows.items():
    if length * itemsize % 16:
      return f"{name}'s rows are {length} x {itemsize} B"
  if problem.n * np.dtype(problem.out_dtype).itemsize % 16:
    return f"c's rows are {problem.n} x {np.dtype(problem.out_dtype).itemsize} B"
  return None


def tensor_core_layout(matmul, problem: GemmProblem, config, platform: str,
                       extra_roles: tuple[str, ...] = ()):
  """Runs a tensor-core rung on operands laid out the way wgmma wants them.

  * TF32 wgmma reads both operands K-major from shared memory. Triton meets an
    N-major B by passing it through registers: the 8192^3 fp32 product ran at
    83 TFLOP/s against XLA's 410, and the PTX had half the cp.async of the
    K-major case (research/triton_probe.py's run 1 at 0834948, H200). An
    fp32 operand that is not K-major is transposed first, one pass over it;
    then 383 TFLOP/s (run2).
  * Rows that do not start 16-byte aligned (K = 4097 in bf16, say) leave
    Triton scalar loads and no cp.async (PTX of 4095x4097x4093: 96 ld.global,
    0 cp.async; aligned: 36 cp.async). The contiguous dimensions are zero-padded
    to 16 bytes: the zeros add nothing to the products, and the kernel stores
    C at its real (M, N) so nothing is sliced afterwards.

  `config.align_operands=False` skips both: the call is the kernel alone.

  extra_roles: one per operand after A and B (the fused epilogues'), "a" or "b"
  for a tensor stored like A or B (a gate's Z, GLU's second weight: relaid and
  padded exactly as that operand, so the kernel indexes it with the operand's
  strides; zeros past the edges), "out" for one in C's coordinates (bias,
  residual: as given, the kernel reads them at C's real (M, N)). With extras,
  `matmul` is called as `matmul(a, b, problem, config, platform, out_mn=...,
  extras=(...))`.
  """
  def run(a, b, extras, laid_out, out_mn=None):
    kw = dict(extras=tuple(extras)) if extra_roles else {}
    return matmul(a, b, laid_out, config, platform, out_mn=out_mn, **kw)

  if not config.align_operands:
    return lambda a, b, *extras: run(a, b, extras, problem)
  a_transpose = problem.fp32_precision is not None and problem.trans_a
  b_transpose = problem.fp32_precision is not None and not problem.trans_b
  laid_out = dataclasses.replace(problem, trans_a=problem.trans_a and not a_transpose,
                                 trans_b=problem.trans_b or b_transpose)
  if misaligned_rows(laid_out):
    align = 16 // np.dtype(problem.dtype).itemsize
    up = lambda x: -(-x // align) * align
    laid_out = dataclasses.replace(laid_out, m=up(problem.m) if laid_out.trans_a else problem.m,
                                   n=up(problem.n) if not laid_out.trans_b else problem.n,
                                   k=up(problem.k))
  if laid_out == problem:
    return lambda a, b, *extras: run(a, b, extras, problem)

  def pad(x, shape):
    return jnp.pad(x, [(0, want - have) for have, want in zip(x.shape, shape)])

  def like_a(x):
    return pad(jnp.swapaxes(x, 1, 2) if a_transpose else x, laid_out.a_shape)

  def like_b(x):
    return pad(jnp.swapaxes(x, 1, 2) if b_transpose else x, laid_out.b_shape)

  relayout = {"a": like_a, "b": like_b, "out": lambda x: x}

  def laid_out_matmul(a, b, *extras):
    extras = [relayout[role](x) for role, x in zip(extra_roles, extras, strict=True)]
    return run(like_a(a), like_b(b), extras, laid_out, out_mn=(problem.m, problem.n))

  return laid_out_matmul
