"""The grouped GEMM op: `ragged_dot` / `ragged_dot_general` over one primitive, `ragged_dot_p`.

    api.py        ragged_dot (lax.ragged_dot's contract) and ragged_dot_general (lax's)
    problem.py    RaggedDotProblem: the static description of one ragged_dot_p call
    primitive.py  ragged_dot_p and its rules: abstract eval, lowering, batching,
                  JVP/transpose (the two modes are each other's gradients); registers the op
    xla.py        backend "xla": lax.ragged_dot_general, the reference
    triton.py     backend "triton": jaxgemm.kernels.triton.ragged_dot
    pallas.py     backend "pallas": jaxgemm.kernels.pallas.ragged_dot

The device-side tables that map kernel tiles to groups, which the kernels
take too, are `jaxgemm.ragged_schedule`.

Importing this package registers the op and its backends, in preference order.
"""

from jaxgemm.ops.ragged_dot import primitive  # noqa: F401 (registers the op first)
from jaxgemm.ops.ragged_dot import xla, triton, pallas  # noqa: F401 (backends, in this order)
from jaxgemm.ops.ragged_dot.api import ragged_dot, ragged_dot_general
from jaxgemm.ops.ragged_dot.primitive import ragged_dot_p
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem
from jaxgemm.ops.ragged_dot.pallas import RaggedDotPallasConfig
from jaxgemm.ops.ragged_dot.triton import RaggedDotTritonConfig
from jaxgemm.ops.ragged_dot.xla import XlaRaggedDotConfig

__all__ = ["RaggedDotPallasConfig", "RaggedDotProblem", "RaggedDotTritonConfig", "XlaRaggedDotConfig", "ragged_dot", "ragged_dot_general",
           "ragged_dot_p"]
