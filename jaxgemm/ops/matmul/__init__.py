"""The dense GEMM op: `matmul` / `dot_general` over one primitive, `matmul_p`.

    api.py        matmul (jnp.matmul's contract; `jaxgemm.matmul` routes plain calls
                  here) and dot_general (lax's)
    problem.py    GemmProblem: the static description of one matmul_p call (the GEMM
                  family's, defined in `jaxgemm.gemm`)
    primitive.py  matmul_p and its rules: abstract eval, lowering, batching,
                  JVP/transpose; registers the op
    xla.py        backend "xla": lax.dot_general, the reference
    triton.py     backend "triton": the ladder in jaxgemm.kernels.triton.matmul
    pallas.py     backend "pallas": the ladder in jaxgemm.kernels.pallas.matmul

Importing this package registers the op and its backends, in preference order.
"""

from jaxgemm.ops.matmul import primitive  # noqa: F401 (registers the op first)
from jaxgemm.ops.matmul import xla, triton, pallas  # noqa: F401 (backends, in this order)
from jaxgemm.ops.matmul.api import dot_general, matmul
from jaxgemm.ops.matmul.pallas import PallasConfig
from jaxgemm.ops.matmul.primitive import matmul_p
from jaxgemm.ops.matmul.problem import GemmProblem
from jaxgemm.ops.matmul.triton import TritonConfig
from jaxgemm.ops.matmul.xla import XlaConfig

__all__ = ["GemmProblem", "PallasConfig", "TritonConfig", "XlaConfig", "dot_general",
           "matmul", "matmul_p"]
