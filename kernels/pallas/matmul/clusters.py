"""Rung 4, `clusters`: rung 3 on 2-CTA clusters with TMA multicast.

What it adds over `warp_specialized`: CTAs are launched in clusters of two
(`cluster_m=2`: two vertically adjacent tiles, or `cluster_n=2`: two
horizontally adjacent ones). The two CTAs of a cluster need the same B tile
(cluster along M) or A tile (along N) at every K step, so that operand's
BlockSpec is collective over the cluster axis: each CTA issues half of the
TMA load and multicasts it into both CTAs' shared memory. That halves the L2
-> SMEM traffic of the shared operand, the limit of the persistent kernel at
large tiles. The persistent loop walks cluster tiles (2 CTA tiles each) in
the same L2-friendly snake, on SMs / 2 clusters. Ragged edges are unchanged;
a CTA left without a tile (an odd tile count along the cluster axis)
recomputes its partner's tile and stores nothing.

The kernel body is rung 3's (`warp_specialized.persistent_kernel`), which
takes the cluster shape; this module picks it and launches the clusters.

Measured (H200, jax 0.11.2, default configs, cluster_n=2, CUPTI median of 20,
bf16, `research/pallas_probe.py all` run 3, its log at
0834948; XLA's dot in
the same process): 8192^3 800.7 TFLOP/s (0.99x XLA), 4096^3 791.3 (0.98x),
4095x4097x4093 458.5 (2.90x), 8192x4096x14336 786.5 (0.97x), 8192x14336x4096
810.7 (0.99x), A^T B 4096^3 791.3 (1.00x), A B^T 4096^3 791.0 (0.99x),
128x8192x8192 392.6 (0.92x with 128x128x64 in 6 stages; 432.4, 1.00x, with the
128x64x128 tiles now the default for M <= 128, measured in the sweep).
cluster_m=2 measured lower than cluster_n=2 on every shape tried (e.g. 8192^3:
783.0 vs 801.5).
"""

from __future__ import annotations

from jaxgemm.kernels.pallas.matmul import warp_specialized


def clusters(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 4's kernel (a 2-CTA
  cluster shape in `config`: `PallasMatmul.check` validates it)."""
  return warp_specialized.persistent_call(a, b, problem, config, interpret,
                                          cluster_m=config.cluster_m,
                                          cluster_n=config.cluster_n)
