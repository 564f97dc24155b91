"""matmul's problem, `GemmProblem`, is the GEMM family's: it lives in `jaxgemm.gemm`,
where the epilogue and FP8 ops (which extend it) and the kernels import it from."""

from jaxgemm.gemm import GemmProblem

__all__ = ["GemmProblem"]
