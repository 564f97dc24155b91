"""Triton kernels of the `scaled_matmul` op (FP8 GEMMs with per-tensor, row/column or block scales).

    scaled.py    one program per output tile, fp8 tiles on tensor cores, the fp32
                 partial sum of each 128-wide K block promoted into an fp32
                 accumulator (times its block scales for "block" scales), in f16
                 where it reads an operand MN-major; and the operand relayout
                 (K-major, 16-byte aligned rows) before it
    transpose.py the relayout's fp8 transpose, a 128x128 tile a program

Every integer is a constexpr (see jaxgemm/triton_call.py).
"""
