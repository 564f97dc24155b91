"""Rung 4, `tensorcore`: the pipelined kernel on Hopper tensor cores (wgmma).

Same kernel as rungs 2-3 (`tiled.blocked_matmul_kernel`), now feeding tiles to
`tl.dot` in their own dtype: bf16/fp16 run on wgmma with an fp32 accumulator,
fp32 runs as TF32 (precision DEFAULT, jnp.matmul's default on GPU) or as
3-pass TF32 (precision HIGH). precision=HIGHEST is exact fp32, which tensor
cores cannot do: that raises NotImplementedError here and runs on `pipelined`.
Triton emits wgmma only for 2-D dots with num_warps a multiple of 4, BLOCK_M a
multiple of 64 and BLOCK_K >= 16 for 16-bit types; the default configs meet
that and tests/test_triton_ptx.py checks the PTX.

Measured: see the ladder table in README.md (bench/results).
"""

from jaxgemm.kernels.triton.matmul.tiled import blocked_matmul


def matmul(a, b, problem, config, platform, out_mn=None, extras=()):
  """extras: the operands after A and B of a `FusedMatmulProblem` (its fused epilogue or gate)."""
  return blocked_matmul(a, b, problem, config, platform, upcast=False,
                        dot_precision=problem.fp32_precision or "tf32", out_mn=out_mn,
                        extras=extras)
