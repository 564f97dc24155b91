"""The `pallas` backend of scaled_matmul: FP8 GEMMs with scales in Pallas Mosaic GPU.

The kernel (`jaxgemm.kernels.pallas.scaled_matmul.scaled`, variant
`warp_specialized`) is the matmul ladder's persistent warp-specialized
structure with 128-deep K steps, each one scale block, whose wgmma products
are promoted to an fp32 register sum with their scales every step (Hopper's
FP8 wgmma accumulates with ~14 bits; see the kernel's docstring). Block scales
apply per K step, per-tensor and per-row/column scales once to the fp32 sum;
C is rounded once to out_dtype.

Layouts. Hopper's FP8 wgmma reads both operands K-major only: A stored
(M, K) and B stored (N, K), i.e. trans_a=False, trans_b=True, which run as
they are. Any other layout is relaid by a transpose before the kernel (Triton's
fp8 transpose on the GPU, 1.3-1.5x XLA's; `k_major_operands`): trans_a=True
transposes A (one read and one write of M x K bytes), and trans_b=False, the
plain `x @ w` with w stored (K, N), transposes B (K x N bytes each way) on every
call. Against the GEMM's 2 M N K flops that is small for large M, but for a
weight reused across calls, store it (N, K) and pass trans_b=True
(`jaxgemm.matmul(..., fp8=...)`'s dgrad already does).

Mixed fp8 pairs (e4m3 x e5m2). jax 0.10.2's Mosaic GPU refuses wgmma operands
of different dtypes ("Mixed input dtypes for matrix multiplication
unsupported"), though PTX has e4m3 x e5m2 wgmma (later jax added it: Mosaic
GPU commit e473541979). So a mixed pair is cast to float16 by the same XLA
pre-pass (both fp8 formats are exact in float16: e5m2 is float16's top byte,
e4m3's range and subnormals lie inside float16's), and the same kernel runs
16-bit wgmma: the same result, at half the FP8 rate and with 2-byte operands
in SMEM (fewer stages). Not measured.

Variants. `warp_specialized` reads block scales from GMEM in the K loop;
`warp_specialized_tma_scales` (block scales only, their default) has the
producer TMA-load each K step's a_scale column (tile_m floats) and b_scale
value into the ring slot beside the operand blocks, the consumers reading
them from SMEM while the step's wgmma runs, and at 128x128 K steps in pairs
whose second wgmma is issued before the first is promoted
(`scaled.OVERLAP_PROMOTION`). On the H200 it ran 1047 and 1040 TFLOP/s at
8192^3 and 8192x4096x14336 where `warp_specialized` ran 667 and 735
(the FP8 step probe's run2 at b5b0db4, H200, probe.py). Its ring slots carry
640 bytes more at 128x128 (in two buffers aligned to 1 KiB): 5 stages with a
bf16 epilogue instead of 6. It takes 128x192 tiles too (`default_config`):
1322 / 1306 / 1115 TFLOP/s at 8192^3 / 8192x4096x14336 / 4096^3 on an H100,
B stored (N, K) (the fp8-block-wide probe's run6 at 2aaf16b).

`backend="auto"` takes this kernel with no tuning record where it was measured
to win (`structural_win`); elsewhere XLA's program.
On `cpu` the same kernel runs in the Mosaic GPU interpreter, which handles
fp8 SMEM, TMA and wgmma (numpy's matmul of ml_dtypes' fp8 types, in fp32).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import pallas_call, registry
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import (BLOCK, FP8_DTYPES, SMEM_CAPACITY_BYTES, GemmProblem, dtype_names,
                          mosaic_gpu_error, pow2_at_least)
from jaxgemm.ops.matmul.pallas import PallasConfig
from jaxgemm.ops.scaled_matmul import xla as scaled_xla
from jaxgemm.ops.scaled_matmul.problem import (OUT_DTYPES, SCALE_KINDS, ScaledMatmulProblem,
                                               kernel_win)

VARIANTS = ("warp_specialized", "warp_specialized_tma_scales")
DEFAULT_VARIANT = "warp_specialized"   # per-tensor and per-row/column scales
# The scales through the TMA ring: block scales only, and their default (module docstring).
TMA_SCALES = "warp_specialized_tma_scales"
_B_SCALE_BOX = 32      # scaled.B_SCALE_BOX: the b_scale floats a ring slot holds
_SMEM_ALIGNMENT = 1024  # Mosaic GPU's alignment of each shared memory buffer
# Both fp32 arrays of a consumer warpgroup (the step's wgmma accumulator and the
# promoted sum), (tile_m / 2) x tile_n each: at most 192 registers per thread (128x192).
_MAX_ACC_ELEMENTS = 2 * 64 * 192
# A 128x192 tile's time over a 128x128 tile's: 1.5x the work at 1.12x the rate per tensor
# (H100, B stored (N, K), 8192^3 and 8192x4096x14336: the fp8-clusters probe's run1 at ac46a30) and
# 1.15x with block scales (1.163x and 1.149x, no clusters:
# the fp8-block-wide probe's run1 at d1fefc7).
_WIDE_TILE_COST = {"tensor": 1.5 / 1.12, "row_col": 1.5 / 1.12, "block": 1.5 / 1.15}
_HOPPER_SMS = 132   # H100 SXM and H200: the persistent grid's workers
# Block scales on 128x128 tiles take 2-CTA clusters along N from this many tiles: 1.04-1.06x at
# 8192^3 and 8192x4096x14336 (4096 and 7168 tiles), 0.98x at 4096^3 (1024)
# (the fp8-clusters probe's run1 at ac46a30).
_CLUSTER_MIN_TILES = 2048
# On 128x192 tiles they take clusters along M (B's 24 KiB tile multicast): 1.06x, 1.06x and
# 1.03x over none at 8192^3, 8192x4096x14336 and 4096^3 (2752, 4800 and 704 tiles), ahead of
# clusters along N (1.01x, 1.05x, 1.03x)
# (the fp8-block-wide probe's run1 at d1fefc7). Fewer tiles: not measured.
_WIDE_CLUSTER_MIN_TILES = 512
_MAX_STAGES = 8        # PallasConfig.max_concurrent_steps' range
_EPI_TILE_M = 64
# What a mixed e4m3 x e5m2 pair runs as (exact for both; module docstring).
MIXED_DTYPE = np.dtype(np.float16)


def kernel_dtype(problem: ScaledMatmulProblem) -> np.dtype:
  """The dtype the kernel's wgmma reads: the fp8 dtype, or float16 for a mixed pair."""
  if np.dtype(problem.dtype) == np.dtype(problem.b_dtype):
    return np.dtype(problem.dtype)
  return MIXED_DTYPE


