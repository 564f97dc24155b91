"""Rung 2, `tiled`: BLOCK_K-wide tiles of A and B reused from shared memory, exact fp32 math.

Each program owns a BLOCK_M x BLOCK_N tile of C and walks K in BLOCK_K steps;
`tl.dot` stages the two tiles through shared memory, so every element loaded
from HBM is used BLOCK_N (resp. BLOCK_M) times instead of once per output
element as in `naive`. Operands are upcast to fp32 and multiplied with
`input_precision="ieee"`: FMA on CUDA cores, the path for fp32 with
precision=HIGHEST. No software pipelining (num_stages=1) and row-major tile
order: those are the next rung's ideas.

`blocked_matmul_kernel` below is the kernel of rungs 2-4 and of split-K: the
rungs differ only in compile-time switches (UPCAST_OPERANDS, DOT_PRECISION,
GROUP_M, SPLIT_K, num_stages), which is how Triton wants such ideas expressed.

Measured: see the ladder table in README.md (bench/results).
"""

import functools
import operator

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from jaxgemm import triton_call
from jaxgemm.kernels.triton import epilogue
from jaxgemm.kernels.triton.common import grouped_tile, store_tile, tile_ptrs
from jaxgemm.kernels.triton.epilogue import apply_epilogue, gate_operand


@triton.jit
def accumulate_tile(
    a_ptr, b_ptr, batch, pid_m, pid_n, k_start, k_len,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
    gate_ptr=None, GATE: tl.constexpr = "", GATE_ACTIVATION: tl.constexpr = "",
):
  """The fp32 (BLOCK_M, BLOCK_N) tile of A[batch] @ B[batch] over K in [k_start, k_start + k_len).

  GATE "lhs" ("rhs"): each A (B) tile is first multiplied by GATE_ACTIVATION'(Z),
  Z's tile read at gate_ptr with A's (B's) strides, in fp32 and rounded back to
  the operand's dtype (`epilogue.gate_operand`).
  """
  # Rows (columns) past M (N) wrap around instead of being masked: the loads
  # stay in bounds and unmasked, and those results are never stored.
  offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
  offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  offs_k = tl.arange(0, BLOCK_K)
  a_ptrs = tile_ptrs(a_ptr, batch, offs_m, k_start + offs_k, M * K, A_STRIDE_M, A_STRIDE_K,
                     INDEX_64)
  b_ptrs = tile_ptrs(b_ptr, batch, k_start + offs_k, offs_n, K * N, B_STRIDE_K, B_STRIDE_N,
                     INDEX_64)
  if GATE == "lhs":
    g_ptrs = tile_ptrs(gate_ptr, batch, offs_m, k_start + offs_k, M * K, A_STRIDE_M,
                       A_STRIDE_K, INDEX_64)
  if GATE == "rhs":
    g_ptrs = tile_ptrs(gate_ptr, batch, k_start + offs_k, offs_n, K * N, B_STRIDE_K,
                       B_STRIDE_N, INDEX_64)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(k_len, BLOCK_K)):
    k_left = k_len - k * BLOCK_K
    if EVEN_K:
      a = tl.load(a_ptrs)
      b = tl.load(b_ptrs)
    else:
      a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
      b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    if GATE == "lhs":
      a = gate_operand(a, g_ptrs, offs_k[None, :] < k_left, GATE_ACTIVATION, not EVEN_K)
      g_ptrs += BLOCK_K * A_STRIDE_K
    if GATE == "rhs":
      b = gate_operand(b, g_ptrs, offs_k[:, None] < k_left, GATE_ACTIVATION, not EVEN_K)
      g_ptrs += BLOCK_K * B_STRIDE_K
    if UPCAST_OPERANDS:
      a = a.to(tl.float32)
      b = b.to(tl.float32)
    acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    a_ptrs += BLOCK_K * A_STRIDE_K
    b_ptrs += BLOCK_K * B_STRIDE_K
  return acc


