"""Triton kernels of the FP8 grouped GEMM op `scaled_ragged_dot`.

    grouped.py    one program per (group row tile, output tile): the ragged-M
                  grouped kernel of `ragged_dot` (the `jaxgemm.ragged_schedule`
                  slot table) with the FP8 K loop of `scaled_matmul` (fp8 tiles,
                  fp32 partial sums promoted every 128 of K, times the block
                  scales for "block"); `scaled_ragged_m_persistent_kernel` walks
                  the same items on one program per SM

Every integer is a constexpr (see jaxgemm/triton_call.py).
"""
