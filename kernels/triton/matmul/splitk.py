"""Rung 6, `splitk`: split K across programs when M*N alone cannot fill the GPU.

For decode-like shapes (M of 16 with K = N = 8192) there are too few output
tiles for 132 SMs; splitting K into SPLIT_K slices multiplies the parallelism.
Each slice writes its fp32 partial tile to a workspace and the slices are then
summed in a fixed order: deterministic, no atomics (run to run bit-identical).
Same kernel as rungs 2-4 (`tiled.blocked_matmul_kernel` with SPLIT_K > 1), on
tensor cores.

Measured: see the ladder table in README.md (bench/results).
"""

from jaxgemm.kernels.triton.matmul.tiled import blocked_matmul


def matmul(a, b, problem, config, platform, out_mn=None):
  return blocked_matmul(a, b, problem, config, platform, upcast=False,
                        dot_precision=problem.fp32_precision or "tf32", out_mn=out_mn)