@triton.jit
def blocked_matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
):
  """C[b] = A[b] @ B[b] for one (batch, tile, K-slice) per program (`blocked_program`)."""
  blocked_program(a_ptr, b_ptr, None, None, None, c_ptr, None, BATCH, M, N, K,
                  A_STRIDE_M, A_STRIDE_K, B_STRIDE_K, B_STRIDE_N, BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M, SPLIT_K, EVEN_K, OUT_M, OUT_N, UPCAST_OPERANDS, DOT_PRECISION,
                  INDEX_64, 0, "", False, "", "", False)


@triton.jit
def blocked_epilogue_kernel(
    a_ptr, b_ptr, bias_ptr, res_ptr, gate_ptr, c_ptr, z_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
    BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
    GATE: tl.constexpr, GATE_ACTIVATION: tl.constexpr, SAVE_PREACTIVATION: tl.constexpr,
):
  """The same kernel with a fused epilogue or gate (`blocked_program`), never split over K.

  Pointers the problem does not use (bias, residual, gate Z) are stand-ins
  (any array, never read); z_ptr is None unless SAVE_PREACTIVATION.
  """
  blocked_program(a_ptr, b_ptr, bias_ptr, res_ptr, gate_ptr, c_ptr, z_ptr, BATCH, M, N, K,
                  A_STRIDE_M, A_STRIDE_K, B_STRIDE_K, B_STRIDE_N, BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M, 1, EVEN_K, OUT_M, OUT_N, UPCAST_OPERANDS, DOT_PRECISION,
                  INDEX_64, BIAS, ACTIVATION, RESIDUAL, GATE, GATE_ACTIVATION,
                  SAVE_PREACTIVATION)


