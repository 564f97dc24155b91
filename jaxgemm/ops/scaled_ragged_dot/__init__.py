"""The FP8 grouped GEMM: `scaled_ragged_dot(lhs, rhs, group_sizes, lhs_scale, rhs_scale)`
over one primitive, `scaled_ragged_dot_p`.

    api.py        scaled_ragged_dot (the public function: checks, scale kinds; its
                  ragged-K form, the weight gradient, with RAGGED_K_NUMBERS)
    problem.py    ScaledRaggedDotProblem: one scaled_ragged_dot_p call (fp8 dtypes,
                  scale kind)
    primitive.py  scaled_ragged_dot_p and its rules: abstract eval, lowering through
                  jaxgemm.dispatch, batching, sharding (tokens local, experts
                  expert-parallel, block scales sliced per device); registers the op
    xla.py        backend "xla": lax.ragged_dot of the fp8 values widened to bf16,
                  the scales on its fp32 partial sums (every 128 of K with block
                  scales): the reference
    triton.py     backend "triton": the grouped FP8 kernels (kernels/triton/
                  scaled_ragged_dot/), ragged_dot's device-side schedule with
                  scaled_matmul's K loop (partial sums promoted every 128 of K)
    training.py   the FP8 grouped training path, `jaxgemm.ragged_dot(..., fp8=)`
                  (the router sends it here): forward, dgrad and wgrad (the
                  ragged-K form) on this op

Scale kinds, as `jaxgemm.quantize` returns them (G a batch dimension of rhs, so
the blocks are per expert): per tensor (() and ()), per row of lhs and column of
each expert ((M, 1), (G, 1, N)), and blocks (1x128 of lhs, (M, ceil(K/128));
128x128 of each expert, (G, ceil(K/128), ceil(N/128))). The ragged-K form (lhs (M, K),
rhs (M, N), out (G, K, N)) takes per-tensor scales or blocks of 128 tokens
((ceil(M/128), K) and (ceil(M/128), N), or 128x128).

Differentiation: none (the JVP rule raises, as scaled_matmul's does); FP8 grouped
GEMMs train through `jaxgemm.ragged_dot(..., fp8=)` (training.py). Kernels register
after "xla", as scaled_matmul's do (a Pallas kernel is to follow).

Importing this package registers the op and its backends, in preference order.
"""

from jaxgemm.ops.scaled_ragged_dot import primitive  # noqa: F401 (registers the op first)
from jaxgemm.ops.scaled_ragged_dot import xla, triton  # noqa: F401 (backends, in this order)
from jaxgemm.ops.scaled_ragged_dot.api import scaled_ragged_dot
from jaxgemm.ops.scaled_ragged_dot.primitive import scaled_ragged_dot_p
from jaxgemm.ops.scaled_ragged_dot.problem import ScaledRaggedDotProblem
from jaxgemm.ops.scaled_ragged_dot.triton import ScaledRaggedDotTritonConfig
from jaxgemm.ops.scaled_ragged_dot.xla import XlaScaledRaggedDotConfig

__all__ = ["ScaledRaggedDotProblem", "ScaledRaggedDotTritonConfig", "XlaScaledRaggedDotConfig",
           "scaled_ragged_dot", "scaled_ragged_dot_p"]
