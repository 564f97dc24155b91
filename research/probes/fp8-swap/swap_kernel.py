"""Probe: the 128-row per-tensor FP8 GEMM computed as C^T = B^T A^T.

With B stored (K, N), B^T is wgmma's A operand, which may come from registers:
FP8 wgmma needs K-major only for shared-memory operands. A (M, K) becomes the
B operand, K-major as stored. Each program owns BLOCK_N columns of C and all of
its rows, so B is read (and transposed) once in all.
"""
import triton
import triton.language as tl


@triton.jit
def swapped_kernel(a_ptr, b_ptr, c_ptr, scale_ptr,
                   M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   PROMOTE: tl.constexpr, TRANS_LOAD: tl.constexpr, REG_A: tl.constexpr = 0):
  pid = tl.program_id(0)
  tiles_n = tl.cdiv(N, BLOCK_N)
  pid_n = pid % tiles_n
  pid_m = pid // tiles_n
  offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_k = tl.arange(0, BLOCK_K)
  if TRANS_LOAD:
    # b tile as stored, [BLOCK_K, BLOCK_N], transposed in the kernel.
    b_ptrs = b_ptr + offs_k[:, None] * N + offs_n[None, :]
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
  else:
    bt_ptrs = b_ptr + offs_k[None, :] * N + offs_n[:, None]
    at_ptrs = a_ptr + offs_m[None, :] * K + offs_k[:, None]
  acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
  STEPS: tl.constexpr = 128 // BLOCK_K
  for kb in range(0, K // 128):
    partial = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.static_range(STEPS):
      if TRANS_LOAD:
        bt = tl.trans(tl.load(b_ptrs))
        at = tl.trans(tl.load(a_ptrs))
        b_ptrs += BLOCK_K * N
        a_ptrs += BLOCK_K
      else:
        bt = tl.load(bt_ptrs)
        at = tl.load(at_ptrs)
        bt_ptrs += BLOCK_K * N
        at_ptrs += BLOCK_K
      if REG_A == 1:
        bt = bt.to(tl.float16).to(tl.float8e4nv)
      if REG_A == 2:
        bt = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [bt], dtype=tl.float8e4nv,
                                       is_pure=True, pack=4)
      if PROMOTE:
        partial = tl.dot(bt, at, partial)
      else:
        acc = tl.dot(bt, at, acc)
    if PROMOTE:
      acc += partial
  acc = acc * tl.load(scale_ptr)
  c_ptrs = c_ptr + offs_m[None, :] * N + offs_n[:, None]
  tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))
