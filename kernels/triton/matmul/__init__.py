"""Triton GEMM kernels, one file per rung of the ladder (simplest first).

    naive.py        rank-1 updates on CUDA cores, no reuse beyond registers
    tiled.py        BLOCK_K tiles through shared memory, exact fp32 dot (CUDA cores)
    pipelined.py    tiled + multi-stage cp.async pipeline + grouped tile order
    tensorcore.py   the same kernel on tensor cores (wgmma: bf16/fp16, tf32)
    persistent.py   one program per SM walking tiles, TMA descriptors, split epilogue
    splitk.py       tiled over K slices for small M*N, deterministic reduction

    layout.py       how the tensor-core rungs get K-major, 16-byte-aligned operands

All take canonical operands a: (B, M, K) or (B, K, M) with TRANS_A, b: (B, K,
N) or (B, N, K) with TRANS_B, and every integer as a constexpr (see
jaxgemm/triton_call.py for why).
"""
