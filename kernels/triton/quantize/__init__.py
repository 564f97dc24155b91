"""Triton kernels that quantize to fp8 (the operands of the FP8 training path).

    cast_transpose.py    one program per 128x128 tile of X (R, C): X read once,
                         q (R, C) and optionally q^T (C, R) written in fp8 with
                         their scales ("tensor", 1x128 "row" or 128x128 "tile"),
                         bit-identical to `jaxgemm.quantize`

Every integer is a constexpr (see jaxgemm/triton_call.py).
"""
