"""The `pallas` backend: a Hopper GEMM ladder in Pallas Mosaic GPU.

Kernels live in `jaxgemm.kernels.pallas`, one module per rung:

1. `basic`: one output tile per CTA, TMA -> swizzled SMEM -> wgmma, no overlap.
2. `pipelined`: a multi-stage TMA/wgmma pipeline (`plgpu.emit_pipeline`).
3. `warp_specialized`: persistent (one CTA per SM, L2-friendly tile order),
   a producer warpgroup feeding two consumer warpgroups, a tiled epilogue
   whose stores overlap the next tile's main loop.
4. `clusters`: rung 3 on 2-CTA clusters; the operand tile both CTAs share is
   TMA-multicast to both.
5. `stream_k`: rung 4 with the last tiles split along K between all
   clusters, so the last round of the persistent grid is not left part idle.
6. `pingpong`: rung 4 with the consumers on alternate whole tiles, so one's
   epilogue runs under the other's main loop.

On `cuda` the kernels compile through Mosaic GPU (sm_90a); on `cpu` the very
same kernels run in the Mosaic GPU interpreter (slow: small problems only).
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import pallas_call, registry
from jaxgemm.config import KernelConfig, check, int_range, is_power_of_two, power_of_two
from jaxgemm.gemm import SMEM_CAPACITY_BYTES, GemmProblem, mosaic_gpu_error, pow2_at_least

VARIANTS = ("basic", "pipelined", "warp_specialized", "clusters", "stream_k", "pingpong")
# Persistent variants: a producer and two consumer warpgroups.
_PERSISTENT = ("warp_specialized", "clusters", "stream_k", "pingpong")
# Variants whose CTA tile is split along M between the two consumers.
_TWO_CONSUMERS = ("warp_specialized", "clusters", "stream_k")
# Variants launched in 2-CTA clusters.
_CLUSTERED = ("clusters", "stream_k", "pingpong")
# float32 runs as TF32 (precision DEFAULT, jnp.matmul's default on GPU).
_IN_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
_OUT_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


@dataclasses.dataclass(frozen=True)
class PallasConfig(KernelConfig):
  """Tiling and scheduling of the Pallas Mosaic GPU kernels.

  tile_m, tile_n, tile_k: the CTA's output tile and K step. In the
    two-consumer rungs each consumer warpgroup owns tile_m / 2 rows.
  max_concurrent_steps: pipeline stages (SMEM buffers per operand); rung 1
    has one stage and ignores it.
  grid_minor_m, grid_group: the persistent rungs' tile order: bands of
    `grid_group` tiles along M (grid_minor_m) or N, walked in a snake.
  cluster_m, cluster_n: the cluster shape of rung 4 (one of them 2): CTAs of
    a cluster along M share B's tile, along N share A's, multicast by TMA.
  epi_tile_n: columns per epilogue store in the persistent rungs.
  split_rounds: how many of the persistent grid's last rounds rung 5 splits
    along K between all clusters: 1, the partial last round only, or 2, that
    and the round before (each cluster then takes more than a tile's K steps).
  """

  backend = "pallas"

  tile_m: int = power_of_two(64, 256, default=128)
  # 192 for the FP8 kernel (`scaled_matmul`'s pallas backend), whose promoted sum caps a
  # consumer's fp32 arrays short of 256 columns; the 16-bit kernels refuse it (`check`).
  tile_n: int = check(lambda v: (is_power_of_two(v) and 16 <= v <= 256) or v == 192,
                      "a power of two in [16, 256], or 192", default=128)
  tile_k: int = power_of_two(16, 128, default=64)
  max_concurrent_steps: int = int_range(1, 8, default=4)
  grid_minor_m: bool = check(lambda v: True, "a bool", default=False)
  grid_group: int = int_range(1, 64, default=8)
  cluster_m: int = int_range(1, 2, default=1)
  cluster_n: int = int_range(1, 2, default=1)
  epi_tile_n: int = power_of_two(16, 256, default=64)
  split_rounds: int = int_range(1, 2, default=1)


def smem_bytes(problem: GemmProblem, variant: str, config: PallasConfig) -> dict[str, int]:
  """Shared memory the variant allocates for `config`, by buffer."""
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  item = np.dtype(problem.dtype).itemsize
  out_item = np.dtype(problem.out_dtype).itemsize
  # The pipelined rungs run at least 2 stages (delay_release=1 needs them).
  stages = 1 if variant == "basic" else max(2, config.max_concurrent_steps)
  parts = {"a": stages * tm * tk * item, "b": stages * tk * tn * item}
  if variant in _PERSISTENT:
    # Two epilogue slots per consumer warpgroup, each (64, epi_tile_n).
    parts["out"] = 2 * 2 * 64 * min(config.epi_tile_n, tn) * out_item
  else:
    parts["out"] = tm * tn * out_item
  return parts


class PallasMatmul(registry.Backend):
  op = "matmul"
  name = "pallas"
  # Code that decides a tuned config's speed: a change to it stales the records.
  rung_package = "jaxgemm.kernels.pallas.matmul"
  kernel_modules = ("jaxgemm.kernels.pallas.common",)   # `impl`'s k_major_operands
  config_cls = PallasConfig
  variants = VARIANTS

  def check(self, problem: GemmProblem, variant: str, config: KernelConfig) -> None:
    registry.require_dtypes(problem, f"backend='pallas' variant={variant!r}", _IN_DTYPES)
    if problem.fp32_precision not in (None, "tf32"):
      raise NotImplementedError(
          f"backend='pallas' multiplies float32 on TF32 tensor cores (precision DEFAULT); "
          f"precision HIGH or HIGHEST asks for {problem.fp32_precision!r}: use "
          f"backend='triton' (variant 'tensorcore' runs 3-pass TF32, 'pipelined' exact fp32)")
    if np.dtype(problem.out_dtype) not in tuple(map(np.dtype, _OUT_DTYPES)):
      raise NotImplementedError(
          f"backend='pallas' writes bfloat16, float16 or float32 results; got "
          f"out_dtype={np.dtype(problem.out_dtype).name}")
    if np.dtype(problem.acc_dtype) != np.float32:
      raise NotImplementedError(
          f"backend='pallas' accumulates in float32; got "
          f"acc_dtype={np.dtype(problem.acc_dtype).name}")
    reason = mosaic_gpu_error()
    if reason is not None:
      raise NotImplementedError(f"backend='pallas' needs Mosaic GPU: {reason}")
    if jax.config.jax_enable_x64:
      # The kernels index in int32 with Python ints as lax.div/lax.rem operands,
      # which x64 makes int64 (TypeError), and a kernel traced with x64 off
      # inside an x64 program fails MLIR verification (seen on the CPU).
      raise NotImplementedError("backend='pallas' does not run with jax_enable_x64=True; "
                                "backend='triton' and 'xla' do")
    if variant not in VARIANTS:
      raise ValueError(f"unknown variant={variant!r} for backend='pallas'; "
                       f"valid variants: {list(VARIANTS)}")
    if not isinstance(config, PallasConfig):
      raise TypeError(f"backend='pallas' takes a PallasConfig, got {type(config).__name__}")
    tile_m, tile_n, epi_tile_n = config.tile_m, config.tile_n, config.epi_tile_n
    if not is_power_of_two(tile_n):
      raise ValueError(f"backend='pallas' variant={variant!r} takes a power-of-two tile_n; "
                       f"got {tile_n=} (192 is for scaled_matmul's FP8 kernel)")
    if variant in _TWO_CONSUMERS and tile_m < 128:
      raise ValueError(f"variant={variant!r} splits tile_m between two consumer "
                       f"warpgroups of >= 64 rows each: {tile_m=} must be >= 128")
    if variant in _PERSISTENT:
      if tile_n % epi_tile_n != 0 and epi_tile_n < tile_n:
        raise ValueError(f"{tile_n=} must be divisible by {epi_tile_n=}")
    if variant in _CLUSTERED:
      if config.cluster_m * config.cluster_n != 2:
        raise ValueError(f"variant={variant!r} runs 2-CTA clusters: exactly one of "
                         f"cluster_m={config.cluster_m}, cluster_n={config.cluster_n} "
                         f"must be 2")
    elif (config.cluster_m, config.cluster_n) != (1, 1):
      raise ValueError(f"variant={variant!r} does not use clusters; got "
                       f"cluster_m={config.cluster_m}, cluster_n={config.cluster_n}")
    if variant != "stream_k" and config.split_rounds != 1:
      raise ValueError(f"variant={variant!r} does not split tiles along K; got "
                       f"split_rounds={config.split_rounds} (only 'stream_k' takes it)")
    parts = smem_bytes(problem, variant, config)
    total = sum(parts.values())
    if total > SMEM_CAPACITY_BYTES:
      detail = " + ".join(f"{k}={v}" for k, v in parts.items())
      raise ValueError(
          f"backend='pallas' variant={variant!r} with tile_m={tile_m}, tile_n={tile_n}, "
          f"tile_k={config.tile_k}, max_concurrent_steps={config.max_concurrent_steps} "
          f"needs {total} bytes of shared memory ({detail}), more than the "
          f"{SMEM_CAPACITY_BYTES} bytes a Hopper CTA can have; lower tile_k, the "
          f"tiles or max_concurrent_steps")

  def default_config(self, problem: GemmProblem, variant: str) -> PallasConfig:
    """Tiles measured best on the H200 (jax 0.11.2), clamped to the problem.

    256x128x64 in 4 stages for the two-consumer rungs, 128x128x64 in 6 for
    `pingpong` (a consumer's accumulator holds a whole tile; 5 stages measured
    within 1%, and walking M-minor, cluster_m=2 or grid_group=16 slower:
    the ping-pong probe at 0834948, H200), 128x128x64 in 4
    otherwise; skinny problems (M <= 128) get 64-wide N tiles with 128-deep K steps,
    which keeps more SMs busy (128x8192x8192: pipelined 1.09x XLA vs 0.88x
    with the large-problem tiles; warp_specialized 1.08x vs 0.98x with
    128x128x64 in 6 stages; clusters 1.00x vs 0.92x). Clusters pair CTAs
    along N (measured >= cluster_m on all four shapes tried).
    """
    m, n = problem.m, problem.n
    skinny = m <= 128
    # K steps are sized in bytes: an fp32 (TF32) tile of half the depth fills
    # the same shared memory and the same 128-byte swizzle span as a 16-bit one.
    k_scale = np.dtype(problem.dtype).itemsize // 2
    if variant in _TWO_CONSUMERS:
      tile_m, tile_n, tile_k, stages = 256, 128, 64 // k_scale, 4
      if skinny:
        tile_n, tile_k = 64, 128 // k_scale
      if np.dtype(problem.out_dtype).itemsize == 4:
        stages -= 1   # f32 epilogue slots take a stage's room
      tile_m = pow2_at_least(m, 128, tile_m)
    elif variant == "pingpong":
      tile_m, tile_n, tile_k, stages = 128, 128, 64 // k_scale, 6
      if skinny:
        tile_n, tile_k = 64, 128 // k_scale
      tile_m = pow2_at_least(m, 64, tile_m)
    else:
      tile_m, tile_n, stages = 128, 128, 4
      tile_k = (128 if skinny else 64) // k_scale
      if skinny:
        tile_n = 64
      tile_m = pow2_at_least(m, 64, tile_m)
    # Never below one 128-byte swizzle span of 16-bit elements: the operands are
    # padded to it anyway, so a narrower tile only adds tiles. (The clamp came
    # from the GPU tier of 2026-11-22, where 16-wide N and 32-deep K tiles failed
    # Mosaic GPU's layout inference; the cause was each operand taking its own
    # swizzle, fixed by `common.operand_swizzle`, and such tiles now compile:
    # the 256x192-tile and swizzle probe at 0834948, H200.)
    span = 128 // np.dtype(problem.dtype).itemsize
    tile_n = pow2_at_least(n, span, tile_n)
    tile_k = pow2_at_least(problem.k, span, tile_k)
    cluster_m, cluster_n = 1, (2 if variant in _CLUSTERED else 1)
    config = PallasConfig(tile_m=tile_m, tile_n=tile_n, tile_k=tile_k,
                          max_concurrent_steps=stages, cluster_m=cluster_m,
                          cluster_n=cluster_n, epi_tile_n=min(64, tile_n))
    # Keep within shared memory for whatever out dtype (shrink the ring).
    while (sum(smem_bytes(problem, variant, config).values()) > SMEM_CAPACITY_BYTES
           and config.max_concurrent_steps > 2):
      config = dataclasses.replace(config, max_concurrent_steps=config.max_concurrent_steps - 1)
    return config

  def tuning_candidates(self, problem: GemmProblem) -> list[tuple[str, PallasConfig]]:
    """The top five rungs at their defaults, clusters walking tiles M-minor,
    and stream_k splitting the last two rounds.

    Which walk keeps more of A and B in L2 depends on the shape (the snake
    runs along N by default), and which split pays too (H200: splitting only
    the last round won on 8192^3, two rounds on 8192x4096x28672: the stream-K tail probe at 0834948,
    H200); the autotuner
    measures them.
    """
    out = [(v, self.default_config(problem, v))
           for v in ("stream_k", "clusters", "warp_specialized", "pipelined", "pingpong")]
    out.append(("clusters", dataclasses.replace(out[1][1], grid_minor_m=True)))
    out.append(("stream_k", dataclasses.replace(out[0][1], split_rounds=2)))
    return out

  def impl(self, problem: GemmProblem, variant: str, config: KernelConfig, platform: str):
    if platform not in ("cuda", "cpu"):
      raise NotImplementedError(f"backend='pallas' runs on cuda (or the cpu "
                                f"interpreter), not {platform!r}")
    module = importlib.import_module(f"jaxgemm.kernels.pallas.matmul.{variant}")
    kernel_fn = getattr(module, variant)
    interpret = platform == "cpu"

    def pallas_matmul(a, b):
      from jaxgemm.kernels.pallas import common  # noqa: PLC0415 (needs Mosaic GPU)
      a, b, laid_out = common.k_major_operands(a, b, problem)
      return kernel_fn(a, b, laid_out, config, interpret=interpret)

    if not interpret:
      return pallas_matmul
    return pallas_call.interpreted(
        pallas_matmul, jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype))


registry.register(PallasMatmul())
