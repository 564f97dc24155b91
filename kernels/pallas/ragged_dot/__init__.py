"""Pallas Mosaic GPU grouped GEMM kernels (`jaxgemm.ragged_dot`), simplest first.

    grouped.py   both rungs of the ragged-M ladder and their slot tables:
                 `pipelined` (one warpgroup, emit_pipeline per tile, tile-aligned
                 slots) and `grouped` (a producer and two consumer warpgroups on
                 one SMEM ring, slots starting at each group's first row)

Shared helpers (swizzles, SMEM types, tile walks) are in jaxgemm.kernels.pallas.common.
"""
