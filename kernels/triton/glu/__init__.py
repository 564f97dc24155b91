"""Triton kernels of the `glu` op (a gated linear unit: two GEMMs sharing their left operand).

    dual.py    one program per output tile: X's tile loaded once per K step for both
               weights' tiles, two fp32 accumulators, act(Zg) * Zu fused at the store

Every integer is a constexpr (see jaxgemm/triton_call.py).
"""
