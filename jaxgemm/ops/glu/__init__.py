"""Gated linear units (SwiGLU, GeGLU): `glu` over one dual-GEMM primitive, `glu_p`.

    api.py        glu: activation(x @ w_gate + bias_gate) * (x @ w_up + bias_up)
    problem.py    GluProblem: one glu_p call
    primitive.py  glu_p and its rules: JVP (GEMMs on matmul_p, the gate's derivative
                  in one XLA fusion), batching, sharding
    xla.py        backend "xla": the jnp expression, XLA's own program of it
    triton.py     backend "triton": jaxgemm.kernels.triton.glu
    pallas.py     backend "pallas": jaxgemm.kernels.pallas.glu
"""

from jaxgemm.ops.glu import primitive  # noqa: F401 (registers the op first)
from jaxgemm.ops.glu import xla, triton, pallas  # noqa: F401 (backends, in this order)
from jaxgemm.ops.glu.api import glu
from jaxgemm.ops.glu.primitive import glu_p
from jaxgemm.ops.glu.problem import GluProblem

__all__ = ["GluProblem", "glu", "glu_p"]