def kernel_problem(problem: ScaledMatmulProblem) -> GemmProblem:
  """The GEMM the kernel runs: K-major operands (trans_a=False, trans_b=True) in
  `kernel_dtype`."""
  return dataclasses.replace(problem.as_gemm(), dtype=kernel_dtype(problem), trans_a=False,
                             trans_b=True)


def k_major_operands(problem: ScaledMatmulProblem, a, b, platform: str = "cpu"):
  """The pre-pass: A (batch, M, K) and B (batch, N, K) in `kernel_dtype` (a transpose
  of an operand stored the other way, a cast of a mixed pair; one pass per operand,
  nothing for the K-major layout of one fp8 dtype). An fp8 transpose without a cast
  runs Triton's kernel on the GPU (`_transposed`), an XLA fusion otherwise."""
  dtype = kernel_dtype(problem)
  if problem.trans_a:
    a = _transposed(a, dtype, platform)
  if not problem.trans_b:
    b = _transposed(b, dtype, platform)
  return a.astype(dtype), b.astype(dtype)


def _transposed(x, dtype, platform: str):
  """x (batch, R, C) as (batch, C, R). On the GPU, an fp8 array the kernel reads as it
  is goes through `kernels.triton.scaled_matmul.transpose` (1.3-1.5x XLA's transpose on
  an H200, the fp8-inplace-f16 probe's run1 at 01180b5) where Triton and jax-triton are
  installed; a mixed pair's cast stays fused with XLA's transpose (one pass)."""
  if (platform == "cuda" and np.dtype(x.dtype) == dtype and dtype.itemsize == 1
      and _triton_runs_on_gpu()):
    from jaxgemm.kernels.triton.scaled_matmul import transpose  # noqa: PLC0415
    return transpose.transpose(x, platform)
  return jnp.swapaxes(x, 1, 2)


