"""Rung 5, `persistent`: one program per SM walking the tiles, TMA loads, split epilogue.

Ideas on top of `tensorcore`:
  * a persistent grid: NUM_SMS programs each loop over output tiles in grouped
    order (`tl.range(..., flatten=True)` lets Triton pipeline across tile
    boundaries), so launch and tail costs are paid once and the next tile's
    loads overlap the current tile's epilogue;
  * epilogue sub-tiling: the accumulator is converted and stored in
    EPILOGUE_SUBTILE column slices, fewer live registers at the store;
  * WARP_SPECIALIZE asks Triton to split the loop into producer and consumer
    warps (`tl.range(..., warp_specialize=True)`) where Triton supports it;
  * USE_TMA: tensor descriptors (`tl.make_tensor_descriptor`), the copy engine
    moving whole tiles into swizzled shared memory, zero-filling out of bounds.

TMA does not run through jax-triton 0.3.1: device-side descriptors live in a
global scratch buffer (384 B per program here, Triton's compile metadata) that
Triton's own launcher allocates and jax-triton's does not, and the kernel hit
CUDA_ERROR_ILLEGAL_ADDRESS on the H200 (research/triton_probe.py, 2026-11-22). The backend
therefore refuses tma=True on GPU; the interpreter runs it (tests keep the path
correct), and bench/ times it launched natively with Triton's allocator.

Measured: see the ladder table in README.md (bench/results).
"""

import jax
import triton
import triton.language as tl

from jaxgemm import triton_call
from jaxgemm.kernels.triton import epilogue
from jaxgemm.kernels.triton.common import grouped_tile, store_tile
from jaxgemm.kernels.triton.epilogue import apply_epilogue
from jaxgemm.kernels.triton.matmul.tiled import accumulate_tile, needs_index_64, operand_strides


@triton.jit
def persistent_matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    TRANS_A: tl.constexpr, TRANS_B: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  persistent_program(a_ptr, b_ptr, None, None, None, c_ptr, None, BATCH, M, N, K,
                     TRANS_A, TRANS_B, A_STRIDE_M, A_STRIDE_K, B_STRIDE_K, B_STRIDE_N,
                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS, EPILOGUE_SUBTILE,
                     WARP_SPECIALIZE, USE_TMA, EVEN_K, OUT_M, OUT_N, UPCAST_OPERANDS,
                     DOT_PRECISION, INDEX_64, 0, "", False, "", "", False)


@triton.jit
def persistent_epilogue_kernel(
    a_ptr, b_ptr, bias_ptr, res_ptr, gate_ptr, c_ptr, z_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    TRANS_A: tl.constexpr, TRANS_B: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
    BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
    GATE: tl.constexpr, GATE_ACTIVATION: tl.constexpr, SAVE_PREACTIVATION: tl.constexpr,
):
  """The same kernel with a fused epilogue or gate (see `tiled.blocked_epilogue_kernel`)."""
  persistent_program(a_ptr, b_ptr, bias_ptr, res_ptr, gate_ptr, c_ptr, z_ptr, BATCH, M, N, K,
                     TRANS_A, TRANS_B, A_STRIDE_M, A_STRIDE_K, B_STRIDE_K, B_STRIDE_N,
                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS, EPILOGUE_SUBTILE,
                     WARP_SPECIALIZE, USE_TMA, EVEN_K, OUT_M, OUT_N, UPCAST_OPERANDS,
                     DOT_PRECISION, INDEX_64, BIAS, ACTIVATION, RESIDUAL, GATE,
                     GATE_ACTIVATION, SAVE_PREACTIVATION)


