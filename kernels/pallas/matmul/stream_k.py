"""Rung 5, `stream_k`: rung 4's clusters, with the last tiles split along K.

What it adds over `clusters`: the work of a persistent grid comes in whole
tiles, so when the tile count is not a multiple of the workers (clusters,
one CTA per SM), the last round runs partly empty: 8192^3 in 256x256 cluster
tiles is 1024 tiles on 66 clusters, 16 rounds where the work is 15.5. Here
the tiles of the last round (config `split_rounds=1`) or of the last two
(`split_rounds=2`) are cut into units of two K steps and every worker takes
an equal share of them (`warp_specialized.plan_stream_k`). A split tile is
finished by its owner, which adds the others' partial sums, passed through
an f32 workspace in global memory and semaphores
(`warp_specialized.stream_k_tail`), in a fixed order: results are
deterministic.

Measured (H200, jax 0.11.2, CUPTI, bf16, kernel time against `clusters` in the
same process; the stream-K tail probe at 0834948, two reps):
splitting the last round, 8192^3 ran 1.9% and 4.0% faster than `clusters`
(1357 and 1362 us; XLA's dot 1380-1390 us there, 1.02x and 1.01x), and
8192x4096x14336 1220 and 1223 us (two rounds: 1246 and 1207). Split tiles run
slower than whole ones (workers at different K offsets stop sharing operand
tiles in L2), so where they are a large share of the run the split loses
(two rounds: 8192x14336x4096 4% and 7% slower, 6144^3 5% and 4%), and with few K steps
the partial sums cost more than the idle SMs (8192x1024x8192: 2-3% slower).
The split is therefore used only when it is at most 5% of the tiles and tiles
have at least 64 K steps; everywhere else this rung runs as rung 4. Which of
the two splits is faster depends on the shape; the autotuner tries both.
"""

from __future__ import annotations

from jaxgemm.kernels.pallas.matmul import warp_specialized


def stream_k(a, b, problem, config, interpret: bool = False):
  """C = op(A) @ op(B) for `problem` with rung 5's kernel."""
  return warp_specialized.persistent_call(a, b, problem, config, interpret,
                                          cluster_m=config.cluster_m,
                                          cluster_n=config.cluster_n, stream_k=True)