@triton.jit
def blocked_program(
    a_ptr, b_ptr, bias_ptr, res_ptr, gate_ptr, c_ptr, z_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
    BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
    GATE: tl.constexpr, GATE_ACTIVATION: tl.constexpr, SAVE_PREACTIVATION: tl.constexpr,
):
  """C[b] = epilogue(A[b] @ B[b]) for one (batch, tile, K-slice) per program.

  Grid: (B * tiles, SPLIT_K). C is (B, OUT_M, OUT_N): the operands may be
  zero-padded past it (see `aligned_operands`). With SPLIT_K > 1, c_ptr is an
  fp32 workspace of shape (SPLIT_K * B, OUT_M, OUT_N), one partial sum per slice
  (no epilogue: it needs the whole K sum). The epilogue (`epilogue.apply_epilogue`:
  BIAS 0/1 shared/2 batched, ACTIVATION, RESIDUAL, GATE "out") runs on the fp32
  accumulator; GATE "lhs"/"rhs" gates the operand tiles (`accumulate_tile`);
  SAVE_PREACTIVATION also stores Z = acc + bias at z_ptr.
  """
  tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
  pid = tl.program_id(0)
  batch = pid // tiles
  pid_m, pid_n = grouped_tile(pid % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
  if SPLIT_K == 1:
    k_slice = 0
    k_start = 0
    k_len = K
  else:
    k_slice = tl.program_id(1)
    K_PER_SLICE: tl.constexpr = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = k_slice * K_PER_SLICE
    k_len = tl.minimum(K - k_start, K_PER_SLICE)
  acc = accumulate_tile(a_ptr, b_ptr, batch, pid_m, pid_n, k_start, k_len, M, N, K,
                        A_STRIDE_M, A_STRIDE_K, B_STRIDE_K, B_STRIDE_N,
                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST_OPERANDS, DOT_PRECISION,
                        INDEX_64, gate_ptr, GATE, GATE_ACTIVATION)
  offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  y, z = apply_epilogue(acc, batch, offs_cm, offs_cn, bias_ptr, res_ptr, gate_ptr, OUT_M, OUT_N,
                        BIAS, ACTIVATION, RESIDUAL, GATE == "out", GATE_ACTIVATION, INDEX_64)
  store_tile(c_ptr, k_slice * BATCH + batch, offs_cm, offs_cn, y, OUT_M, OUT_N, INDEX_64)
  if SAVE_PREACTIVATION:
    store_tile(z_ptr, batch, offs_cm, offs_cn, z, OUT_M, OUT_N, INDEX_64)


def operand_strides(problem):
  """Constexpr strides of the canonical operands (a transpose swaps them)."""
  m, n, k = problem.m, problem.n, problem.k
  a_stride_m, a_stride_k = (1, m) if problem.trans_a else (k, 1)
  b_stride_k, b_stride_n = (1, k) if problem.trans_b else (n, 1)
  return dict(A_STRIDE_M=a_stride_m, A_STRIDE_K=a_stride_k,
              B_STRIDE_K=b_stride_k, B_STRIDE_N=b_stride_n)


def needs_index_64(problem) -> bool:
  largest = max(problem.batch * problem.m * problem.k, problem.batch * problem.k * problem.n,
                problem.batch * problem.m * problem.n)
  return largest >= 2**31


def blocked_launch(problem, config, platform, *, upcast: bool, dot_precision: str,
                   out_mn: tuple[int, int] | None = None):
  """The launch of `blocked_matmul_kernel` for `problem` (its output is a workspace if split),
  or of `blocked_epilogue_kernel` for a `FusedMatmulProblem` (outputs C, and Z if saved).

  `out_mn`: the (M, N) of C when the operands are padded past it.
  """
  tiles = triton.cdiv(problem.m, config.block_m) * triton.cdiv(problem.n, config.block_n)
  split_k = config.split_k
  out_m, out_n = out_mn or (problem.m, problem.n)
  fused = epilogue.is_fused(problem)
  if fused and split_k > 1:
    raise NotImplementedError(
        f"{problem.describe()}: split-K cannot fuse an epilogue or a gate (the epilogue needs "
        f"the whole K sum); use split_k=1")
  if split_k > 1:
    out_shape = jax.ShapeDtypeStruct((split_k * problem.batch, out_m, out_n), jnp.float32)
  else:
    out_shape = jax.ShapeDtypeStruct((problem.batch, out_m, out_n), problem.out_dtype)
  common = dict(
      BATCH=problem.batch, M=problem.m, N=problem.n, K=problem.k, **operand_strides(problem),
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, EVEN_K=problem.k % config.block_k == 0, OUT_M=out_m, OUT_N=out_n,
      UPCAST_OPERANDS=upcast or triton_call.interpreting_bf16(problem.dtype, platform),
      DOT_PRECISION=dot_precision, INDEX_64=needs_index_64(problem))
  if fused:
    saves = problem.save_preactivation
    return triton_call.Launch.make(
        blocked_epilogue_kernel, (problem.batch * tiles, 1),
        (out_shape, out_shape) if saves else out_shape,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **common, **epilogue.constexprs(problem), **({} if saves else dict(z_ptr=None)))
  return triton_call.Launch.make(
      blocked_matmul_kernel, (problem.batch * tiles, split_k), out_shape,
      num_warps=config.num_warps, num_stages=config.num_stages, SPLIT_K=split_k, **common)


def blocked_matmul(a, b, problem, config, platform, *, upcast: bool, dot_precision: str,
                   out_mn=None, extras=()):
  """Launches `blocked_matmul_kernel` (and sums the split-K slices in fixed order), or
  `blocked_epilogue_kernel` with `extras` (the operands after A and B) for a fused problem."""
  split_k = config.split_k
  launch = blocked_launch(problem, config, platform, upcast=upcast, dot_precision=dot_precision,
                          out_mn=out_mn)
  if epilogue.is_fused(problem):
    return triton_call.call(launch, a, b, *epilogue.pointer_arrays(problem, a, extras),
                            platform=platform)
  c = triton_call.call(launch, a, b, platform=platform)
  if split_k == 1:
    return c
  # A fixed left-to-right sum of the slices: deterministic, unlike atomics.
  partials = c.reshape(split_k, problem.batch, *c.shape[1:])
  return functools.reduce(operator.add, [partials[i] for i in range(split_k)]).astype(
      problem.out_dtype)


def matmul(a, b, problem, config, platform, out_mn=None):
  """Rung 2: exact fp32 FMA on CUDA cores, operands upcast in registers."""
  return blocked_matmul(a, b, problem, config, platform, upcast=True, dot_precision="ieee",
                        out_mn=out_mn)