@triton.jit
def persistent_program(
    a_ptr, b_ptr, bias_ptr, res_ptr, gate_ptr, c_ptr, z_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    TRANS_A: tl.constexpr, TRANS_B: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
    BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
    GATE: tl.constexpr, GATE_ACTIVATION: tl.constexpr, SAVE_PREACTIVATION: tl.constexpr,
):
  """The persistent loop over output tiles; the epilogue (`epilogue.apply_epilogue`) runs on
  each EPILOGUE_SUBTILE slice of the accumulator, a gate "lhs"/"rhs" on the operand tiles
  (`tiled.accumulate_tile`; not with USE_TMA)."""
  SUB_N: tl.constexpr = BLOCK_N // EPILOGUE_SUBTILE
  if USE_TMA:
    a_desc = _operand_descriptor(a_ptr, BATCH, M, K, BLOCK_M, BLOCK_K, TRANS_A)
    b_desc = _operand_descriptor(b_ptr, BATCH, N, K, BLOCK_N, BLOCK_K, not TRANS_B)
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[BATCH, OUT_M, OUT_N],
                                       strides=[OUT_M * OUT_N, OUT_N, 1],
                                       block_shape=[1, BLOCK_M, SUB_N])

  tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
  for tile_id in tl.range(tl.program_id(0), BATCH * tiles, NUM_SMS, flatten=True,
                          warp_specialize=WARP_SPECIALIZE):
    batch = tile_id // tiles
    pid_m, pid_n = grouped_tile(tile_id % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    if USE_TMA:
      acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
      for ki in range(tl.cdiv(K, BLOCK_K)):
        a = _load_operand(a_desc, batch, pid_m * BLOCK_M, ki * BLOCK_K, BLOCK_M, BLOCK_K,
                          TRANS_A)
        b = tl.trans(_load_operand(b_desc, batch, pid_n * BLOCK_N, ki * BLOCK_K, BLOCK_N,
                                   BLOCK_K, not TRANS_B))
        if UPCAST_OPERANDS:
          a = a.to(tl.float32)
          b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    else:
      acc = accumulate_tile(a_ptr, b_ptr, batch, pid_m, pid_n, 0, K, M, N, K,
                            A_STRIDE_M, A_STRIDE_K, B_STRIDE_K, B_STRIDE_N,
                            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST_OPERANDS, DOT_PRECISION,
                            INDEX_64, gate_ptr, GATE, GATE_ACTIVATION)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if EPILOGUE_SUBTILE == 1:
      parts = (acc,)
    else:
      parts = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, SUB_N)), (0, 2, 1)))
    for i in tl.static_range(EPILOGUE_SUBTILE):
      off_n = pid_n * BLOCK_N + i * SUB_N
      offs_n = off_n + tl.arange(0, SUB_N)
      y, z = apply_epilogue(parts[i], batch, offs_m, offs_n, bias_ptr, res_ptr, gate_ptr,
                            OUT_M, OUT_N, BIAS, ACTIVATION, RESIDUAL, GATE == "out",
                            GATE_ACTIVATION, INDEX_64)
      if USE_TMA:
        c_desc.store([batch, pid_m * BLOCK_M, off_n],
                     y.to(c_ptr.dtype.element_ty).reshape(1, BLOCK_M, SUB_N))
      else:
        store_tile(c_ptr, batch, offs_m, offs_n, y, OUT_M, OUT_N, INDEX_64)
      if SAVE_PREACTIVATION:
        store_tile(z_ptr, batch, offs_m, offs_n, z, OUT_M, OUT_N, INDEX_64)


@triton.jit
def _operand_descriptor(ptr, BATCH: tl.constexpr, ROWS: tl.constexpr, K: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, K_MAJOR: tl.constexpr):
  """A 3-D (batch, ...) descriptor: batches stay apart, unlike a (B*rows, K) view."""
  if K_MAJOR:
    return tl.make_tensor_descriptor(ptr, shape=[BATCH, K, ROWS], strides=[K * ROWS, ROWS, 1],
                                     block_shape=[1, BLOCK_K, BLOCK_ROWS])
  return tl.make_tensor_descriptor(ptr, shape=[BATCH, ROWS, K], strides=[ROWS * K, K, 1],
                                   block_shape=[1, BLOCK_ROWS, BLOCK_K])


