"""Triton kernels of the grouped GEMM op `ragged_dot` (mixture-of-experts).

    grouped.py    one program per (group row tile or group, output tile):
                  `ragged_m_kernel` (forward, lhs gradient) and
                  `ragged_k_kernel` (weight gradient, ragged rows contracted)

Both take the schedule tables of `jaxgemm.ragged_schedule` as device
int32 arrays and every integer as a constexpr (see jaxgemm/triton_call.py).
"""
