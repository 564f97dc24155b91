"""jaxgemm: GEMM kernels of our own that behave like jnp.matmul under every JAX transformation.

    >>> import jax.numpy as jnp, jaxgemm
    >>> a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    >>> float(jaxgemm.matmul(a, b, backend="xla")[0, 0])
    32.0

Layout: `api` (matmul, dot_general) -> `primitive` (matmul_p and its rules)
-> `dispatch` (which kernel runs a problem: explicit, tuned, or heuristic)
-> `registry` (backends and their variants) -> `backends/<name>.py` -> the
kernels in `jaxgemm.kernels.<backend>.<variant>` (the repository's `kernels/`).
"""

from jaxgemm import backends as _backends  # noqa: F401 (registers the backends)
from jaxgemm.api import dot_general, matmul
from jaxgemm.backends.pallas import PallasConfig
from jaxgemm.backends.triton import TritonConfig
from jaxgemm.backends.xla import XlaConfig
from jaxgemm.config import KernelConfig
from jaxgemm.primitive import matmul_p
from jaxgemm.registry import GemmProblem, backends, variants
from jaxgemm.tuning import autotune, problems_in

__all__ = [
    "GemmProblem",
    "KernelConfig",
    "PallasConfig",
    "TritonConfig",
    "XlaConfig",
    "autotune",
    "backends",
    "dot_general",
    "matmul",
    "matmul_p",
    "problems_in",
    "variants",
]
