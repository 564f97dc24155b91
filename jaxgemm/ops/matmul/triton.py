"""The `triton` backend: the Triton kernel ladder in `jaxgemm.kernels.triton`.

On GPU the kernels are compiled by Triton and called through jax-triton
(`triton_call.py` explains the integer-specialization layer that restores
native speed); on CPU the same kernel source runs in Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import jax
import numpy as np

from jaxgemm import registry
from jaxgemm.config import (KernelConfig, check, check_shared_memory, int_range, power_of_two,
                            within_shared_memory)
from jaxgemm.gemm import SMEM_CAPACITY_BYTES, GemmProblem, pow2_at_least, tile_count
from jaxgemm.kernels.triton.matmul import layout

# The SMs the heuristic fills where Triton's interpreter runs the kernel (the
# CPU): none. The interpreter runs a grid's programs one after another, at a
# cost that grows with their number, so no wave rule should ask for more
# programs: with 0 every rule is met by the largest tile, and no K is split.
# Sized for 132 SMs, the CPU tests' small problems ran several programs each
# where one would do (docs/testing.md has the CPU suite's times).
INTERPRETER_NUM_SMS = 0


@functools.cache
def heuristic_num_sms(platform: str | None = None) -> int:
  """SMs of the device that runs `platform`'s kernels, as the heuristic counts them.

  platform: a lowering platform ("cuda", "cpu"), or None for jax's default
  device. A GPU's SMs are what the persistent kernel's grid fills
  (`persistent.num_sms`: the device's `core_count`, `jaxgemm.gemm.DEFAULT_NUM_SMS`
  where jax cannot say); the CPU interpreter counts INTERPRETER_NUM_SMS.
  """
  if (platform or jax.default_backend()) == "cpu":
    return INTERPRETER_NUM_SMS
  from jaxgemm.kernels.triton.matmul import persistent  # noqa: PLC0415 (needs triton)
  return persistent.num_sms("cuda")


@dataclasses.dataclass(frozen=True)
class TritonConfig(KernelConfig):
  """Tiling and launch parameters of a Triton kernel (fields a rung ignores are unused).

  align_operands: before a tensor-core rung, zero-pad operand rows that do not
    start 16-byte aligned and bring fp32 operands K-major (one XLA pass over
    each such operand: `jaxgemm.kernels.triton.matmul.layout`). That pays on
    large problems and costs a launch or two on small ones, where False has
    the kernel read the operands as stored.
  swap_ab: compute C^T = op(B)^T op(A)^T and store it transposed, block_m and
    block_n still tiling C's rows and columns. Only the FP8 kernel of
    `scaled_matmul` takes it (`jaxgemm.kernels.triton.scaled_matmul.scaled.swapped`):
    its weight stored (K, N) becomes wgmma's A operand, fed from registers.

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
  align_operands: bool = True
  swap_ab: bool = False


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

# Tensor-core tiles, largest first: (block_m, block_n, block_k of 16-bit
# operands, num_warps, num_stages). 128x256x64 is the tile that ran 750 TFLOP/s
# natively (GPU_NOTES.md) and the 8192^3 TF32 product at 383 (128x128: 309;
# research/triton_probe.py's run 2 at 0834948, H200); the smaller ones trade
# per-tile efficiency for more tiles on the SMs.
_TENSOR_CORE_TILES = ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 4),
                      (64, 64, 64, 4, 4))
