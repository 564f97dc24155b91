"""GEMMs with fused epilogues: `matmul(..., bias=, activation=, residual=)` over `fused_matmul_p`.

    api.py        fused_matmul (what jaxgemm.matmul runs when given an epilogue)
    problem.py    FusedMatmulProblem: one fused_matmul_p call (epilogue or gate)
    primitive.py  fused_matmul_p and its rules: the JVP through out-gated GEMMs, whose
                  transposes gate the backward GEMMs' operands; batching; sharding
    xla.py        backend "xla": the jnp expression, XLA's own program of it
    triton.py     backend "triton": the epilogue switches of jaxgemm.kernels.triton.matmul
    pallas.py     backend "pallas": the epilogue switches of jaxgemm.kernels.pallas.matmul

The activations are `jaxgemm.ops.activations`, shared with `glu`.
"""

from jaxgemm.ops.fused_matmul import primitive  # noqa: F401 (registers the op first)
from jaxgemm.ops.fused_matmul import xla, triton, pallas  # noqa: F401 (backends, in this order)
from jaxgemm.ops.fused_matmul.api import fused_matmul
from jaxgemm.ops.fused_matmul.primitive import fused_matmul_p
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem

__all__ = ["FusedMatmulProblem", "fused_matmul", "fused_matmul_p"]
