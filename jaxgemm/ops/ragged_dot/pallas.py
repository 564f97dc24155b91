"""The `pallas` backend of `ragged_dot`: grouped GEMMs in Pallas Mosaic GPU.

Kernels live in `jaxgemm.kernels.pallas.ragged_dot`, two rungs:

1. `pipelined` (`grouped.py`): persistent, one warpgroup, a
   `plgpu.emit_pipeline` over K per (row tile, N tile); row tiles aligned to
   tile_m, a tile cut by a group boundary run once per group
   (`schedule.row_tiles`). Ragged-M only. Measured on the GPU (H100).
2. `grouped`: persistent, a producer warpgroup feeding two consumer
   warpgroups through one SMEM ring across all of a CTA's tiles. Ragged-M
   (`grouped.py`): row tiles start at each group's first row, so a group wastes
   at most one partial tile. Lowered for sm_90a on the CPU and run in the
   interpreter; not yet run on a GPU.

The ragged-K form (the weight gradient, `ragged_k.py`) has one kernel, which
either rung runs (a gradient carries the forward's variant): `grouped`'s
structure, out (K, N) tiles contracted over each group's row chunks, the
chunks at a group's edges masked in SMEM. Not yet run on a GPU either.

Ragged-M takes both rhs layouts (forward rhs (G, K, N); data gradient rhs
(G, N, K), `trans_rhs`); 16-bit operands, or float32 as TF32 (TF32 wgmma reads
K-major operands only: XLA transposes rhs (G, K, N) once, and both operands
of the ragged-K form); results in bf16, fp16 or fp32. Tiles
are mapped to groups on the device from the group bounds (small int32 tables
made by XLA right before the launch, or read in-kernel); ragged rows are
stored by a ladder of TMA stores, so tokens are never padded.

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
from jaxgemm.config import KernelConfig, check, int_range, power_of_two
from jaxgemm.gemm import SMEM_CAPACITY_BYTES, mosaic_gpu_error, pow2_at_least
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem

VARIANTS = ("pipelined", "grouped")
_EPI_TILE_M = 64                    # rows of a `grouped` epilogue piece
# float32 runs as TF32 (precision DEFAULT), ragged-M only: TF32 wgmma reads both
# operands K-major, so rhs (G, K, N) is transposed once by XLA; ragged-K would need
# both operands transposed.
_IN_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
_OUT_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
# The smallest problem `structural_win` claims (the same bound as Triton's): the
# measured weight gradients had 94.5 and 1926 GFLOP.
_WIN_MIN_FLOPS = 2**36
# Rows from which `grouped` leads `pipelined` (see `default_variant`).
GROUPED_MIN_ROWS = 1024
_KERNEL_MODULE = "jaxgemm.kernels.pallas.ragged_dot.grouped"
_RAGGED_K_MODULE = "jaxgemm.kernels.pallas.ragged_dot.ragged_k"


@dataclasses.dataclass(frozen=True)
class RaggedDotPallasConfig(KernelConfig):
  """Tiling and scheduling of the Pallas grouped GEMM kernels.

  tile_m, tile_n, tile_k: the CTA's output tile and K step. `grouped` splits
    tile_m between its two consumer warpgroups (128 or 256); `pipelined` also
    takes 192 (one warpgroup's wgmma of 192 rows).
  max_concurrent_steps: pipeline stages (SMEM buffers per operand).
  grid_group: the tile walk: bands of `grid_group` N tiles, each walked along
    the row tiles (of all groups, in order) in a snake.
  epi_tile_n: columns per epilogue piece of `grouped`.
  group_aligned: ragged-M row tiles start at each group's first row (rounded
    down to 8), so a group wastes at most one partial tile; otherwise they are
    tile_m-aligned and a tile cut by a group boundary runs once per group
    (`schedule.row_tiles`). Both rungs take both; `grouped` defaults to it.
  """

  backend = "pallas"

  tile_m: int = check(lambda v: v in (64, 128, 192, 256), "one of 64, 128, 192, 256",
                      default=128)
  tile_n: int = power_of_two(64, 256, default=128)
  tile_k: int = power_of_two(32, 128, default=64)
  max_concurrent_steps: int = int_range(2, 8, default=4)
  grid_group: int = int_range(1, 64, default=8)
  epi_tile_n: int = power_of_two(64, 256, default=64)
  group_aligned: bool = check(lambda v: True, "a bool", default=False)


def smem_bytes(problem: RaggedDotProblem, variant: str,
               config: RaggedDotPallasConfig) -> dict[str, int]:
  """Shared memory the variant allocates for `config`, by buffer."""
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  item = np.dtype(problem.dtype).itemsize
  out_item = np.dtype(problem.out_dtype).itemsize
  stages = config.max_concurrent_steps
  parts = {"lhs": stages * tm * tk * item, "rhs": stages * tk * tn * item}
  if variant == "grouped" or problem.ragged_contracting:
    # Two staging slots per consumer warpgroup, each (64, epi_tile_n).
    parts["out"] = 2 * 2 * _EPI_TILE_M * min(config.epi_tile_n, tn) * out_item
  else:
    parts["out"] = tm * tn * out_item
  return parts


def _fit(problem, variant, config: RaggedDotPallasConfig) -> RaggedDotPallasConfig:
  """`config` with its ring shrunk (to 2 stages at least) until it fits shared memory."""
  while (sum(smem_bytes(problem, variant, config).values()) > SMEM_CAPACITY_BYTES
         and config.max_concurrent_steps > 2):
    config = dataclasses.replace(config, max_concurrent_steps=config.max_concurrent_steps - 1)
  return config


class PallasRaggedDot(registry.Backend):
  op = "ragged_dot"
  name = "pallas"
  # Both rungs: ragged-M runs grouped.py (its `variant` switch), ragged-K ragged_k.py.
  kernel_modules = ("jaxgemm.kernels.pallas.ragged_dot.grouped",
                    "jaxgemm.kernels.pallas.ragged_dot.ragged_k",
                    "jaxgemm.kernels.pallas.common", "jaxgemm.ragged_schedule")
  config_cls = RaggedDotPallasConfig
  variants = VARIANTS

  def default_variant(self, problem: RaggedDotProblem) -> str:
    """`grouped` (two consumer warpgroups) where rows are many, `pipelined` for decode.

    H200, the moe suite at ca37e37 (bf16, TFLOP/s, pipelined / grouped):
    G=8 M=16384 678 / 707, G=64 M=16384 390 / 451, G=128 M=8192 202 / 239,
    but G=8 M=128 (decode) 63.4 / 40.9; the weight gradient 745 / 746.
    """
    if problem.ragged_contracting or problem.m >= GROUPED_MIN_ROWS:
      return "grouped"
    return "pipelined"

  def structural_win(self, problem: RaggedDotProblem, device_kind: str) -> str | None:
    """The weight gradient (ragged-K) of 16-bit MoE layers on Hopper.

    XLA's ragged_dot_general ran it at 91.5 and 8.9 TFLOP/s, this backend at
    746 and 361 (8.2x, 40.6x), and Triton's at 660 and 319: so `auto` takes this
    backend for ragged-K and Triton's for ragged-M, where Triton led
    (the moe suite at ca37e37, H200).
    """
    if not any(kind in device_kind for kind in ("H100", "H200")):
      return None
    if not problem.ragged_contracting or problem.flops < _WIN_MIN_FLOPS:
      return None
    if np.dtype(problem.dtype) not in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)):
      return None
    return (f"grouped weight gradient of {problem.flops / 1e9:.0f} GFLOP: XLA's "
            f"ragged_dot_general ran 8-41x slower on the MoE shapes measured")

  def check(self, problem: RaggedDotProblem, variant: str, config: KernelConfig) -> None:
    what = f"backend='pallas' variant={variant!r} of ragged_dot"
    if variant not in VARIANTS:
      raise ValueError(f"unknown variant={variant!r} for backend='pallas' of ragged_dot; "
                       f"valid variants: {list(VARIANTS)}")
    registry.require_dtypes(problem, what, _IN_DTYPES)
    if problem.fp32_precision not in (None, "tf32"):
      raise NotImplementedError(
          f"{what} multiplies float32 on TF32 tensor cores (precision DEFAULT); precision "
          f"HIGH or HIGHEST asks for {problem.fp32_precision!r}: use backend='triton' or 'xla'")
    if np.dtype(problem.out_dtype) not in tuple(map(np.dtype, _OUT_DTYPES)):
      raise NotImplementedError(
          f"{what} writes bfloat16, float16 or float32 results; got "
          f"out_dtype={np.dtype(problem.out_dtype).name}")
    if np.dtype(problem.acc_dtype) != np.float32:
      raise NotImplementedError(f"{what} accumulates in float32; got "
                                f"acc_dtype={np.dtype(problem.acc_dtype).name}")
    reason = mosaic_gpu_error()
    if reason is not None:
      raise NotImplementedError(f"backend='pallas' needs Mosaic GPU: {reason}")
    if jax.config.jax_enable_x64:
      raise NotImplementedError("backend='pallas' does not run with jax_enable_x64=True; "
                                "backend='xla' does")
    if not isinstance(config, RaggedDotPallasConfig):
      raise TypeError(f"backend='pallas' of ragged_dot takes a RaggedDotPallasConfig, got "
                      f"{type(config).__name__}")
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    span = 128 // np.dtype(problem.dtype).itemsize
    if tk < span:
      raise ValueError(f"{what}: tile_k={tk} must be >= {span} for "
                       f"{np.dtype(problem.dtype).name} operands (one 128-byte swizzle span)")
    if variant == "grouped" or problem.ragged_contracting:
      if tm == 192:
        raise ValueError(f"{what} splits tile_m between two consumer warpgroups "
                         f"in 64-row pieces: tile_m={tm} must be 128 or 256")
      if tm < 128:
        raise ValueError(f"{what} splits tile_m between two consumer warpgroups "
                         f"of >= 64 rows each: tile_m={tm} must be >= 128")
      if tn % config.epi_tile_n and config.epi_tile_n < tn:
        raise ValueError(f"tile_n={tn} must be divisible by epi_tile_n={config.epi_tile_n}")
    parts = smem_bytes(problem, variant, config)
    total = sum(parts.values())
    if total > SMEM_CAPACITY_BYTES:
      detail = " + ".join(f"{k}={v}" for k, v in parts.items())
      raise ValueError(
          f"{what} with tile_m={tm}, tile_n={tn}, tile_k={tk}, "
          f"max_concurrent_steps={config.max_concurrent_steps} needs {total} bytes of "
          f"shared memory ({detail}), more than the {SMEM_CAPACITY_BYTES} bytes a Hopper "
          f"CTA can have; lower tile_k, the tiles or max_concurrent_steps")

  def default_config(self, problem: RaggedDotProblem, variant: str) -> RaggedDotPallasConfig:
    """128x128x64 (pipelined) or 256x128x64 in 4 stages (grouped), clamped to small problems.

    Rows are not clamped below 128 for `grouped` (two 64-row consumers).
    Tiny problems (the CPU interpreter) get the smallest tiles.
    """
    m, n, k = problem.m, problem.n, problem.k
    if problem.ragged_contracting:   # one kernel whichever rung: out (K, N) tiles
      m, k, variant = k, m, "grouped"
    # K steps in bytes: a float32 (TF32) step of half the depth fills the same span.
    tk_min = 128 // np.dtype(problem.dtype).itemsize
    if variant == "grouped":
      tm, tn, tk, stages = 256, 128, tk_min, 4
      # Small groups: each group wastes up to a tile of rows; keep tiles short.
      if m // max(problem.groups, 1) < 512 and not problem.ragged_contracting:
        tm = 128
      tm = pow2_at_least(m, 128, tm)
    else:
      tm, tn, tk, stages = 128, 128, tk_min, 4
      tm = pow2_at_least(m, 64, tm)
    tn = pow2_at_least(n, 64, tn)
    tk = pow2_at_least(k, tk_min, tk)
    return _fit(problem, variant, RaggedDotPallasConfig(
        tile_m=tm, tile_n=tn, tile_k=tk, max_concurrent_steps=stages, epi_tile_n=min(64, tn),
        group_aligned=variant == "grouped"))

  def tuning_candidates(self, problem: RaggedDotProblem):
    """Both rungs at their defaults, then `grouped` with the other tile shapes
    (short tiles waste less on small groups, long ones reuse more) and a wider band."""
    rungs = ("grouped",) if problem.ragged_contracting else tuple(reversed(VARIANTS))
    out = [(v, self.default_config(problem, v)) for v in rungs]
    g = out[0][1]
    for tm, tn, stages in ((128, 128, 6), (256, 128, 4), (128, 256, 4)):
      cand = _fit(problem, "grouped", dataclasses.replace(
          g, tile_m=tm, tile_n=tn, max_concurrent_steps=stages))
      if all(cand != c for _, c in out):
        out.append(("grouped", cand))
    out.append(("grouped", dataclasses.replace(g, grid_group=16)))
    if not problem.ragged_contracting:   # the measured rung: group-aligned slots, taller tiles
      p = out[1][1]
      out.append(("pipelined", dataclasses.replace(p, group_aligned=True)))
      if problem.m >= 192:   # jax's ragged_dot_mgpu ran fastest so on G=8 (H100: 673 vs 606)
        out.append(("pipelined", _fit(problem, "pipelined",
                                      dataclasses.replace(p, tile_m=192))))
    return out

  def impl(self, problem: RaggedDotProblem, variant: str, config: KernelConfig,
           platform: str):
    if platform not in ("cuda", "cpu"):
      raise NotImplementedError(f"backend='pallas' runs on cuda (or the cpu "
                                f"interpreter), not {platform!r}")
    interpret = platform == "cpu"

    def pallas_ragged_dot(lhs, rhs, group_bounds):
      if problem.is_empty:   # nothing to multiply (G, M, N or K is 0): zeros, no launch
        return jnp.zeros(problem.out_shape, problem.out_dtype)
      if problem.ragged_contracting:
        ragged_k = importlib.import_module(_RAGGED_K_MODULE)   # needs Mosaic GPU
        return ragged_k.ragged_dot_k(
            lhs, rhs, group_bounds, m=problem.m, k=problem.k, n=problem.n,
            out_dtype=problem.out_dtype, tile_m=config.tile_m, tile_n=config.tile_n,
            tile_k=config.tile_k, stages=config.max_concurrent_steps,
            epi_tile_n=config.epi_tile_n, grid_group=config.grid_group, interpret=interpret)
      kernels = importlib.import_module(_KERNEL_MODULE)   # needs Mosaic GPU
      return kernels.ragged_dot(
          lhs, rhs, group_bounds, m=problem.m, n=problem.n,
          trans_rhs=problem.trans_rhs, out_dtype=problem.out_dtype, variant=variant,
          tile_m=config.tile_m, tile_n=config.tile_n, tile_k=config.tile_k,
          stages=config.max_concurrent_steps, epi_tile_n=config.epi_tile_n,
          grid_group=config.grid_group, group_aligned=config.group_aligned,
          interpret=interpret)

    if not interpret or problem.is_empty:
      return pallas_ragged_dot
    return pallas_call.interpreted(
        pallas_ragged_dot, jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype))


registry.register(PallasRaggedDot())
