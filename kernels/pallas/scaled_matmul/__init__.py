"""Pallas Mosaic GPU kernels of `jaxgemm.scaled_matmul` (FP8 GEMMs with scales).

    scaled.py   the persistent warp-specialized FP8 kernel: both operands
                K-major, 128-deep K steps (one scale block each) whose wgmma
                products are promoted to an fp32 register sum with their scales

Shared helpers are in jaxgemm.kernels.pallas.common and the matmul's
warp_specialized module (tile order, exact stores).
"""