@functools.cache
def _triton_runs_on_gpu() -> bool:
  """Whether Triton kernels can launch on the GPU here (jax-triton refuses to import
  on a jaxlib without GPU support, as when lowering for cuda on a CPU machine)."""
  try:
    import jax_triton  # noqa: F401, PLC0415
    import triton  # noqa: F401, PLC0415
  except ImportError:
    return False
  return True


def smem_bytes(problem: ScaledMatmulProblem, config: PallasConfig,
               variant: str = DEFAULT_VARIANT) -> dict[str, int]:
  """Shared memory the kernel allocates for `config`, by buffer."""
  item = kernel_dtype(problem).itemsize
  stages = max(2, config.max_concurrent_steps)
  parts = {"a": stages * config.tile_m * BLOCK * item,
           "b": stages * config.tile_n * BLOCK * item,
           # two epilogue slots per consumer warpgroup, each (64, epi_tile_n)
           "out": 2 * 2 * _EPI_TILE_M * min(config.epi_tile_n, config.tile_n)
                  * np.dtype(problem.out_dtype).itemsize}
  if variant == TMA_SCALES:
    # fp32 a_scale column and b_scale box per ring slot, two buffers, each aligned
    # to 1024 bytes by Mosaic GPU, and the ring's barriers (8 bytes each), which
    # the other variant's slack covers (Mosaic GPU counted 232496 bytes for the
    # mixed pair's 3 stages before these were).
    parts["scales"] = (_align(stages * config.tile_m * 4, _SMEM_ALIGNMENT)
                       + _align(stages * _b_scale_box(config.tile_n) * 4, _SMEM_ALIGNMENT))
    parts["barriers"] = 2 * stages * 8
  return parts


def _b_scale_box(tile_n: int) -> int:
  """scaled.b_scale_box: 32 floats for a tile in one column block, else the tile's vector."""
  return _B_SCALE_BOX if BLOCK % tile_n == 0 else _align(tile_n, _B_SCALE_BOX)


