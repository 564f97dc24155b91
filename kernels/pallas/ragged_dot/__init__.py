"""Pallas Mosaic GPU grouped GEMM kernels (`jaxgemm.ragged_dot`), simplest first.

    grouped.py    ragged-M (out (M, N), rhs (G, K, N) or (G, N, K)) in two rungs and
                  their slot tables: `pipelined` (one warpgroup, emit_pipeline per
                  tile, tile-aligned slots) and `grouped` (a producer and two consumer
                  warpgroups on one SMEM ring, slots starting at each group's first row)
    ragged_k.py   ragged-K (the weight gradient, out (G, K, N)) on the `grouped` rung's
                  structure, the row chunks at a group's edges masked in SMEM

Shared helpers (swizzles, SMEM types, tile walks) are in jaxgemm.kernels.pallas.common.
"""