# Where `TritonMatmul.structural_win` applies: the Hopper device kinds the
# rules were measured on, the K of a one-step GEMM, and the least output (M x N)
# where one K step won. In the H200 run with no table
# (the random suite at eda866f, backend "auto") the rule
# fired on 17 problems: the 9 of >= 192512 outputs all won (r37 6016x64x32
# fp16 1.85x, r17, r36 1.6x, r07 1.46x, r06, r13, r18, r46, holdout r09
# 1.06-1.10x); below that 4 won (r04 64x64x128 1.94x, r24 1.35x, r42 1.11x,
# holdout r06 1.01x) and 4 lost (r12 317x33x461 bf16 0.85x, holdout r17
# 430x26x357 0.93x and r15 1547x47x7 0.93x, r25 192x1x512 0.99x), with no
# output size between them. Above the largest loss (153510 outputs) the rule
# kept every win: tests/test_triton.py::test_structural_wins_on_hopper_only
# pins r12, holdout r17 and r37.
MEASURED_DEVICE_KINDS = ("H100", "H200")
SHORT_K_WIN, SHORT_K_WIN_MIN_OUTPUT = 64, 170_000
# K up to this is "short" (see `TritonMatmul._tensor_core_tile`): one or two
# K steps, after which a tile only stores. With four waves of small tiles for
# such K, 761x7x1959 bf16 ran 1.57x XLA and 1327x7x853 fp16 1.62x; at K = 192
# (896x192x4416 fp16) the small tiles lost, 0.76x against 0.88x at 128x128
# (the no-record heuristic probe at eda866f, H200: heuristics v2 and v3).
SHORT_K = 64
# The least K a split-K slice gets (see `TritonMatmul._split_k_for`).
MIN_SPLIT_K = 512
# Operands smaller than this (bytes, A and B together) are read as stored
# (`TritonConfig.align_operands=False`): a relayout pass is one more launch,
# about as long as a small GEMM. 2568x12x3724 fp16 (151 KB of operands, K
# loop of one step) ran 1.08x XLA as stored, 0.81x aligned; 148x399x3575
# bf16 (3 MB, rows of 798 B) 0.40x as stored, 1.03x aligned.
ALIGN_MIN_OPERAND_BYTES = 1 << 20
# TF32 on an operand that is not K-major goes through registers, at about a
# fifth of the tensor-core rate (83 against 383 TFLOP/s at 8192^3, `layout`):
# still faster than the bandwidth where each element of B meets at most this
# many rows of A (2 x 32 FLOPs per 4-byte element at ~80 TFLOP/s is ~5 TB/s),
# so such a B is not transposed: 24x4188x16083 fp32 ran 1.19x XLA as stored,
# 0.78x transposed first; 64x11584x2304 0.18x as stored, 0.41x transposed.
TF32_REGISTER_PATH_MAX_REUSE = 32


def _operand_bytes(problem: GemmProblem) -> int:
  """Bytes of A and B together."""
  return (problem.batch * (problem.m + problem.n) * problem.k
          * np.dtype(problem.dtype).itemsize)


def _not_k_major(problem: GemmProblem) -> tuple[bool, bool]:
  """Whether A, B are stored other than K-major (A (K, M), B (K, N))."""
  return problem.trans_a, not problem.trans_b


def _worth_aligning(problem: GemmProblem) -> bool:
  """The heuristic's `align_operands` (see the constants above)."""
  if _operand_bytes(problem) < ALIGN_MIN_OPERAND_BYTES:
    return False
  if problem.fp32_precision is not None:
    a_off, b_off = _not_k_major(problem)
    if (b_off and problem.m <= TF32_REGISTER_PATH_MAX_REUSE) or (
        a_off and problem.n <= TF32_REGISTER_PATH_MAX_REUSE):
      return False
  return True


def _clamped(problem: GemmProblem, variant: str, tiles: dict) -> dict:
  """`tiles` with no block larger than the next power of two over the problem."""
  min_mn = 16 if _RUNGS[variant].cuda_cores else 64 if problem.m >= 64 else 16
  return {**tiles,
          "block_m": pow2_at_least(problem.m, min_mn, tiles["block_m"]),
          "block_n": pow2_at_least(problem.n, 16, tiles["block_n"]),
          "block_k": pow2_at_least(problem.k, 16, tiles["block_k"])}