def _align(x: int, alignment: int) -> int:
  return -(-x // alignment) * alignment


def fit_stages(problem: ScaledMatmulProblem, config: PallasConfig,
               variant: str = DEFAULT_VARIANT) -> PallasConfig:
  """`config` with the deepest ring (at most 8 stages, at least 2) that fits shared memory."""
  config = dataclasses.replace(config, max_concurrent_steps=_MAX_STAGES)
  while (sum(smem_bytes(problem, config, variant).values())
         > SMEM_CAPACITY_BYTES and config.max_concurrent_steps > 2):
    config = dataclasses.replace(config, max_concurrent_steps=config.max_concurrent_steps - 1)
  return config


def _block_clusters(problem: ScaledMatmulProblem, config: PallasConfig) -> PallasConfig:
  """`config` with block scales' measured 2-CTA clusters for its tile width (along N for
  128-wide tiles from `_CLUSTER_MIN_TILES` tiles, along M for 192-wide ones from
  `_WIDE_CLUSTER_MIN_TILES`); other scales run without (per tensor they measured
  0.94-1.01x, the fp8-clusters probe's run1 at ac46a30)."""
  if problem.scale_kind != "block":
    return config
  tiles = (problem.batch * math.ceil(problem.m / config.tile_m)
           * math.ceil(problem.n / config.tile_n))
  wide = config.tile_n == 192
  if tiles >= (_WIDE_CLUSTER_MIN_TILES if wide else _CLUSTER_MIN_TILES):
    return _clustered(config)
  return config


def _clustered(config: PallasConfig) -> PallasConfig:
  """`config` on block scales' 2-CTA clusters for its tile width: along M for 192-wide
  tiles, along N otherwise (`_block_clusters`)."""
  if config.tile_n == 192:
    return dataclasses.replace(config, cluster_m=2, cluster_n=1)
  return dataclasses.replace(config, cluster_m=1, cluster_n=2)


class PallasScaledMatmul(registry.Backend):
  op = "scaled_matmul"
  name = "pallas"
  # This module lays the operands out (its fp8 transpose is a Triton kernel).
  kernel_modules = ("jaxgemm.kernels.pallas.scaled_matmul.scaled",
                    "jaxgemm.ops.scaled_matmul.pallas", "jaxgemm.triton_call")
  config_cls = PallasConfig
  variants = VARIANTS

  def default_variant(self, problem: ScaledMatmulProblem) -> str:
    """TMA_SCALES for block scales (1.4-1.6x `warp_specialized` on the H200, module
    docstring), `warp_specialized` otherwise."""
    return TMA_SCALES if problem.scale_kind == "block" else DEFAULT_VARIANT

  def structural_win(self, problem: ScaledMatmulProblem, device_kind: str) -> str | None:
    """Where `scaled_matmul.problem.kernel_win` (the measurement) names this backend."""
    win = kernel_win(problem, device_kind)
    return win[1] if win and win[0] == "pallas" else None

  def check(self, problem: ScaledMatmulProblem, variant: str, config: KernelConfig) -> None:
    what = "backend='pallas' scaled_matmul"
    for name, dtype in (("a", problem.dtype), ("b", problem.b_dtype)):
      if np.dtype(dtype) not in FP8_DTYPES:
        raise NotImplementedError(f"{what} takes fp8 operands {dtype_names(FP8_DTYPES)}; got "
                                  f"{name}.dtype={np.dtype(dtype).name}")
    if np.dtype(problem.out_dtype) not in OUT_DTYPES:
      raise NotImplementedError(f"{what} writes {dtype_names(OUT_DTYPES)}; got "
                                f"out_dtype={np.dtype(problem.out_dtype).name}")
    if problem.scale_kind not in SCALE_KINDS:
      raise NotImplementedError(f"{what} takes scale_kind in {SCALE_KINDS}; got "
                                f"scale_kind={problem.scale_kind!r}")
    reason = mosaic_gpu_error()
    if reason is not None:
      raise NotImplementedError(f"{what} needs Mosaic GPU: {reason}")
    if jax.config.jax_enable_x64:
      raise NotImplementedError(f"{what} does not run with jax_enable_x64=True (the kernel "
                                f"indexes in int32); backend='xla' does")
    if variant not in VARIANTS:
      raise ValueError(f"unknown variant={variant!r} for {what}; valid variants: "
                       f"{list(VARIANTS)}")
    if variant == TMA_SCALES and problem.scale_kind != "block":
      raise NotImplementedError(
          f"{what} variant={variant!r} takes block scales only (it copies each K step's "
          f"block scales through the TMA ring); got scale_kind={problem.scale_kind!r}: "
          f"use variant={DEFAULT_VARIANT!r}")
    if not isinstance(config, PallasConfig):
      raise TypeError(f"{what} takes a PallasConfig; got {type(config).__name__}")
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    epi_tile_n = config.epi_tile_n
    if tile_k != BLOCK:
      raise ValueError(f"{what}: {tile_k=} must be {BLOCK}: each K step is one 128-wide "
                       f"scale block, where the fp8 partial sums are promoted to fp32")
    if tile_m < 128:
      raise ValueError(f"{what} splits tile_m between two consumer warpgroups of >= 64 "
                       f"rows each: {tile_m=} must be 128 or 256")
    if tile_m // 2 * tile_n * 2 > _MAX_ACC_ELEMENTS:
      raise ValueError(
          f"{what} keeps two fp32 arrays of (tile_m / 2) x tile_n per consumer warpgroup "
          f"(the K step's wgmma accumulator and the promoted sum): {tile_m=}, {tile_n=} need "
          f"more than 192 registers per thread; use tile_m * tile_n <= 24576 (128x192, "
          f"128x128, 256x64, 128x64)")
    if problem.scale_kind == "block" and BLOCK % tile_n:
      # A tile across two column blocks: registers for its per-step scales beside the
      # two arrays only where they come from SMEM, one value per 64-column run.
      if variant != TMA_SCALES:
        raise ValueError(
            f"{what} variant={variant!r} with block scales takes tile_n dividing {BLOCK} "
            f"(its per-column scale product takes a third array of registers); got "
            f"{tile_n=}: use variant={TMA_SCALES!r}")
      run = math.gcd(tile_n, BLOCK)
      if run % min(epi_tile_n, tile_n):
        raise ValueError(
            f"{what} with block scales stores a {tile_n=} tile by {run}-column runs of one "
            f"scale: {epi_tile_n=} must divide {run}")
    if epi_tile_n < tile_n and tile_n % epi_tile_n:
      raise ValueError(f"{what}: {tile_n=} must be divisible by {epi_tile_n=}")
    if config.cluster_m * config.cluster_n > 2:
      raise ValueError(f"{what} runs 1- or 2-CTA clusters: at most one of cluster_m="
                       f"{config.cluster_m}, cluster_n={config.cluster_n} may be 2")
    if config.split_rounds != 1:
      raise ValueError(f"{what} does not split tiles along K: split_rounds="
                       f"{config.split_rounds} must be 1")
    parts = smem_bytes(problem, config, variant)
    total = sum(parts.values())
    if total > SMEM_CAPACITY_BYTES:
      detail = " + ".join(f"{k}={v}" for k, v in parts.items())
      raise ValueError(
          f"{what} with {tile_m=}, {tile_n=}, max_concurrent_steps="
          f"{config.max_concurrent_steps} ({kernel_dtype(problem).name} operands in SMEM) "
          f"needs {total} bytes of shared memory ({detail}), more than the "
          f"{SMEM_CAPACITY_BYTES} bytes a Hopper CTA can have; lower "
          f"max_concurrent_steps or the tiles")

  def default_config(self, problem: ScaledMatmulProblem, variant: str) -> PallasConfig:
    """128x128 or 128x192 tiles, 128-deep K steps, as many stages as fit 227 KiB (max 8).

    128x192 where it takes less time by a count of persistent rounds: ceil(tiles /
    132) rounds, a 128x192 tile costing 1.34x a 128x128 one per tensor and 1.30x
    with block scales (measured: `_WIDE_TILE_COST`). Per tensor that picks 128x192
    at 8192^3 (1431 against 1278 TFLOP/s on an H100, B stored (N, K)) and 128x128
    at 4096^3 (1238 against 1227), the fp8-clusters probe's run1 at ac46a30. Block scales
    (the TMA-scales variant; the GMEM one keeps 128) take it at all three issue
    shapes, with 2-CTA clusters along M (`_block_clusters`): 1275 / 1265 / 1087
    TFLOP/s at 8192^3 / 8192x4096x14336 / 4096^3 against 1035-1043 / 1041 / 1028
    on 128x128 without clusters (the fp8-block-wide probe's run1 at d1fefc7, H100; 1322 /
    1306 / 1115 once the scales were read under the wgmma, run6).

    A consumer's two fp32 arrays cap the tile at 24576 elements; 128x192 loads
    the fewest operand bytes per output among those, 128x128 17% more and 256x64
    25% more than 128x128. M <= 128 gets 64-wide N tiles (twice the CTAs for a skinny
    problem, as the matmul's heuristic does for 16-bit). fp8 128x128: 32 KiB a stage, so 6
    stages with a bf16 or fp32 epilogue; a mixed pair's float16 operands: 64
    KiB a stage, 3 stages. On the H100 the fp8 default ran 1210 TFLOP/s at 8192^3
    (docs/results-fp8.md); the M-minor walk was not faster (1226 vs 1223 per tensor, 629
    vs 728 with block scales at 8192x4096x14336), the 256x64 tile not measured
    (the FP8 kernel probe's run 2 at eeb0d94, H100).
    """
    skinny = problem.m <= 128
    tile_m = 128
    tile_n = pow2_at_least(problem.n, 64, 64 if skinny else 128)
    tiles = lambda tn: problem.batch * math.ceil(problem.m / tile_m) * math.ceil(problem.n / tn)
    rounds = lambda tn: math.ceil(tiles(tn) / _HOPPER_SMS)
    wide_ok = problem.scale_kind != "block" or variant == TMA_SCALES
    if (tile_n == 128 and wide_ok and kernel_dtype(problem).itemsize == 1
        and rounds(192) * _WIDE_TILE_COST[problem.scale_kind] < rounds(128)):
      tile_n = 192
    config = PallasConfig(tile_m=tile_m, tile_n=tile_n, tile_k=BLOCK, epi_tile_n=min(64, tile_n))
    return fit_stages(problem, _block_clusters(problem, config), variant)

  def tuning_candidates(self, problem: ScaledMatmulProblem) -> list[tuple[str, PallasConfig]]:
    """The default variant's default config, 256x64 tiles, and the tile walk along M;
    the other of 128x128 and 128x192 (fp8, M > 128; with block scales, with that
    width's clusters); with block scales, the default with its clusters toggled and
    `warp_specialized`'s default."""
    variant = self.default_variant(problem)
    default = self.default_config(problem, variant)
    tall = fit_stages(problem, dataclasses.replace(default, tile_m=256, tile_n=64, epi_tile_n=64,
                                                   cluster_m=1, cluster_n=1), variant)
    candidates = [(variant, default), (variant, tall),
                  (variant, dataclasses.replace(default, grid_minor_m=True))]
    if default.tile_n in (128, 192) and kernel_dtype(problem).itemsize == 1:
      other = dataclasses.replace(default, tile_n=192 if default.tile_n == 128 else 128,
                                  cluster_m=1, cluster_n=1)
      candidates.append((variant, fit_stages(problem, _block_clusters(problem, other), variant)))
    if problem.scale_kind == "block":   # clusters toggled
      clustered = default.cluster_m * default.cluster_n > 1
      candidates.append((variant, dataclasses.replace(default, cluster_m=1, cluster_n=1)
                         if clustered else _clustered(default)))
    if variant != DEFAULT_VARIANT:
      candidates.append((DEFAULT_VARIANT, self.default_config(problem, DEFAULT_VARIANT)))
    return candidates

  def impl(self, problem: ScaledMatmulProblem, variant: str, config: KernelConfig,
           platform: str):
    if platform not in ("cuda", "cpu"):
      raise NotImplementedError(f"backend='pallas' runs on cuda (or the cpu interpreter), "
                                f"not {platform!r}")
    interpret = platform == "cpu"
    empty = 0 in (problem.batch, problem.m, problem.n, problem.k)
    laid_out = kernel_problem(problem)

    def pallas_scaled_matmul(a, b, a_scale, b_scale):
      if empty:   # nothing to launch: zeros (K = 0) or an empty result
        return scaled_xla.scaled_product(problem, a, b, a_scale, b_scale)
      from jaxgemm.kernels.pallas.scaled_matmul import scaled  # noqa: PLC0415 (Mosaic GPU)
      a, b = k_major_operands(problem, a, b, platform)
      a_scale, b_scale = a_scale.astype(jnp.float32), b_scale.astype(jnp.float32)
      return scaled.scaled(a, b, a_scale, b_scale, laid_out, config,
                           scale_kind=problem.scale_kind, interpret=interpret,
                           tma_scales=variant == TMA_SCALES)

    if not interpret or empty:
      return pallas_scaled_matmul
    return pallas_call.interpreted(
        pallas_scaled_matmul, jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype))


registry.register(PallasScaledMatmul())
