"""The `triton` backend of `ragged_dot`: the grouped kernels in `jaxgemm.kernels.triton.ragged_dot`.

One variant, `grouped`: a tensor-core GEMM per (group, tile) whose mapping of
tiles to groups is read from a table computed on the device
(`jaxgemm.ragged_schedule`), so routing can change every step with no
recompile. On the CPU the same kernel source runs in Triton's interpreter.

Tile names follow the GEMM each mode is: ragged-M (forward, lhs gradient)
tiles its output M x N and steps over K; ragged-K (weight gradient,
out (G, K, N)) tiles its output K x N as block_m x block_n and steps over the
group's rows in block_k.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from jaxgemm import registry
from jaxgemm.config import (KernelConfig, check_shared_memory, int_range, power_of_two,
                            within_shared_memory)
from jaxgemm.gemm import DEFAULT_NUM_SMS, SMEM_CAPACITY_BYTES, pow2_at_least
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem

_DTYPES = tuple(map(np.dtype, ("float16", "bfloat16", "float32")))
_OUT_DTYPES = _DTYPES

# Tensor-core tiles, largest first: (block_m, block_n, block_k of 16-bit
# operands, num_warps, num_stages). 128x256x64 in 3 stages is the matmul's
# 750 TFLOP/s tile (../../shared/GPU_NOTES.md). On the H100 (bf16, Dirichlet(2)
# group sizes, research/ragged_dot/triton_gpu.py at ead8d4f) it was the best
# of these on every problem timed: G=8 M=16384 K=4096 N=14336 forward 700
# TFLOP/s (128x128: 549), G=64 M=16384 K=2048 N=1408 339 (128x128: 313, the
# 64-row tiles 280-282), the G=8 weight gradient 654 (128x128: 567). That run
# cut tiles at multiples of block_m; tiles now start at each group's first row.
_TILES = ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 256, 64, 4, 3),
          (64, 128, 64, 4, 4))
# Exact fp32 (precision=HIGHEST) runs as FMA on CUDA cores: the matmul's
# `pipelined` tile (46 TFLOP/s at 8192^3 on the H200).
_IEEE_TILE = (64, 128, 32, 4, 3)
# `TritonRaggedDot.structural_win`: the smallest problem (FLOPs) that claims a win.
# The smaller of the two measured forwards had 94.5 GFLOP.
STRUCTURAL_WIN_MIN_FLOPS = 2**36


@dataclasses.dataclass(frozen=True)
class RaggedDotTritonConfig(KernelConfig):
  """Tiling and launch parameters of the grouped Triton kernels.

  Ragged-M: output tile block_m (rows) x block_n, K in block_k steps.
  Ragged-K (out (G, K, N)): output tile block_m (along K) x block_n, the
  group's rows in block_k steps. group_m: tile rows walked per column (L2 reuse).
  persistent: one program per SM walking the work items, so that the next
  item's loads overlap this one's epilogue.

  >>> RaggedDotTritonConfig(block_m=64, block_n=128, block_k=64, num_warps=4).block_m
  64
  """

  backend = "triton"
  block_m: int = power_of_two(16, 256, default=128)
  block_n: int = power_of_two(16, 256, default=128)
  block_k: int = power_of_two(16, 256, default=64)
  group_m: int = int_range(1, 64, default=8)
  num_warps: int = power_of_two(1, 16, default=8)
  num_stages: int = int_range(1, 8, default=3)
  persistent: bool = False


def _out_rows_cols(problem: RaggedDotProblem) -> tuple[int, int, int]:
  """(output tile rows dim, output cols dim, reduction dim) of the mode's GEMM."""
  if problem.ragged_contracting:
    return problem.k, problem.n, max(1, problem.m // max(1, problem.groups))
  return problem.m, problem.n, problem.k


def _clamped(problem: RaggedDotProblem, tiles: dict) -> dict:
  """`tiles` with no block larger than the next power of two over the problem."""
  rows, cols, red = _out_rows_cols(problem)
  min_rows = 64 if rows >= 64 else 16
  return {**tiles,
          "block_m": pow2_at_least(rows, min_rows, tiles["block_m"]),
          "block_n": pow2_at_least(cols, 16, tiles["block_n"]),
          "block_k": pow2_at_least(red, 16, tiles["block_k"])}


def _tile_dict(tile, k_scale: int = 1) -> dict:
  block_m, block_n, block_k, num_warps, num_stages = tile
  return dict(block_m=block_m, block_n=block_n, block_k=max(16, block_k // k_scale),
              num_warps=num_warps, num_stages=num_stages, group_m=8)


class TritonRaggedDot(registry.Backend):
  op = "ragged_dot"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records.
  kernel_modules = ("jaxgemm.kernels.triton.ragged_dot.grouped", "jaxgemm.triton_call",
                    "jaxgemm.ragged_schedule")
  config_cls = RaggedDotTritonConfig
  variants = ("grouped",)

  def structural_win(self, problem: RaggedDotProblem, device_kind: str) -> str | None:
    """Where the heuristic choice was measured to beat XLA's `lax.ragged_dot` (Hopper).

    16-bit ragged-M problems (forward and dgrad) of at least
    STRUCTURAL_WIN_MIN_FLOPS: XLA runs them as per-group cuBLAS calls and
    fusions. H200 (the moe suite at ca37e37): forwards 747 and 441
    TFLOP/s against XLA's 98 and 11, dgrads 755 and 447 against 93 and 12.
    Below the bound (the decode shape, 15 GFLOP) both read 1.00x. The weight
    gradient (ragged-K) ran faster on Pallas, which claims it.
    """
    if not any(kind in device_kind for kind in ("H100", "H200")):
      return None
    if (problem.ragged_contracting or problem.fp32_precision is not None
        or problem.flops < STRUCTURAL_WIN_MIN_FLOPS):
      return None
    return (f"grouped GEMM of {problem.flops / 1e9:.0f} GFLOP: XLA's ragged_dot ran 7-33x "
            f"slower on the MoE shapes measured")

  @staticmethod
  def _k_scale(problem: RaggedDotProblem) -> int:
    return np.dtype(problem.dtype).itemsize // 2   # fp32: half as deep, same bytes

  def default_config(self, problem: RaggedDotProblem, variant: str) -> RaggedDotTritonConfig:
    """The heuristic tile: 128x256x64 (measured best on both MoE shapes and the weight
    gradient), 128x128 where N is narrow or (ragged-K) 128x256 tiles leave SMs
    idle; clamped to the problem (tiny CPU problems run few programs)."""
    if problem.fp32_precision == "ieee":
      return self._within_smem(problem, RaggedDotTritonConfig(**_clamped(
          problem, _tile_dict(_IEEE_TILE))))
    k_scale = self._k_scale(problem)
    if problem.ragged_contracting:
      tile = _TILES[0]
      for candidate in _TILES[:2]:
        tile = candidate
        tiles = (problem.batch * problem.groups * -(-problem.k // candidate[0])
                 * -(-problem.n // candidate[1]))
        if tiles >= DEFAULT_NUM_SMS:
          break
    else:
      tile = _TILES[1] if problem.n <= 128 else _TILES[0]
    config = RaggedDotTritonConfig(**_clamped(problem, _tile_dict(tile, k_scale)))
    return self._within_smem(problem, config)

  def tuning_candidates(self, problem: RaggedDotProblem) -> list[tuple[str, KernelConfig]]:
    """The heuristic's tile first, then the tensor-core tiles (clamped, fitted), each on
    a grid of work items and persistent."""
    base = self.default_config(problem, "grouped")
    out = [("grouped", base)]
    if problem.fp32_precision == "ieee":
      return out
    k_scale = self._k_scale(problem)
    for tile in _TILES:
      config = self._within_smem(problem, RaggedDotTritonConfig(
          **_clamped(problem, _tile_dict(tile, k_scale))))
      for persistent in (False, True):
        config = dataclasses.replace(config, persistent=persistent)
        if config not in [c for _, c in out]:
          out.append(("grouped", config))
    return out

  def _within_smem(self, problem, config: RaggedDotTritonConfig) -> RaggedDotTritonConfig:
    """`config` with fewer stages, then narrower N tiles, until it fits in shared memory."""
    return within_shared_memory(config, lambda c: self._smem_bytes(problem, c)[0],
                                SMEM_CAPACITY_BYTES)

  @staticmethod
  def _smem_bytes(problem: RaggedDotProblem, config) -> tuple[int, str]:
    """(bytes of shared memory the launch needs, the formula in words): num_stages
    copies of both operand tiles in their dtype, as the matmul's tensorcore rung."""
    itemsize = np.dtype(problem.dtype).itemsize
    smem = config.num_stages * (config.block_m + config.block_n) * config.block_k * itemsize
    formula = (f"num_stages={config.num_stages} x (block_m={config.block_m} + "
               f"block_n={config.block_n}) x block_k={config.block_k} x {itemsize} B")
    return smem, formula

  def check(self, problem: RaggedDotProblem, variant: str, config: KernelConfig) -> None:
    what = f"backend='triton' variant={variant!r} (ragged_dot)"
    if variant not in self.variants:
      raise ValueError(f"unknown variant={variant!r} for {what}; valid: {list(self.variants)}")
    registry.require_dtypes(problem, what, _DTYPES)
    if np.dtype(problem.out_dtype) not in _OUT_DTYPES:
      raise NotImplementedError(
          f"{what} does not support out dtype={np.dtype(problem.out_dtype).name}; "
          f"supported: {[d.name for d in _OUT_DTYPES]}")
    if np.dtype(problem.acc_dtype) != np.float32:
      raise NotImplementedError(f"{what} accumulates in float32 only, "
                                f"got acc_dtype={np.dtype(problem.acc_dtype).name}")
    for field in ("block_m", "block_n", "block_k"):
      if getattr(config, field) < 16:
        raise ValueError(f"{what}: tl.dot needs {field} >= 16, got {getattr(config, field)}")
    check_shared_memory(what, *self._smem_bytes(problem, config), SMEM_CAPACITY_BYTES)

  def impl(self, problem: RaggedDotProblem, variant: str, config: KernelConfig, platform: str):
    grouped = importlib.import_module("jaxgemm.kernels.triton.ragged_dot.grouped")
    return lambda lhs, rhs, group_bounds: grouped.ragged_dot(
        lhs, rhs, group_bounds, problem, config, platform)


registry.register(TritonRaggedDot())
