"""Rung 1, `naive`: rank-1 updates on CUDA cores, no reuse beyond registers.

Each program owns a BLOCK_M x BLOCK_N tile of C and, for every k, loads one
column of A and one row of B straight from global memory and adds their outer
product (fp32 FMA). Nothing is staged in shared memory and every element is
loaded once per tile it contributes to: the baseline the later rungs improve on.

Measured: see the ladder table in README.md (bench/results).
"""

import triton
import triton.language as tl

from jaxgemm import triton_call
from jaxgemm.kernels.triton.common import store_tile
from jaxgemm.kernels.triton.matmul.tiled import needs_index_64, operand_strides

import jax


@triton.jit
def naive_matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr,
):
  tiles_n = tl.cdiv(N, BLOCK_N)
  tiles = tl.cdiv(M, BLOCK_M) * tiles_n
  pid = tl.program_id(0)
  batch = pid // tiles
  pid_m = (pid % tiles) // tiles_n
  pid_n = (pid % tiles) % tiles_n
  offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
  offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  if INDEX_64:
    batch = batch.to(tl.int64)
    offs_m = offs_m.to(tl.int64)
    offs_n = offs_n.to(tl.int64)
  a_col = a_ptr + batch * (M * K) + offs_m * A_STRIDE_M
  b_row = b_ptr + batch * (K * N) + offs_n * B_STRIDE_N

  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, K):
    a = tl.load(a_col + k * A_STRIDE_K).to(tl.float32)
    b = tl.load(b_row + k * B_STRIDE_K).to(tl.float32)
    acc += a[:, None] * b[None, :]

  offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  store_tile(c_ptr, batch, offs_cm, offs_cn, acc, M, N, INDEX_64)


def matmul(a, b, problem, config, platform, out_mn=None):
  assert out_mn is None, "the naive rung runs on unpadded operands"
  tiles = triton.cdiv(problem.m, config.block_m) * triton.cdiv(problem.n, config.block_n)
  launch = triton_call.Launch.make(
      naive_matmul_kernel, (problem.batch * tiles,),
      jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype),
      num_warps=config.num_warps, num_stages=1,
      M=problem.m, N=problem.n, K=problem.k, **operand_strides(problem),
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, INDEX_64=needs_index_64(problem))
  return triton_call.call(launch, a, b, platform=platform)
