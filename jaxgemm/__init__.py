"""jaxgemm: GEMM kernels of our own that behave like jnp.matmul under every JAX transformation.

    >>> import jax.numpy as jnp, jaxgemm
    >>> a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    >>> float(jaxgemm.matmul(a, b, backend="xla")[0, 0])
    32.0

Layout (docs/architecture.md): `ops/router.py` sends `matmul` to the op that
computes the call -> `ops/<op>/` holds each op (public function, primitive and
rules, problem type, one backend module per kernel family) -> the kernels, one
file per rung, in `jaxgemm.kernels.<family>.<op>` (the repository's `kernels/`)
-> the layer below all of them: `gemm` (what the GEMM ops and kernels share),
`ragged_schedule`, `dispatch` (which kernel runs a problem: explicit, tuned,
heuristic), `registry` (the ops and their backends), `config`.
"""

from jaxgemm.gemm_rewrite import accelerate
from jaxgemm.config import KernelConfig
from jaxgemm.dispatch import KernelFallbackWarning
from jaxgemm.ops.matmul import (GemmProblem, PallasConfig, TritonConfig, XlaConfig,
                                dot_general, matmul_p)
from jaxgemm.ops.router import matmul, ragged_dot
from jaxgemm.ops.fused_matmul import FusedMatmulProblem, fused_matmul_p
from jaxgemm.ops.glu import GluProblem, glu, glu_p
from jaxgemm.ops.ragged_dot import (RaggedDotPallasConfig, RaggedDotProblem,
                                    RaggedDotTritonConfig, XlaRaggedDotConfig,
                                    ragged_dot_general, ragged_dot_p)
from jaxgemm.ops.scaled_matmul import (Fp8Recipe, ScaledMatmulProblem, quantize,
                                       scaled_matmul)
from jaxgemm.ops.scaled_ragged_dot import (ScaledRaggedDotProblem, ScaledRaggedDotTritonConfig,
                                           scaled_ragged_dot)
from jaxgemm.registry import backends, variants
from jaxgemm.tuning import autotune, problems_in

__all__ = [
    "Fp8Recipe",
    "FusedMatmulProblem",
    "GemmProblem",
    "GluProblem",
    "KernelConfig",
    "KernelFallbackWarning",
    "PallasConfig",
    "RaggedDotPallasConfig",
    "RaggedDotProblem",
    "RaggedDotTritonConfig",
    "ScaledMatmulProblem",
    "ScaledRaggedDotProblem",
    "ScaledRaggedDotTritonConfig",
    "TritonConfig",
    "XlaConfig",
    "XlaRaggedDotConfig",
    "accelerate",
    "autotune",
    "backends",
    "dot_general",
    "fused_matmul_p",
    "glu",
    "glu_p",
    "matmul",
    "matmul_p",
    "problems_in",
    "quantize",
    "ragged_dot",
    "ragged_dot_general",
    "ragged_dot_p",
    "scaled_matmul",
    "scaled_ragged_dot",
    "variants",
]