@triton.jit
def _load_operand(desc, batch, off_rows, off_k, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                  K_MAJOR: tl.constexpr):
  """The (BLOCK_ROWS, BLOCK_K) tile at (off_rows, off_k), whichever way it is stored."""
  if K_MAJOR:
    return tl.trans(desc.load([batch, off_k, off_rows]).reshape(BLOCK_K, BLOCK_ROWS))
  return desc.load([batch, off_rows, off_k]).reshape(BLOCK_ROWS, BLOCK_K)


def num_sms(platform: str) -> int:
  """Streaming multiprocessors of the device the kernel will run on.

  Asked of JAX's device (its `core_count`), not of Triton's driver: that one
  builds a helper module on first use, which fails once jax-triton has set
  TRITON_CACHE_DIR to "" (the H200 GPU test run of 2026-11-22).
  """
  from jaxgemm.gemm import DEFAULT_NUM_SMS  # noqa: PLC0415
  gpus = [d for d in jax.devices() if d.platform == "gpu"] if platform == "cuda" else []
  return (getattr(gpus[0], "core_count", None) if gpus else None) or DEFAULT_NUM_SMS


def launch(problem, config, platform, out_mn=None):
  """The launch of `persistent_matmul_kernel`, or of `persistent_epilogue_kernel` for a
  `FusedMatmulProblem` (outputs C, and Z if saved)."""
  out_m, out_n = out_mn or (problem.m, problem.n)
  tiles = (problem.batch * triton.cdiv(problem.m, config.block_m)
           * triton.cdiv(problem.n, config.block_n))
  programs = min(num_sms(platform), tiles)
  out_shape = jax.ShapeDtypeStruct((problem.batch, out_m, out_n), problem.out_dtype)
  kernel, fused = persistent_matmul_kernel, {}
  if epilogue.is_fused(problem):
    if config.tma and problem.gate in ("lhs", "rhs"):
      raise NotImplementedError(f"{problem.describe()}: the TMA path does not gate operand "
                                f"tiles; use tma=False")
    kernel, fused = persistent_epilogue_kernel, epilogue.constexprs(problem)
    if problem.save_preactivation:
      out_shape = (out_shape, out_shape)
    else:
      fused["z_ptr"] = None
  return triton_call.Launch.make(
      kernel, (programs,), out_shape,
      num_warps=config.num_warps, num_stages=config.num_stages,
      BATCH=problem.batch, M=problem.m, N=problem.n, K=problem.k,
      TRANS_A=problem.trans_a, TRANS_B=problem.trans_b, **operand_strides(problem),
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, NUM_SMS=programs, EPILOGUE_SUBTILE=config.epilogue_subtile,
      WARP_SPECIALIZE=config.warp_specialize, USE_TMA=config.tma,
      EVEN_K=problem.k % config.block_k == 0, OUT_M=out_m, OUT_N=out_n,
      UPCAST_OPERANDS=triton_call.interpreting_bf16(problem.dtype, platform),
      DOT_PRECISION=problem.fp32_precision or "tf32", INDEX_64=needs_index_64(problem),
      **fused)


def matmul(a, b, problem, config, platform, out_mn=None, extras=()):
  """extras: the operands after A and B of a `FusedMatmulProblem` (its fused epilogue or gate)."""
  if config.tma and platform == "cuda":
    raise NotImplementedError(
        "TritonConfig(tma=True) cannot run through jax-triton 0.3.1: Triton's device-side "
        "tensor descriptors need a global scratch buffer that only Triton's own launcher "
        "allocates (CUDA_ERROR_ILLEGAL_ADDRESS on the H200); use tma=False")
  pointers = epilogue.pointer_arrays(problem, a, extras) if epilogue.is_fused(problem) else ()
  return triton_call.call(launch(problem, config, platform, out_mn), a, b, *pointers,
                          platform=platform)
