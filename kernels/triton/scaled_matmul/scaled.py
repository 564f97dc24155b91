"""The FP8 GEMM with scales: C = (op(A) * a_scale) @ (op(B) * b_scale), in one kernel.

Each program owns a BLOCK_M x BLOCK_N tile of C and walks K in 128-wide
blocks (the scale block, `problem.BLOCK`). Per block it sums the block's fp8
products on the tensor cores into a fresh fp32 `partial` (128 / BLOCK_K dots)
and then promotes it into the fp32 accumulator:

    acc += partial * a_scale[rows, kb][:, None] * b_scale[kb, cols // 128][None, :]   "block"
    acc += partial                                                                 otherwise

and the epilogue applies the other kinds' scales once, acc * a_scale * b_scale
(a scalar each, or a row and a column vector), before the one rounding to
out_dtype. Why promote: Hopper's FP8 wgmma keeps about 14 bits of the sum
while it accumulates (DeepSeek-V3 report, DeepGEMM); left to run over all of K
its error grows with K (~2% of the result at K = 4096), while a 128-wide
interval's partial sum stays near 2**-14 of its magnitude and the fp32 sum of
the intervals adds only fp32's error. The "tensor" and "row_col" kinds promote
too, though their scales could wait to the end: a bare `acc = dot(a, b, acc)`
would accumulate all of K in the tensor cores' precision.

Shared memory per stage: A's and B's tiles, num_stages x (BLOCK_M + BLOCK_N)
x BLOCK_K bytes (fp8 is 1 byte: 32 KB a stage at 128x128x128, up to 7 stages); the
scales are read from global memory (a few floats per K block, cached).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jaxgemm import triton_call
from jaxgemm.kernels.triton.scaled_matmul import transpose
from jaxgemm.kernels.triton.common import grouped_tile, store_tile, tile_ptrs
from jaxgemm.kernels.triton.matmul.tiled import needs_index_64, operand_strides

# The K (and b's N) extent of one scale block: scaled_matmul's BLOCK, and the
# interval at which partial sums are promoted to fp32.
SCALE_BLOCK = 128
# Rows are padded to a multiple of this many bytes (see `laid_out`).
ROW_ALIGN_BYTES = 16


@triton.jit
def scaled_matmul_kernel(
    a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, c_ptr,
    BATCH: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_STRIDE_M: tl.constexpr, A_STRIDE_K: tl.constexpr,
    B_STRIDE_K: tl.constexpr, B_STRIDE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, OUT_M: tl.constexpr, OUT_N: tl.constexpr,
    K_BLOCKS: tl.constexpr, N_BLOCKS: tl.constexpr, SCALE_BLOCK_SIZE: tl.constexpr,
    SCALE_KIND: tl.constexpr, INDEX_64: tl.constexpr,
    A_BYTES_AS: tl.constexpr, B_BYTES_AS: tl.constexpr, DOT_F16: tl.constexpr,
    A_THROUGH_REGISTERS: tl.constexpr, STORE_TRANSPOSED: tl.constexpr,
):
  """C[b] = sum over 128-wide K blocks kb of (A[b] @ B[b])_kb scaled, one (batch, tile) per program.

  Grid: (BATCH * tiles,). A (B, M, K) with A's strides, B (B, K, N) with B's; C is
  (B, OUT_M, OUT_N), the operands may be zero-padded past it (M, N, K >= OUT_M,
  OUT_N and the real K; K_BLOCKS = ceil(K / 128) either way). Scales, float32, in
  C's coordinates: SCALE_KIND "tensor" () and (); "row_col" (B, OUT_M, 1) and
  (B, 1, OUT_N); "block" (B, OUT_M, K_BLOCKS) and (B, K_BLOCKS, N_BLOCKS).
  SCALE_BLOCK_SIZE is 128, BLOCK_K divides it; EVEN_K: K is a multiple of 128.
  A_BYTES_AS, B_BYTES_AS: "" (the operand's pointer is fp8), or "e4m3" / "e5m2" for
  an operand passed as its uint8 bytes (Triton's interpreter, `kernel_operands`).
  DOT_F16: the tiles go to the tensor cores as float16, exact for both fp8 types (e5m2
  is float16's high byte; e4m3's exponents and 3 mantissa bits fit), whose wgmma reads
  an operand stored MN-major from shared memory where fp8's reads only K-major
  (`dot_f16`).
  A_THROUGH_REGISTERS: fp8 math with A's tiles fed to wgmma from registers, for an A
  stored (K, M) (`a_through_registers`).
  STORE_TRANSPOSED: C is stored (B, OUT_N, OUT_M), each tile transposed: the kernel
  computes C^T of a swapped problem (`swapped`).
  """
  if A_BYTES_AS == "e4m3":
    a_ptr = a_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
  if A_BYTES_AS == "e5m2":
    a_ptr = a_ptr.to(tl.pointer_type(tl.float8e5), bitcast=True)
  if B_BYTES_AS == "e4m3":
    b_ptr = b_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
  if B_BYTES_AS == "e5m2":
    b_ptr = b_ptr.to(tl.pointer_type(tl.float8e5), bitcast=True)
  tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
  pid = tl.program_id(0)
  batch = pid // tiles
  pid_m, pid_n = grouped_tile(pid % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
  # Rows (columns) past M (N) wrap around: loads stay in bounds, never stored.
  offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
  offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  offs_k = tl.arange(0, BLOCK_K)
  a_ptrs = tile_ptrs(a_ptr, batch, offs_m, offs_k, M * K, A_STRIDE_M, A_STRIDE_K, INDEX_64)
  b_ptrs = tile_ptrs(b_ptr, batch, offs_k, offs_n, K * N, B_STRIDE_K, B_STRIDE_N, INDEX_64)
  # The scales' rows and columns: padded rows (columns) read a real one's scale
  # (their products are zeros, never stored).
  scale_m = offs_m % OUT_M
  scale_n = offs_n % OUT_N
  scale_batch = batch.to(tl.int64) if INDEX_64 else batch
  STEPS: tl.constexpr = SCALE_BLOCK_SIZE // BLOCK_K
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for kb in range(0, K_BLOCKS):
    # The block's sum on the tensor cores, from zero: at most 128 products deep.
    partial = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.static_range(STEPS):
      if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
      else:
        k_left = K - (kb * STEPS + step) * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
      if DOT_F16:
        a = a.to(tl.float16)
        b = b.to(tl.float16)
      elif A_THROUGH_REGISTERS:
        # An exact round trip that makes A a value computed in registers: Triton then
        # copies the MN-major tile in with cp.async and feeds it to wgmma from
        # registers. Loaded and used as is, it went through a register transpose into
        # shared memory outside the pipeline: 110 against 32.7 us at 128x4096x14336
        # swapped (the fp8-swap probe's run1 at 665c6f9, an H200).
        a = a.to(tl.float16).to(a_ptr.dtype.element_ty)
      partial = tl.dot(a, b, partial)
      a_ptrs += BLOCK_K * A_STRIDE_K
      b_ptrs += BLOCK_K * B_STRIDE_K
    # The promotion: an fp32 add (times the block's scales) per 128 of K.
    if SCALE_KIND == "block":
      sa = tl.load(a_scale_ptr + (scale_batch * OUT_M + scale_m) * K_BLOCKS + kb)
      sb = tl.load(b_scale_ptr + (scale_batch * K_BLOCKS + kb) * N_BLOCKS
                   + scale_n // SCALE_BLOCK_SIZE)
      acc += partial * (sa[:, None] * sb[None, :])
    else:
      acc += partial

  if SCALE_KIND == "tensor":
    acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr))
  if SCALE_KIND == "row_col":
    sa = tl.load(a_scale_ptr + scale_batch * OUT_M + scale_m)
    sb = tl.load(b_scale_ptr + scale_batch * OUT_N + scale_n)
    acc = acc * (sa[:, None] * sb[None, :])
  offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  if STORE_TRANSPOSED:
    store_tile(c_ptr, batch, offs_cn, offs_cm, tl.trans(acc), OUT_N, OUT_M, INDEX_64)
  else:
    store_tile(c_ptr, batch, offs_cm, offs_cn, acc, OUT_M, OUT_N, INDEX_64)


# fp8 dtypes by the names the kernel's A_BYTES_AS / B_BYTES_AS take.
_FP8_NAMES = {np.dtype(jnp.float8_e4m3fn): "e4m3", np.dtype(jnp.float8_e5m2): "e5m2"}


def bytes_as(problem, platform: str) -> dict:
  """The kernel's A_BYTES_AS and B_BYTES_AS on `platform` (see `kernel_operands`)."""
  if platform != "cpu":
    return dict(A_BYTES_AS="", B_BYTES_AS="")
  return dict(A_BYTES_AS=_FP8_NAMES[np.dtype(problem.dtype)],
              B_BYTES_AS=_FP8_NAMES[np.dtype(problem.b_dtype)])


def kernel_operands(platform: str, a, b):
  """(a, b) as the kernel takes them on `platform`.

  On the GPU as they are. In Triton's interpreter (the CPU) as their uint8
  bytes, typed back to fp8 in the kernel (`bytes_as`): the interpreter's host
  transfer (`triton_call`, torch.from_numpy) knows no ml_dtypes fp8, and with
  the bytes typed in the kernel its loads and dot decode fp8 exactly (through
  float16), so no upcast is needed.
  """
  if platform != "cpu":
    return a, b
  return (jax.lax.bitcast_convert_type(a, jnp.uint8),
          jax.lax.bitcast_convert_type(b, jnp.uint8))


def stored_dtype(out_dtype, platform: str):
  """The dtype the kernel stores C in: out_dtype, but float32 for a bfloat16 C in
  Triton's interpreter, whose fp32 -> bf16 cast truncates (it drops the low bits;
  268 where 269.8 rounds to 270), where the GPU rounds to nearest even. The
  caller rounds that fp32 C to bfloat16 in XLA, which rounds as the GPU does."""
  if platform == "cpu" and np.dtype(out_dtype) == jnp.bfloat16:
    return np.dtype(np.float32)
  return np.dtype(out_dtype)


def dot_f16(problem) -> bool:
  """Whether the kernel multiplies `problem`'s tiles in float16 (`DOT_F16`): where it
  reads B stored (K, N), MN-major.

  FP8 wgmma takes its shared-memory operands K-major only, so Triton feeds it an
  MN-major fp8 B through a register transpose back into shared memory (prmt byte
  permutes), outside the cp.async pipeline (`laid_out`); f16 wgmma reads either major,
  and the sm_90 PTX keeps cp.async (48-64 of them, no prmt) at the price of f16's half
  rate. At 128 rows, where the (K, N) weight's bytes bound the GEMM, that took
  128x4096x14336 from 112 us (fp8, weight in place; the fp8-block-wide probe's run8 at bdf7945,
  an H100) to 49.7 on an H200, where transposing the weight first for fp8 ran 62.9
  (the fp8-inplace-f16 probe's run1 at 01180b5). An A stored (K, M) can skip both: wgmma
  takes its A from registers (`a_through_registers`).
  """
  return not problem.trans_b


def a_through_registers(problem) -> bool:
  """Whether the kernel feeds an fp8 A stored (K, M) to wgmma from registers
  (`A_THROUGH_REGISTERS`): where B is K-major and fp8 math runs (`dot_f16`). wgmma's A
  may come from registers in any fp8 layout, so the MN-major tile keeps the cp.async
  pipeline and FP8's full rate (sm_90 PTX: tests/test_triton_ptx.py)."""
  return problem.trans_a and not dot_f16(problem)


def swapped(problem):
  """The problem of C^T = op(B)^T op(A)^T, which `config.swap_ab` runs: M and N, the
  dtypes, and the operands' roles exchanged (B^T is stored as B is, so a B stored
  (K, N) becomes an A stored (K, M'), read through registers: `a_through_registers`).

  Where one operand is a (K, N) weight and the other a few rows of activations, this
  reads the weight once with FP8 math in place: 128x4096x14336 per tensor in 32.5-32.8
  us on an H100, where the unswapped kernel's f16 math took 49.5-50.0 and XLA's scaled
  form 70.5 (the fp8-swap probe's run2 at 665c6f9, run3 at 196114e; 32.3-33.6 us on an H200 in run1's
  prototype). Block scales do not swap: A's are 1x128 and B's 128x128 blocks.
  """
  return dataclasses.replace(problem, m=problem.n, n=problem.m, dtype=problem.b_dtype,
                             b_dtype=problem.dtype, trans_a=not problem.trans_b,
                             trans_b=not problem.trans_a)


def launch(problem, config, platform, out_mn=None):
  """The launch of `scaled_matmul_kernel` for a `ScaledMatmulProblem` (laid out as the
  kernel reads it); out_mn: C's real (M, N) when the operands are padded past it. With
  config.swap_ab the kernel runs `swapped(problem)` on tiles of (block_n, block_m) and
  stores C transposed."""
  out_m, out_n = out_mn or (problem.m, problem.n)
  block_m, block_n = config.block_m, config.block_n
  out = jax.ShapeDtypeStruct((problem.batch, out_m, out_n),
                             stored_dtype(problem.out_dtype, platform))
  if config.swap_ab:
    problem, out_m, out_n, block_m, block_n = swapped(problem), out_n, out_m, block_n, block_m
  tiles = triton.cdiv(problem.m, block_m) * triton.cdiv(problem.n, block_n)
  return triton_call.Launch.make(
      scaled_matmul_kernel, (problem.batch * tiles,), out,
      num_warps=config.num_warps, num_stages=config.num_stages,
      BATCH=problem.batch, M=problem.m, N=problem.n, K=problem.k, **operand_strides(problem),
      BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=config.block_k,
      GROUP_M=config.group_m, EVEN_K=problem.k % SCALE_BLOCK == 0, OUT_M=out_m, OUT_N=out_n,
      K_BLOCKS=triton.cdiv(problem.k, SCALE_BLOCK), N_BLOCKS=triton.cdiv(out_n, SCALE_BLOCK),
      SCALE_BLOCK_SIZE=SCALE_BLOCK, SCALE_KIND=problem.scale_kind,
      INDEX_64=needs_index_64(problem), **bytes_as(problem, platform),
      DOT_F16=dot_f16(problem), A_THROUGH_REGISTERS=a_through_registers(problem),
      STORE_TRANSPOSED=config.swap_ab)


def scaled_matmul(a, b, a_scale, b_scale, problem, config, platform, out_mn=None):
  """C of a `ScaledMatmulProblem` from operands laid out as `problem` says."""
  if config.swap_ab:   # per-tensor or row_col scales (the backend's `check`)
    a, b, a_scale, b_scale = b, a, b_scale, a_scale
    if problem.scale_kind == "row_col":   # (B, 1, N) and (B, M, 1): rows and columns now
      a_scale, b_scale = jnp.swapaxes(a_scale, 1, 2), jnp.swapaxes(b_scale, 1, 2)
  a, b = kernel_operands(platform, a, b)
  a_scale, b_scale = a_scale.astype(jnp.float32), b_scale.astype(jnp.float32)  # e8m0 too
  c = triton_call.call(launch(problem, config, platform, out_mn), a, b, a_scale, b_scale,
                       platform=platform)
  return c.astype(problem.out_dtype)   # a no-op but in the interpreter (`stored_dtype`)


def laid_out(problem):
  """The problem as the kernel reads it after `relayout`: both operands K-major
  (A (M, K), B (N, K): trans_a=False, trans_b=True) and K padded to whole
  16-byte rows. The same problem where nothing moves.

  Why (sm_90 PTX of the 128x128x128 launch, Triton 3.9, tests/test_triton_ptx.py):
  with fp8 math every layout lowers to FP8 wgmma, but an operand that is not
  K-major is loaded with ld.global, transposed in registers (prmt byte permutes)
  and stored to shared memory, outside the cp.async pipeline: 32 cp.async with
  both operands K-major, 16 with one not (NN, TT: 48 prmt), 0 with neither (TN:
  96 prmt). Read in place, an A stored (K, M) goes to FP8 wgmma from registers where
  B is K-major (`a_through_registers`), and otherwise the tiles go to f16 wgmma
  (`dot_f16`): half the FP8 rate, which pays only where bytes bound the GEMM. Rows whose byte
  length is not a multiple of 16 (K = 4097) leave no cp.async at all. Padding K adds
  zeros to the products and keeps the number of 128-wide K blocks, so the scales need
  no change.
  """
  k = -(-problem.k // ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES   # fp8: one byte per element
  return dataclasses.replace(problem, trans_a=False, trans_b=True, k=k)


def relayout(problem, a, b, platform: str):
  """(a, b) as `laid_out(problem)` reads them: one pass (transpose, zero pad) over an
  operand that is not K-major or whose K is not 16-byte aligned, none otherwise. A
  transpose alone runs Triton's `transpose.transpose` (1.3-1.5x XLA's on an H200), one
  with a pad XLA's (the pad fuses into it)."""
  target = laid_out(problem)

  def swap(x):
    if target.k == problem.k:
      return transpose.transpose(x, platform)
    return jnp.swapaxes(x, 1, 2)
  if problem.trans_a:
    a = swap(a)
  if not problem.trans_b:
    b = swap(b)
  pad = [(0, 0), (0, 0), (0, target.k - problem.k)]
  if target.k != problem.k:
    a, b = jnp.pad(a, pad), jnp.pad(b, pad)
  return a, b


def relaid_scaled_matmul(problem, config, platform):
  """fn(a, b, a_scale, b_scale) -> C: the kernel on K-major, aligned operands
  (`laid_out`) when config.align_operands, else on the operands as stored."""
  target = laid_out(problem)
  if not config.align_operands or target == problem:
    return lambda a, b, sa, sb: scaled_matmul(a, b, sa, sb, problem, config, platform)

  def run(a, b, a_scale, b_scale):
    a, b = relayout(problem, a, b, platform)
    return scaled_matmul(a, b, a_scale, b_scale, target, config, platform,
                         out_mn=(problem.m, problem.n))
  return run
