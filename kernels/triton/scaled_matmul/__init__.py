"""Triton kernels of the `scaled_matmul` op (FP8 GEMMs with per-tensor, row/column or block scales).

    scaled.py    one program per output tile, fp8 tiles on tensor cores, the fp32
                 partial sum of each 128-wide K block promoted into an fp32
                 accumulator (times its block scales for "block" scales); and the
                 operand relayout (K-major, 16-byte aligned rows) before it

Every integer is a constexpr (see jaxgemm/triton_call.py).
"""
