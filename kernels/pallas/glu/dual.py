"""GLU as one dual GEMM: the persistent matmul body (`warp_specialized.persistent_kernel`)
with a second weight operand.

Per K step the producer warpgroup TMA-loads X's (tile_m, tile_k) block once
and both weights' (tile_k, tile_n) blocks into one ring slot (three copies on
the slot's `loaded` barrier); each of the two consumer warpgroups issues two
wgmmas on its tile_m / 2 rows of X, into two fp32 accumulators, and keeps one
step's pair in flight. The epilogue, per (64, epi_tile_n) piece, adds the
biases, computes act(zg) * zu in fp32 and stores H (and Zg, Zu).

Registers: two accumulators of (tile_m / 2) x tile_n fp32 per consumer, so
tile_m / 2 * tile_n <= 64 * 128 (128 registers per thread, as one 128x128
accumulator in the matmul): 128x128 tiles (64 rows per consumer) or 256x64.
Clusters (`cluster_m` / `cluster_n` = 2) multicast X's block (along N) or
both weights' blocks (along M) as in rung 4.
"""

from __future__ import annotations

from jaxgemm.kernels.pallas.epilogue import Epilogue
from jaxgemm.kernels.pallas.matmul import warp_specialized

# Accumulator elements per consumer warpgroup, both accumulators together.
MAX_ACC_ELEMENTS = 2 * 64 * 128


def dual(x, wg, wu, biases, problem, config, *, activation: str, bias: str | None,
         save_preactivation: bool, interpret: bool = False, cluster_m: int = 1,
         cluster_n: int = 1):
  """H = act(op(X) @ op(Wg) + bg) * (op(X) @ op(Wu) + bu) for the GemmProblem-shaped
  `problem` (one of the two GEMMs; X, Wg, Wu stored as its A and B), `biases`
  (bg, bu) when `bias`. Returns H, or (H, Zg, Zu) with save_preactivation."""
  if (config.tile_m // 2) * config.tile_n * 2 > MAX_ACC_ELEMENTS:
    raise ValueError(f"GLU's two accumulators of (tile_m / 2) x tile_n per consumer: "
                     f"tile_m={config.tile_m}, tile_n={config.tile_n} need more than 128 "
                     f"registers per thread; use 128x128 or 256x64 tiles")
  ep = Epilogue(activation=activation, bias=bias, save_preactivation=save_preactivation,
                glu=True)
  return warp_specialized.persistent_call(
      x, wg, problem, config, interpret, cluster_m=cluster_m, cluster_n=cluster_n,
      epilogue=ep, extras=(wu, *biases))
