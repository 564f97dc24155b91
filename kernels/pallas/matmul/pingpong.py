"""Rung 6, `pingpong`: rung 4's clusters, each consumer on whole tiles of its own.

What it adds over `clusters`: in the cooperative rungs both consumer
warpgroups split every tile by rows, so both run the epilogue of a tile at the
same moment and the tensor cores idle while they do. Here consumer 0 takes
the CTA's even tiles and consumer 1 its odd ones, each a whole (tile_m,
tile_n) tile in its own f32 accumulator. The producer still fills one ring in
tile order, so consumer 1's first blocks land only as consumer 0 finishes its
main loop: the two take turns on the tensor cores, and one's epilogue runs
under the other's main loop. This is the schedule cuBLAS picks for
8192x4096x14336 (`nvjet_sm90_tst_128x160_64x5_2x1`, no `coop`;
the cuBLAS-kernels and TMA-ring probe at 0834948, H200).

The price: a consumer's accumulator must hold the whole tile, so at 128
registers of f32 per thread the tile is 128x128 where the cooperative rungs
run 256x128, and each CTA tile reads its own A rows (4/3 the L2 -> SMEM
traffic, halved again for the shared operand by the cluster's multicast).

Each consumer has its own `loaded` and `consumed` barrier per ring slot: a
warpgroup follows a barrier's phase by counting its own waits, and each
consumer waits only on its own tiles' steps.

The kernel body is rung 3's (`warp_specialized.persistent_kernel`, with
`pingpong=True`); this module launches it on 2-CTA clusters.

Measured (H200, jax 0.11.2, default config: 128x128x64 tiles, 6 stages,
cluster_n=2; CUPTI median of 20, bf16, XLA's dot and the cooperative rungs in
the same process: the ping-pong probe at 0834948):
slower than the cooperative 256x128 rungs on every aligned shape tried:
8192^3 746.8 TFLOP/s against 807.4 for `clusters`, 8192x4096x14336 768.4
against 804.8 for `stream_k`, 4096^3 759.3 against 797.5, the backward GEMMs
of a 4096^3 layer 760.4 and 759.8 against 799.1 and 795.7. Faster on the
unaligned 4095x4097x4093: 230.5 against 234.7 us (3.78x XLA against 3.71x).
Walking the tiles M-minor, clusters along M and bands of 16 tiles were slower
still. cuBLAS runs 128x128 ping-pong at 818.7 TFLOP/s on A^T B 4096^3
(the cuBLAS-kernels probe cited above), so the smaller tile does not explain all of the
gap; the autotuner picks this rung only where it measures faster.
"""

from __future__ import annotations

from jaxgemm.kernels.pallas.matmul import warp_specialized


def pingpong(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 6's kernel (a 2-CTA
  cluster shape in `config`: `PallasMatmul.check` validates it)."""
  return warp_specialized.persistent_call(a, b, problem, config, interpret,
                                          cluster_m=config.cluster_m,
                                          cluster_n=config.cluster_n, pingpong=True)
