"""The GLU dual GEMM: H = act(X @ Wg + bg) * (X @ Wu + bu) in one kernel.

Each program owns a BLOCK_M x BLOCK_N tile of H and walks K: per step it loads
the X tile once and the Wg and Wu tiles, and feeds two fp32 accumulators
(wgmma on Hopper, as the matmul's `tensorcore` rung). The epilogue adds the
biases, applies the activation (`jaxgemm.kernels.triton.epilogue`) and stores
H, and Zg and Zu when SAVE_PREACTIVATION (the backward needs them). Against
two GEMMs and an elementwise pass this reads X once instead of twice and
never writes Zg, Zu unless asked.

Shared memory per stage: X's tile and two weight tiles, num_stages x (BLOCK_M
x BLOCK_K + 2 x BLOCK_K x BLOCK_N) x itemsize; registers: two accumulators, so
the tiles are half the matmul's (128x128 with 8 warps).
"""

import jax
import triton
import triton.language as tl

from jaxgemm import triton_call
from jaxgemm.kernels.triton import epilogue
from jaxgemm.kernels.triton.common import grouped_tile, store_tile, tile_ptrs
from jaxgemm.kernels.triton.epilogue import activation, load_bias
from jaxgemm.kernels.triton.matmul.tiled import needs_index_64, operand_strides


@triton.jit
def glu_kernel(
    x_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, h_ptr, zg_ptr, zu_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, DOT_PRECISION: tl.constexpr, INDEX_64: tl.constexpr,
    BIAS: tl.constexpr, ACTIVATION: tl.constexpr, SAVE_PREACTIVATION: tl.constexpr,
):
  """H[b] = ACTIVATION(X[b] @ Wg[b] + bg) * (X[b] @ Wu[b] + bu), one (batch, tile) per program.

  Grid: (B * tiles,). Wg and Wu share B's strides. H, Zg, Zu are (B, OUT_M, OUT_N)
  (the operands may be zero-padded past it). BIAS 0 none, 1 shared (N,), 2 batched
  (B, N); without a bias bg_ptr/bu_ptr are stand-ins, never read; zg_ptr and zu_ptr
  are None unless SAVE_PREACTIVATION.
  """
  tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
  pid = tl.program_id(0)
  batch = pid // tiles
  pid_m, pid_n = grouped_tile(pid % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
  # Rows (columns) past M (N) wrap around: loads stay in bounds, never stored.
  offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
  offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  offs_k = tl.arange(0, BLOCK_K)
  x_ptrs = tile_ptrs(x_ptr, batch, offs_m, offs_k, M * K, A_STRIDE_M, A_STRIDE_K, INDEX_64)
  wg_ptrs = tile_ptrs(wg_ptr, batch, offs_k, offs_n, K * N, B_STRIDE_K, B_STRIDE_N, INDEX_64)
  wu_ptrs = tile_ptrs(wu_ptr, batch, offs_k, offs_n, K * N, B_STRIDE_K, B_STRIDE_N, INDEX_64)
  acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BLOCK_K)):
    if EVEN_K:
      x = tl.load(x_ptrs)
      wg = tl.load(wg_ptrs)
      wu = tl.load(wu_ptrs)
    else:
      k_left = K - k * BLOCK_K
      x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
      wg = tl.load(wg_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
      wu = tl.load(wu_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    if UPCAST_OPERANDS:
      x = x.to(tl.float32)
      wg = wg.to(tl.float32)
      wu = wu.to(tl.float32)
    acc_g = tl.dot(x, wg, acc_g, input_precision=DOT_PRECISION)
    acc_u = tl.dot(x, wu, acc_u, input_precision=DOT_PRECISION)
    x_ptrs += BLOCK_K * A_STRIDE_K
    wg_ptrs += BLOCK_K * B_STRIDE_K
    wu_ptrs += BLOCK_K * B_STRIDE_K

  offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  if BIAS != 0:
    acc_g += load_bias(bg_ptr, batch, offs_cn, OUT_N, BIAS)[None, :]
    acc_u += load_bias(bu_ptr, batch, offs_cn, OUT_N, BIAS)[None, :]
  store_tile(h_ptr, batch, offs_cm, offs_cn, activation(acc_g, ACTIVATION) * acc_u,
             OUT_M, OUT_N, INDEX_64)
  if SAVE_PREACTIVATION:
    store_tile(zg_ptr, batch, offs_cm, offs_cn, acc_g, OUT_M, OUT_N, INDEX_64)
    store_tile(zu_ptr, batch, offs_cm, offs_cn, acc_u, OUT_M, OUT_N, INDEX_64)


def launch(problem, config, platform, out_mn=None):
  """The launch of `glu_kernel` for a `GluProblem` (outputs H, or H, Zg, Zu)."""
  out_m, out_n = out_mn or (problem.m, problem.n)
  tiles = triton.cdiv(problem.m, config.block_m) * triton.cdiv(problem.n, config.block_n)
  out = jax.ShapeDtypeStruct((problem.batch, out_m, out_n), problem.out_dtype)
  saves = problem.save_preactivation
  return triton_call.Launch.make(
      glu_kernel, (problem.batch * tiles,), (out, out, out) if saves else out,
      num_warps=config.num_warps, num_stages=config.num_stages,
      BATCH=problem.batch, M=problem.m, N=problem.n, K=problem.k, **operand_strides(problem),
      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, EVEN_K=problem.k % config.block_k == 0, OUT_M=out_m, OUT_N=out_n,
      UPCAST_OPERANDS=triton_call.interpreting_bf16(problem.dtype, platform),
      DOT_PRECISION=problem.fp32_precision or "tf32", INDEX_64=needs_index_64(problem),
      BIAS=epilogue.BIAS_CODES[problem.bias], ACTIVATION=problem.activation or "",
      SAVE_PREACTIVATION=bool(saves), **({} if saves else dict(zg_ptr=None, zu_ptr=None)))


def glu(x, wg, problem, config, platform, out_mn=None, extras=()):
  """H (or (H, Zg, Zu)) of a `GluProblem`; extras: Wu, then bias_gate and bias_up if any.

  Called by `matmul.layout.tensor_core_layout` with Wu relaid like Wg."""
  wu, *biases = extras
  if len(biases) != (2 if problem.bias else 0):
    raise ValueError(f"{problem.describe()} takes {2 if problem.bias else 0} biases, "
                     f"got {len(biases)}")
  bg, bu = biases if problem.bias else (x, x)   # stand-ins, never read
  return triton_call.call(launch(problem, config, platform, out_mn), x, wg, wu, bg, bu,
                          platform=platform)
