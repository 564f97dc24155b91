"""FP8 GEMMs with scales: `scaled_matmul(a, b, a_scale, b_scale)` over `scaled_matmul_p`, and `quantize`.

    api.py        scaled_matmul (the public function: checks, scale kinds, layout)
    quantize.py   quantize(x, dtype, block) -> (q, scale) in the shapes scaled_matmul takes
    training.py   the FP8 training path: matmul(x, w, fp8=recipe), Fp8Recipe (forward,
                  dgrad and wgrad as scaled_matmul GEMMs, quantized on the fly)
    problem.py    ScaledMatmulProblem: one scaled_matmul_p call (fp8 dtypes, scale kind)
    primitive.py  scaled_matmul_p and its rules: abstract eval, lowering through
                  jaxgemm.dispatch, batching, sharding (block scales sliced per device)
    xla.py        backend "xla": XLA's programs, its FP8 GEMM of the scaled form
                  ("dot_general": what "auto" runs untuned and the benchmark compares
                  against) and the operands dequantized to bf16 ("dequantize_bf16")
    triton.py     backend "triton": jaxgemm.kernels.triton.scaled_matmul (FP8 wgmma,
                  partial sums promoted to fp32 every 128 of K)
    pallas.py     backend "pallas": jaxgemm.kernels.pallas.scaled_matmul (Mosaic GPU,
                  persistent warp-specialized, promoted to fp32 every 128 of K)

Scale kinds: per tensor (shapes () and ()), per row of a and column of b
((M, 1), (1, N)), and blocks (1x128 of a, (M, ceil(K/128)); 128x128 of b,
(ceil(K/128), ceil(N/128))), the products summed in fp32 per 128-wide K block.

Differentiation: `scaled_matmul_p` multiplies values already quantized and has
no derivative (its JVP rule raises under `jax.grad`/`jax.jvp`; zero tangents
pass). Training differentiates through the bf16 values instead:
`jaxgemm.matmul(x, w, fp8=recipe)` (training.py) quantizes them on the fly and
runs its dgrad and wgrad GEMMs in FP8 too, through `trans_a`/`trans_b`.

Kernels: "triton" and "pallas" are registered after "xla" ("auto" runs XLA's
program until a tuning record measures a kernel faster).
"""

from jaxgemm.ops.scaled_matmul import primitive  # noqa: F401 (registers the op first)
from jaxgemm.ops.scaled_matmul import xla, triton, pallas  # noqa: F401 (backends, in this order)
from jaxgemm.ops.scaled_matmul.api import scaled_matmul
from jaxgemm.ops.scaled_matmul.primitive import scaled_matmul_p
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem
from jaxgemm.ops.scaled_matmul.quantize import quantize
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe

__all__ = ["Fp8Recipe", "ScaledMatmulProblem", "quantize", "scaled_matmul", "scaled_matmul_p"]
