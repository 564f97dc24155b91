"""The `triton` backend of scaled_matmul: the FP8 kernel in `jaxgemm.kernels.triton.scaled_matmul`.

One variant, `blocked`: each program owns a tile of C and walks K in 128-wide
blocks; a block's fp8 products are summed on the tensor cores (FP8 wgmma on
Hopper) into a fresh fp32 partial sum, which is then added to the fp32
accumulator, times the block's scales for "block" scales:

    C = round_out( sum_kb  partial_kb * a_scale[:, kb] * b_scale[kb, n // 128] )   "block"
    C = round_out( (sum_kb partial_kb) * a_scale * b_scale )                       "tensor", "row_col"

The promotion every 128 of K is DeepGEMM's: Hopper's FP8 tensor cores keep
about 14 bits while accumulating, so no more than 128 products are summed
there. The sm_90 PTX shows it: each block's first wgmma starts from zero
(scale-d 0) and one add (fma for "block") per accumulator element follows the
block (tests/test_triton_ptx.py). On the CPU the same kernel source runs in
Triton's interpreter, which decodes fp8 exactly (no upcast needed).

Layout: with `config.align_operands` (the heuristic's choice from a megabyte
of operands up) an operand that is not K-major is transposed first (Triton's
fp8 transpose, `kernels.triton.scaled_matmul.transpose`) and K is zero-padded
to 16-byte rows (an XLA pass), one pass each (`scaled.laid_out` has the PTX
evidence: FP8 wgmma reads K-major only, and a non-K-major fp8 operand skips the
cp.async pipeline through a register transpose). A row-major A (M, K) and a
B stored (N, K) (`trans_b=True`) with K a multiple of 16 are read in place.
A few rows against a B stored (K, N), where the weight's bytes bound the GEMM, the
default reads it in place: with per-tensor or row/column scales as C^T = B^T A^T
(`config.swap_ab`, `scaled.swapped`, up to `SWAP_MAX_ROWS`), the weight fed to FP8
wgmma from registers; otherwise through f16 wgmma (`scaled.dot_f16`, exact; up to
`IN_PLACE_MAX_ROWS`), as any B read in place MN-major.

Config: the matmul's `TritonConfig`; block_k must divide 128 (32, 64 or 128),
split_k, tma, warp_specialize and epilogue_subtile > 1 are refused, swap_ab with
block scales too.
`backend="auto"` takes this kernel untuned where `problem.kernel_win` says
(below 4096 rows or columns, and mixed fp8 pairs with block scales, on Hopper).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgemm import registry
from jaxgemm.config import KernelConfig, check_shared_memory, within_shared_memory
from jaxgemm.gemm import BLOCK, FP8_DTYPES, SMEM_CAPACITY_BYTES, pow2_at_least, tile_count
from jaxgemm.ops.matmul.triton import ALIGN_MIN_OPERAND_BYTES, TritonConfig, TritonMatmul
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem, kernel_win

# Tiles, largest first: (block_m, block_n, block_k, num_warps, num_stages). The
# kernel holds two fp32 tiles in registers (the accumulator and the block's
# partial sum): 128x128 over 8 warps is 2 x 64 registers a thread, where
# 128x256 would need 256 and spill. block_k = 128 is one scale block per K
# step (4 wgmma of k32); fp8 tiles are one byte an element, so 4 stages of
# 128x128x128 take 128 KB of the 227 KB. The shapes follow DeepGEMM's (128-row
# blocks, 128-wide N) and the matmul's smaller tiles for more programs per wave. On
# the H100 the first tile won the probe's sweep at 8192-class shapes (964 TFLOP/s at
# 8192^3 per tensor; 128x256 and 256x128 0.60-0.70x of it, 4 warps 0.37x, block_k 64
# 0.83x; the FP8 kernel probe's run 1 at eeb0d94).
_TILES = ((128, 128, 128, 8, 4), (64, 128, 128, 4, 4), (64, 64, 128, 4, 4))
# Up to this many rows the default reads a B stored (K, N) in place, multiplying in
# float16 (`scaled.dot_f16`), rather than transposing it first for FP8 wgmma: there the
# weight's bytes bound the GEMM, and the transpose pass costs about what the GEMM does.
# At 128x4096x14336 per tensor on an H200: 49.7 us against 62.9 with the transpose (XLA's
# scaled form 71.2); at 256 rows the transpose already won, 80.7 against 92.6 us
# (the fp8-inplace-f16 probe's run1 at 01180b5). Its tile, the best of run1's 48 at 128 rows:
# 128x64x128, 4 warps, 3 stages (128x128x128 on 8 warps 49.9 us, 64-row tiles >= 56 us).
IN_PLACE_MAX_ROWS = 128
_IN_PLACE_TILE = (128, 64, 128, 4, 3)
# Swapped (`swap_ab`: block_m still tiles C's rows), the weight is read once with FP8
# math, which pays further: up to 256 rows, where 256x4096x14336 ran 66.5 us against
# 81.1 for the transposing default (the fp8-swap probe's run2 at 665c6f9, an H100). Not below
# a megabyte of operands, where the f16 tile above ran 5.2 us at 32x1024x768 and the
# swapped one 7.2 (six programs).
SWAP_MAX_ROWS = 256
# The swapped tiles: up to 128 rows a tile (wgmma's N) against 128 columns of the
# weight (its M) on 8 warps, 4 stages, where that gives 3/4 of the SMs a program;
# else 64 columns on 4 warps, twice the programs. Run2 (H100, per tensor): 128x4096x14336
# in 32.8 us on 112 programs of 128 columns (XLA's scaled form 70.5, the f16 tile 49.5),
# 42.6 on 224 of 64; 128x14336x4096 in 100.1 us on 32 programs of 128 columns, 62.3 on
# 64 of 64. Run1 (H200, 39 tiles at 128 rows): 128x128 on 4 warps spills (80-95 us).
_SWAPPED_TILE = (128, 128, 128, 8, 4)
_SWAPPED_NARROW_TILE = (128, 64, 128, 4, 4)
_SWAPPED_MIN_SM_FRACTION = 0.75
# The K steps tl.dot takes on fp8: wgmma's k is 32, and a step never crosses a
# 128-wide scale block.
BLOCK_K_CHOICES = (32, 64, 128)


def check_fp8_operands(what: str, **dtypes) -> None:
  """NotImplementedError naming the operand (its keyword) whose dtype is not fp8: the
  FP8 kernels' check, here and in scaled_ragged_dot's backend."""
  for name, dtype in dtypes.items():
    if np.dtype(dtype) not in FP8_DTYPES:
      raise NotImplementedError(f"{what} takes fp8 operands {[d.name for d in FP8_DTYPES]}; "
                                f"got {name}.dtype={np.dtype(dtype).name}")


def fp8_smem_bytes(config) -> tuple[int, str]:
  """(bytes of shared memory an FP8 launch needs, the formula in words): num_stages copies
  of both operands' tiles, one byte an element (here and in scaled_ragged_dot's backend)."""
  smem = config.num_stages * (config.block_m + config.block_n) * config.block_k
  formula = (f"num_stages={config.num_stages} x (block_m={config.block_m} + "
             f"block_n={config.block_n}) x block_k={config.block_k} x 1 B")
  return smem, formula


def check_k_step(what: str, block_k: int) -> None:
  """ValueError unless block_k is one of BLOCK_K_CHOICES (the FP8 kernels' K loop)."""
  if block_k not in BLOCK_K_CHOICES:
    raise ValueError(f"{what}: config.block_k={block_k} must be one of {list(BLOCK_K_CHOICES)} "
                     f"(a K step divides the {BLOCK}-wide scale block, and fp8 tensor "
                     f"cores take 32 of K at a time)")


class TritonScaledMatmul(registry.Backend):
  op = "scaled_matmul"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records.
  kernel_modules = ("jaxgemm.kernels.triton.scaled_matmul.scaled", "jaxgemm.triton_call")
  config_cls = TritonConfig
  variants = ("blocked",)

  def __init__(self, num_sms: int | None = None):
    """num_sms: as `TritonMatmul`'s (the SMs the heuristic sizes grids for)."""
    self._matmul = TritonMatmul(num_sms)

  def for_platform(self, platform: str | None) -> "TritonScaledMatmul":
    backend = TritonScaledMatmul()
    backend._matmul = self._matmul.for_platform(platform)
    return backend

  def structural_win(self, problem: ScaledMatmulProblem, device_kind: str) -> str | None:
    """Where `scaled_matmul.problem.kernel_win` (the measurement) names this backend."""
    win = kernel_win(problem, device_kind)
    return win[1] if win and win[0] == "triton" else None

  def default_variant(self, problem: ScaledMatmulProblem) -> str:
    return "blocked"

  def default_config(self, problem: ScaledMatmulProblem, variant: str) -> TritonConfig:
    """The largest tile of `_TILES` that gives the SMs one wave of programs (the
    smallest where none does; the largest in the interpreter, which has no SMs
    to fill), clamped to the problem: rows to the next power of two from 16
    below 64 rows (mma.sync there: wgmma needs 64), columns from 16, K steps
    from 32 up to 128; then fewer stages until shared memory holds them."""
    num_sms = self._matmul.num_sms
    swap = self._swaps(problem)
    in_place = swap or self._reads_weight_in_place(problem)
    for block_m, block_n, block_k, num_warps, num_stages in _TILES:
      if tile_count(problem, block_m, block_n) >= num_sms:
        break
    if swap:
      tile = _SWAPPED_TILE
      if tile_count(problem, 128, 128) < _SWAPPED_MIN_SM_FRACTION * num_sms:
        tile = _SWAPPED_NARROW_TILE
      block_m, block_n, block_k, num_warps, num_stages = tile
    elif in_place:
      block_m, block_n, block_k, num_warps, num_stages = _IN_PLACE_TILE
    # Swapped, block_m is wgmma's N, which takes 16 and up.
    min_m = 64 if problem.m >= 64 and not swap else 16
    config = TritonConfig(
        block_m=pow2_at_least(problem.m, min_m, block_m),
        block_n=pow2_at_least(problem.n, 16, block_n),
        block_k=pow2_at_least(problem.k, BLOCK_K_CHOICES[0], block_k),
        num_warps=num_warps, num_stages=num_stages, group_m=8,
        align_operands=self._worth_aligning(problem) and not in_place, swap_ab=swap)
    return self._within_smem(problem, config)

  @staticmethod
  def _worth_aligning(problem: ScaledMatmulProblem) -> bool:
    """Relayout pays on large operands (matmul's ALIGN_MIN_OPERAND_BYTES: below a
    megabyte the extra pass costs about what the GEMM does)."""
    operand_bytes = problem.batch * (problem.m + problem.n) * problem.k   # one byte each
    return operand_bytes >= ALIGN_MIN_OPERAND_BYTES

  @staticmethod
  def _reads_weight_in_place(problem: ScaledMatmulProblem) -> bool:
    """A few rows (`IN_PLACE_MAX_ROWS`) against a B stored (K, N): read it as it is."""
    return problem.m <= IN_PLACE_MAX_ROWS and not problem.trans_b

  @classmethod
  def _swaps(cls, problem: ScaledMatmulProblem) -> bool:
    """Run C^T = B^T A^T (`swap_ab`): up to `SWAP_MAX_ROWS` rows of a K-major A (the
    swapped problem's K-major B) against a B stored (K, N) (its A, through registers),
    with scales that swap (not block scales), from a megabyte of operands."""
    return (problem.m <= SWAP_MAX_ROWS and not problem.trans_a and not problem.trans_b
            and problem.scale_kind != "block" and cls._worth_aligning(problem))

  def tuning_candidates(self, problem: ScaledMatmulProblem) -> list[tuple[str, TritonConfig]]:
    """The heuristic's config, a tile of other programs per wave (64 rows on 4 warps;
    swapped, the other of the two swapped tiles: a swapped 128x128 tile on 4 warps
    spills), and the heuristic's tile with as many stages as shared memory holds
    (deeper prefetch)."""
    base = self.default_config(problem, "blocked")
    if base.swap_ab:
      tile = _SWAPPED_NARROW_TILE if base.block_n > 64 else _SWAPPED_TILE
      other = dataclasses.replace(base, block_n=pow2_at_least(problem.n, 16, tile[1]),
                                  num_warps=tile[3])
    else:
      other = dataclasses.replace(base, block_m=min(base.block_m, 64), num_warps=4)
    candidates = [base, self._within_smem(problem, other),
                  self._within_smem(problem, dataclasses.replace(base, num_stages=8))]
    out = []
    for config in candidates:
      if ("blocked", config) not in out:
        out.append(("blocked", config))
    return out

  def _within_smem(self, problem, config: TritonConfig) -> TritonConfig:
    return within_shared_memory(config, lambda c: fp8_smem_bytes(c)[0], SMEM_CAPACITY_BYTES)

  def check(self, problem: ScaledMatmulProblem, variant: str, config: KernelConfig) -> None:
    what = f"backend='triton' variant={variant!r} (scaled_matmul)"
    if variant not in self.variants:
      raise ValueError(f"unknown variant={variant!r} for {what}; valid: {list(self.variants)}")
    check_fp8_operands(what, a=problem.dtype, b=problem.b_dtype)
    if config.split_k > 1:
      raise NotImplementedError(f"{what} does not split K; config.split_k must be 1, got "
                                f"{config.split_k}")
    if config.tma:
      raise NotImplementedError(f"{what} has no TMA path; config.tma must be False")
    if config.warp_specialize:
      raise NotImplementedError(f"{what} is not warp-specialized; config.warp_specialize "
                                f"must be False")
    if config.epilogue_subtile != 1:
      raise NotImplementedError(f"{what} stores whole tiles; config.epilogue_subtile must be "
                                f"1, got {config.epilogue_subtile}")
    if config.swap_ab and problem.scale_kind == "block":
      raise ValueError(f"{what}: config.swap_ab=True needs 'tensor' or 'row_col' scales, got "
                       f"scale_kind='block' (a's 1x128 and b's 128x128 blocks do not swap)")
    check_k_step(what, config.block_k)
    check_shared_memory(what, *fp8_smem_bytes(config), SMEM_CAPACITY_BYTES)

  def impl(self, problem: ScaledMatmulProblem, variant: str, config: KernelConfig,
           platform: str):
    """fn(a, b, a_scale, b_scale) -> C on canonical operands (see `scaled_matmul_p`)."""
    from jaxgemm.kernels.triton.scaled_matmul import scaled  # noqa: PLC0415 (needs triton)
    return scaled.relaid_scaled_matmul(problem, config, platform)


registry.register(TritonScaledMatmul())
