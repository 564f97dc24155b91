"""Pallas Mosaic GPU GEMM kernels, one file per rung of the ladder (simplest first).

    basic.py             one output tile per program, K looped with plain TMA loads
    pipelined.py         the K loop as a multi-stage TMA pipeline (emit_pipeline)
    warp_specialized.py  a producer warpgroup feeds two consumer warpgroups; persistent
    clusters.py          warp_specialized with CTA pairs sharing operand tiles (multicast)
    stream_k.py          clusters with the last partial round's tiles split along K
    pingpong.py          the two consumers on alternate whole tiles, epilogues hidden

Shared helpers (swizzles, SMEM types, tile walks, padding) are in
jaxgemm.kernels.pallas.common.
"""
