"""The `triton` backend: the Triton kernel ladder in `jaxgemm.kernels.triton`.

On GPU the kernels are compiled by Triton and called through jax-triton
(`triton_call.py` explains the integer-specialization layer that restores
native speed); on CPU the same kernel source runs in Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from jaxgemm import registry
from jaxgemm.config import KernelConfig, check, int_range, power_of_two
from jaxgemm.kernels.triton.matmul import layout
from jaxgemm.ops.matmul.problem import GemmProblem

# Hopper's opt-in shared memory per block (227 KB), what a config may fill.
SMEM_BYTES = 227 * 1024
# Streaming multiprocessors of an H100/H200, for split-K and persistent grids
# when the device cannot be asked (CPU interpreter runs).
DEFAULT_NUM_SMS = 132


@dataclasses.dataclass(frozen=True)
class TritonConfig(KernelConfig):
  """Tiling and launch parameters of a Triton kernel (fields a rung ignores are unused).

  >>> import jaxgemm
  >>> jaxgemm.TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8).block_n
  256
  """

  backend = "triton"
  block_m: int = power_of_two(16, 256, default=128)
  block_n: int = power_of_two(16, 256, default=128)
  block_k: int = power_of_two(8, 256, default=32)
  group_m: int = int_range(1, 64, default=8)
  num_warps: int = power_of_two(1, 16, default=4)
  num_stages: int = int_range(1, 8, default=3)
  split_k: int = int_range(1, 64, default=1)
  epilogue_subtile: int = check(lambda v: v in (1, 2), "1 or 2", default=1)
  warp_specialize: bool = False
  tma: bool = False


@dataclasses.dataclass(frozen=True)
class _Rung:
  module: str
  cuda_cores: bool     # fp32 FMA (any precision) vs tensor cores (16-bit, tf32)
  uses_smem: bool = True
  split_k: bool = False


_RUNGS = {
    "naive": _Rung("naive", cuda_cores=True, uses_smem=False),
    "tiled": _Rung("tiled", cuda_cores=True),
    "pipelined": _Rung("pipelined", cuda_cores=True),
    "tensorcore": _Rung("tensorcore", cuda_cores=False),
    "persistent": _Rung("persistent", cuda_cores=False),
    "splitk": _Rung("splitk", cuda_cores=False, split_k=True),
}

_DTYPES = tuple(map(np.dtype, ("float16", "bfloat16", "float32")))


def _pow2_at_least(x: int, lo: int, hi: int) -> int:
  p = lo
  while p < x and p < hi:
    p *= 2
  return p


def _clamped(problem: GemmProblem, variant: str, tiles: dict) -> dict:
  """`tiles` with no block larger than the next power of two over the problem."""
  min_mn = 16 if _RUNGS[variant].cuda_cores else 64 if problem.m >= 64 else 16
  return {**tiles,
          "block_m": _pow2_at_least(problem.m, min_mn, tiles["block_m"]),
          "block_n": _pow2_at_least(problem.n, 16, tiles["block_n"]),
          "block_k": _pow2_at_least(problem.k, 16, tiles["block_k"])}


class TritonMatmul(registry.Backend):
  op = "matmul"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records.
  kernel_modules = ("jaxgemm.kernels.triton.common", "jaxgemm.kernels.triton.matmul",
                    "jaxgemm.triton_call")
  config_cls = TritonConfig
  variants = tuple(_RUNGS)

  def unavailable_reason(self) -> str | None:
    try:
      import triton  # noqa: F401, PLC0415
    except ImportError:
      return "the `triton` package is not installed (pip install 'jaxgemm[triton]')"
    return None

  def default_variant(self, problem: GemmProblem) -> str:
    if problem.fp32_precision == "ieee":
      return "pipelined"
    if self._split_k_for(problem) > 1:
      return "splitk"
    if problem.fp32_precision is not None:
      # 8192^3 TF32 on the H200: tensorcore 383 TFLOP/s, persistent 277
      # (research/probes/h200-triton-ladder-2026-11-22-run2).
      return "tensorcore"
    return "persistent"

  def _split_k_for(self, problem: GemmProblem) -> int:
    """K slices that bring the program count near two waves of SMs (1 = no split)."""
    cfg = self._tile_defaults(problem, "splitk")
    tiles = problem.batch * -(-problem.m // cfg["block_m"]) * -(-problem.n // cfg["block_n"])
    split = 1
    while (tiles * split * 2 <= 2 * DEFAULT_NUM_SMS
           and problem.k // (split * 2) >= 4 * cfg["block_k"] and split < 16):
      split *= 2
    return split

  def _tile_defaults(self, problem: GemmProblem, variant: str) -> dict:
    wide = np.dtype(problem.dtype).itemsize == 4
    if variant == "naive":
      tiles = dict(block_m=32, block_n=32, block_k=8, num_warps=4, num_stages=1, group_m=1)
    elif variant == "tiled":
      tiles = dict(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=1, group_m=1)
    elif variant == "pipelined":
      # Exact fp32 on the H200, 8192^3: 46.1 TFLOP/s with these tiles, 45.5 at
      # 128x64x32 (2 stages), 42.7 at 128x128x32 with 8 warps; nine configs in
      # research/probes/h200-triton-ladder-2026-11-22-run{2,3}.
      tiles = dict(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=3, group_m=8)
    elif variant == "splitk":
      tiles = dict(block_m=64, block_n=64, block_k=32 if wide else 64, num_warps=4,
                   num_stages=4, group_m=1)
    elif variant == "persistent":
      tiles = (dict(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=3, group_m=8)
               if wide else
               dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, group_m=8,
                    epilogue_subtile=2))
    else:  # tensor cores: the tile that ran 750 TFLOP/s natively (GPU_NOTES.md)
      # TF32 8192^3: 383 TFLOP/s at 128x256x32, 309 at 128x128x32
      # (research/probes/h200-triton-ladder-2026-11-22-run2).
      tiles = (dict(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=3, group_m=8)
               if wide else
               dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, group_m=8))
    return _clamped(problem, variant, tiles)

  def default_config(self, problem: GemmProblem, variant: str) -> TritonConfig:
    tiles = self._tile_defaults(problem, variant)
    if variant == "splitk":
      tiles["split_k"] = self._split_k_for(problem)
    return self._within_smem(problem, variant, TritonConfig(**tiles))

  def _within_smem(self, problem: GemmProblem, variant: str,
                   config: TritonConfig) -> TritonConfig:
    """`config` with fewer stages, then narrower N tiles, until it fits in shared memory.

    The default tiles are sized for 16-bit outputs; an fp32 output's epilogue
    tile is twice as large (bf16 -> f32 at 128x256x64 in 3 stages needs
    278528 B of the 232448).
    """
    while self._smem_bytes(problem, variant, config)[0] > SMEM_BYTES:
      if config.num_stages > 2:
        config = dataclasses.replace(config, num_stages=config.num_stages - 1)
      elif config.block_n > 16:
        config = dataclasses.replace(config, block_n=config.block_n // 2)
      else:
        break   # check() reports it
    return config

  @staticmethod
  def _smem_bytes(problem: GemmProblem, variant: str, config) -> tuple[int, str]:
    """(bytes of shared memory the launch needs, the formula in words)."""
    if not _RUNGS[variant].uses_smem:
      return 0, "no shared memory"
    # num_stages copies of both tiles in their input dtype; the persistent
    # kernel also stages the C tile for its epilogue. Both terms matched the
    # H200's launch errors exactly (278528 B for 128x256x32 fp32, 3 stages).
    itemsize = np.dtype(problem.dtype).itemsize
    smem = config.num_stages * (config.block_m + config.block_n) * config.block_k * itemsize
    formula = (f"num_stages={config.num_stages} x (block_m={config.block_m} + "
               f"block_n={config.block_n}) x block_k={config.block_k} x {itemsize} B")
    if variant == "persistent":
      out_itemsize = np.dtype(problem.out_dtype).itemsize
      smem += config.block_m * config.block_n * out_itemsize
      formula += f" + block_m x block_n x {out_itemsize} B for the epilogue"
    return smem, formula

  def tuning_candidates(self, problem: GemmProblem) -> list[tuple[str, TritonConfig]]:
    """The tensor-core rungs at their defaults and one smaller tile each, and split-K
    where it applies (exact fp32: the pipelined rung's tiles).

    The smaller 128x128x64 tile trades per-tile efficiency for more tiles on
    the 132 SMs, which helps mid-sized problems (one tile wave at 128x256).
    """
    if problem.fp32_precision == "ieee":
      base = self.default_config(problem, "pipelined")
      other = _clamped(problem, "pipelined", dict(block_m=128, block_n=64, block_k=32))
      return [("pipelined", base), ("pipelined", dataclasses.replace(base, **other))]
    out = []
    small = dict(block_m=128, block_n=128, block_k=64 if not problem.fp32_precision else 32,
                 num_stages=4, epilogue_subtile=1)
    for variant in ("persistent", "tensorcore"):
      base = self.default_config(problem, variant)
      smaller = dataclasses.replace(base, **_clamped(problem, variant, small))
      out += [(variant, base), (variant, self._within_smem(problem, variant, smaller))]
    if self._split_k_for(problem) > 1:
      out.append(("splitk", self.default_config(problem, "splitk")))
    return out

  def check(self, problem: GemmProblem, variant: str, config: KernelConfig) -> None:
    rung = _RUNGS[variant]
    what = f"backend='triton' variant={variant!r}"
    registry.require_dtypes(problem, what, _DTYPES)
    if not rung.cuda_cores and problem.fp32_precision == "ieee":
      raise NotImplementedError(
          f"{what} runs fp32 on tensor cores (TF32), but precision=HIGHEST asks for exact "
          f"fp32; use variant='pipelined' (or 'tiled', 'naive')")
    if config.split_k > 1 and not rung.split_k:
      raise ValueError(f"{what} does not split K; config.split_k={config.split_k} needs "
                       f"variant='splitk'")
    if variant != "naive" and config.block_k < 16:
      raise ValueError(f"{what}: tl.dot needs block_k >= 16, got {config.block_k=}")
    if config.tma and variant != "persistent":
      raise ValueError(f"{what} has no TMA path; config.tma=True needs variant='persistent'")
    if config.tma and (why := layout.misaligned_rows(problem)):
      raise NotImplementedError(f"{what} loads with TMA, which needs 16-byte aligned rows: "
                                f"{why}; config.tma=False takes any shape")
    if config.epilogue_subtile > 1 and config.block_n % (8 * config.epilogue_subtile):
      raise ValueError(f"{what}: {config.block_n=} must be divisible by "
                       f"8 x {config.epilogue_subtile=}")
    smem, formula = self._smem_bytes(problem, variant, config)
    if smem > SMEM_BYTES:
      raise ValueError(
          f"{what}: config needs {smem} bytes of shared memory ({formula}), more than "
          f"the {SMEM_BYTES} available; lower num_stages or the tiles")

  def impl(self, problem: GemmProblem, variant: str, config: KernelConfig, platform: str):
    kernel = importlib.import_module(f"jaxgemm.kernels.triton.matmul.{_RUNGS[variant].module}")
    if _RUNGS[variant].cuda_cores:
      return lambda a, b: kernel.matmul(a, b, problem, config, platform)
    return layout.tensor_core_layout(kernel.matmul, problem, config, platform)


registry.register(TritonMatmul())
