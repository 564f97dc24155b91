"""Rung 5, `stream_k`: rung 4's clusters, with the last tiles split along K.

What it adds over `clusters`: the work of a persistent grid comes in whole
tiles, so when the tile count is not a multiple of the workers (clusters,
one CTA per SM), the last round runs partly empty: 8192x4096x14336 in
256x256 cluster tiles is 1792 tiles on 66 clusters, 28 rounds where the
work is 27.2. Here the tiles of the last two rounds are cut into units of
two K steps and every worker takes an equal share of them
(`warp_specialized.plan_stream_k`). A tile split between two workers is
finished by its owner, which adds the other's partial sums, passed through
an f32 workspace in global memory and a semaphore
(`warp_specialized.stream_k_tail`); the sum has two terms in a fixed order,
so results are deterministic.

Measured (H200, jax 0.11.2, CUPTI median of 20, bf16, XLA's dot in the same
process): on 8192x4096x14336 1.5% faster than `clusters` in two runs (1194
vs 1210 us, 1233 vs 1245 us). The split tiles run slower than whole ones
(workers at different K offsets stop sharing operand tiles in L2), so where
they are a large share of the run it loses: 4096^3 6% slower,
8192x14336x4096 8% (bench/results/probes/pallas-2026-11-23/probe_stream_k.log,
probe_chain.log). The split is therefore used only when the last two rounds
are at most 5% of the tiles; everywhere else this rung runs as rung 4.
"""

from __future__ import annotations

from jaxgemm.kernels.pallas import warp_specialized


def stream_k(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 5's kernel."""
  return warp_specialized.persistent_call(a, b, problem, config, interpret,
                                          cluster_m=config.cluster_m,
                                          cluster_n=config.cluster_n, stream_k=True)