class TritonMatmul(registry.Backend):
  op = "matmul"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records.
  rung_package = "jaxgemm.kernels.triton.matmul"
  kernel_modules = ("jaxgemm.triton_call",)
  config_cls = TritonConfig
  variants = tuple(_RUNGS)

  def kernel_modules_of(self, variant: str) -> tuple[str, ...]:
    """The registry's, and `layout` for the tensor-core rungs (`impl` lays out their operands)."""
    modules = super().kernel_modules_of(variant)
    return modules if _RUNGS[variant].cuda_cores else (
        modules + ("jaxgemm.kernels.triton.matmul.layout",))

  def __init__(self, num_sms: int | None = None):
    """num_sms: the SMs the heuristic sizes grids for; None asks jax's default
    device (`heuristic_num_sms`). `for_platform` binds the lowering's device."""
    self._num_sms = num_sms

  @property
  def num_sms(self) -> int:
    return heuristic_num_sms(None) if self._num_sms is None else self._num_sms

  def for_platform(self, platform: str | None) -> "TritonMatmul":
    return TritonMatmul(num_sms=heuristic_num_sms(platform))

  def default_variant(self, problem: GemmProblem) -> str:
    """The rung for `problem` with no tuning record.

    Measured on the `random` suite, H200, against XLA's dot in the same run
    (the no-record heuristic probe at eda866f; its README has the table).
    """
    if problem.fp32_precision == "ieee":
      return "pipelined"
    if self._split_k_for(problem) > 1:
      return "splitk"
    tile = self._tensor_core_tile(problem)
    # A persistent grid pays for itself by overlapping a tile's epilogue with
    # the next tile's loads: it needs a next tile, a K loop long enough to
    # overlap with, and 16-bit operands (8192^3 TF32: tensorcore 383 TFLOP/s,
    # persistent 277, research/triton_probe.py's run 2 at 0834948, H200).
    # With short K it lost: 761x7x1959 bf16 0.73x XLA persistent, 0.98x not.
    if (problem.fp32_precision is None and problem.k > SHORT_K and tile["block_m"] >= 128
        and tile_count(problem, tile["block_m"], tile["block_n"]) > self.num_sms):
      return "persistent"
    return "tensorcore"

  def _tensor_core_tile(self, problem: GemmProblem) -> dict:
    """The largest tile of `_TENSOR_CORE_TILES` that gives the SMs enough tiles.

    Enough is one wave of tiles, or four where K is short (<= SHORT_K): a
    tile's few K steps then cannot hide its loads' latency and its epilogue,
    and several small tiles per SM overlap them. What no tile fills, split-K
    fills (`_split_k_for`).
    """
    waves = 4 if problem.k <= SHORT_K else 1
    k_scale = np.dtype(problem.dtype).itemsize // 2   # fp32: half as deep, same bytes
    for block_m, block_n, block_k, num_warps, num_stages in _TENSOR_CORE_TILES:
      tile = _clamped(problem, "tensorcore", dict(
          block_m=block_m, block_n=block_n, block_k=block_k // k_scale, num_warps=num_warps,
          num_stages=num_stages, group_m=8))
      if tile_count(problem, tile["block_m"], tile["block_n"]) >= waves * self.num_sms:
        return tile
    return tile

  def structural_win(self, problem: GemmProblem, device_kind: str) -> str | None:
    """Where the heuristic choice was measured to beat XLA's dot (Hopper only).

    * Rows that are not 16-byte aligned, with more than a megabyte of
      operands and more than 16 rows and columns: cuBLAS's fast kernels need
      aligned rows, ours pads them in one pass (`align_operands`).
    * 16-bit operands with K <= SHORT_K_WIN, a GEMM of one K step, and at
      least SHORT_K_WIN_MIN_OUTPUT elements of C: XLA's dot costs a full
      GEMM launch or more, ours writes C at once. (Below that output size
      both take a microsecond or two, and ours lost as often as it won.)

    Measured on the `random` suite (the no-record heuristic probe at eda866f, H200).
    """
    if not any(kind in device_kind for kind in MEASURED_DEVICE_KINDS):
      return None
    if problem.fp32_precision == "ieee":
      return None
    misaligned, operand_bytes = layout.misaligned_rows(problem), _operand_bytes(problem)
    if (misaligned and operand_bytes >= ALIGN_MIN_OPERAND_BYTES
        and min(problem.m, problem.n) > 16):
      return f"unaligned rows ({misaligned}), {operand_bytes} B of operands"
    if (problem.fp32_precision is None and problem.k <= SHORT_K_WIN
        and problem.m * problem.n >= SHORT_K_WIN_MIN_OUTPUT):
      return f"{problem.k=} is one K step"
    return None

  def _split_k_for(self, problem: GemmProblem) -> int:
    """K slices that bring the program count near two waves of SMs (1 = no split).

    Each slice keeps at least MIN_SPLIT_K of K: a slice also writes an fp32
    partial tile and the slices are summed afterwards, which only a long
    enough K loop pays for.
    """
    if problem.fp32_precision == "ieee":
      return 1
    tile = self._tensor_core_tile(problem)
    tiles = tile_count(problem, tile["block_m"], tile["block_n"])
    split = 1
    while (tiles * split * 2 <= 2 * self.num_sms
           and problem.k // (split * 2) >= max(4 * tile["block_k"], MIN_SPLIT_K)
           and split < 16):
      split *= 2
    return split

  def _tile_defaults(self, problem: GemmProblem, variant: str) -> dict:
    if variant == "naive":
      tiles = dict(block_m=32, block_n=32, block_k=8, num_warps=4, num_stages=1, group_m=1)
    elif variant == "tiled":
      tiles = dict(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=1, group_m=1)
    elif variant == "pipelined":
      # Exact fp32 on the H200, 8192^3: 46.1 TFLOP/s with these tiles, 45.5 at
      # 128x64x32 (2 stages), 42.7 at 128x128x32 with 8 warps; nine configs in
      # research/triton_probe.py's runs 2 and 3 at 0834948, H200.
      tiles = dict(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=3, group_m=8)
    else:
      tiles = self._tensor_core_tile(problem)
      if variant == "persistent" and tiles["block_n"] >= 256:
        tiles["epilogue_subtile"] = 2
    return _clamped(problem, variant, tiles)

  def default_config(self, problem: GemmProblem, variant: str) -> TritonConfig:
    tiles = self._tile_defaults(problem, variant)
    if variant == "splitk":
      tiles["split_k"] = self._split_k_for(problem)
    tiles["align_operands"] = _worth_aligning(problem)
    return self._within_smem(problem, variant, TritonConfig(**tiles))

  def _within_smem(self, problem: GemmProblem, variant: str,
                   config: TritonConfig) -> TritonConfig:
    """`config` with fewer stages, then narrower N tiles, until it fits in shared memory.

    The default tiles are sized for 16-bit outputs; an fp32 output's epilogue
    tile is twice as large (bf16 -> f32 at 128x256x64 in 3 stages needs
    278528 B of the 232448).
    """
    return within_shared_memory(
        config, lambda c: self.smem_bytes(problem, variant, c)[0], SMEM_CAPACITY_BYTES)

  @staticmethod
  def smem_bytes(problem: GemmProblem, variant: str, config) -> tuple[int, str]:
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
    if config.swap_ab:
      raise ValueError(f"{what} does not swap its operands; config.swap_ab must be False "
                       f"(only scaled_matmul's Triton kernel takes it)")
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
    check_shared_memory(what, *self.smem_bytes(problem, variant, config), SMEM_CAPACITY_BYTES)

  def impl(self, problem: GemmProblem, variant: str, config: KernelConfig, platform: str):
    kernel = importlib.import_module(f"jaxgemm.kernels.triton.matmul.{_RUNGS[variant].module}")
    if _RUNGS[variant].cuda_cores:
      return lambda a, b: kernel.matmul(a, b, problem, config, platform)
    return layout.tensor_core_layout(kernel.matmul, problem, config, platform)


registry.register(TritonMatmul())
