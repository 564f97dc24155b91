"""Rung 3, `pipelined`: `tiled` plus a multi-stage software pipeline and grouped tile order.

Same kernel as rung 2 (`tiled.blocked_matmul_kernel`, exact fp32 FMA), with two
compile-time changes:
  * num_stages >= 3: Triton issues the cp.async copies of the next tiles while
    the current ones are multiplied, hiding global-memory latency;
  * GROUP_M > 1: programs walk tile-rows in groups so that concurrently running
    programs share A and B tiles in L2 (fewer HBM reads).
This is the fp32 path for precision=HIGHEST.

Measured: see the ladder table in README.md (bench/results).
"""

from jaxgemm.kernels.triton.matmul.tiled import blocked_matmul


def matmul(a, b, problem, config, platform, out_mn=None):
  return blocked_matmul(a, b, problem, config, platform, upcast=True, dot_precision="ieee",
                        out_mn=out_mn)
