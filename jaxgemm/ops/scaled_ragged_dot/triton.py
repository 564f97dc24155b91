"""The `triton` backend of scaled_ragged_dot: `jaxgemm.kernels.triton.scaled_ragged_dot`.

One variant, `grouped` (on a grid of work items, or persistent: `config.persistent`):
ragged_dot's grouped kernel (a program per (group row tile, output tile), the tiles
mapped to groups by a table computed on the device, `jaxgemm.ragged_schedule`, so
routing changes with no recompile) running scaled_matmul's FP8 K loop (a block's fp8
products summed on the tensor cores into a fresh fp32 partial sum every 128 of K,
promoted into the fp32 accumulator times the block's scales for "block" scales; the
other kinds' scales in the epilogue). With g the group of row r:

    "block":   out[r] = round_out(sum_kb partial_kb[r] * lhs_scale[r, kb]
                                                      * rhs_scale[g, kb, n // 128])
    otherwise: out[r] = round_out((sum_kb partial_kb[r]) * lhs_scale[r] * rhs_scale[g])

These are the xla backend's semantics (its `scaled_grouped_product`): rows in no group are
zeros, an empty expert's weights and scales are never read. Every scale kind of
`ScaledRaggedDotProblem` and any pairing of e4m3 and e5m2 operands, ragged-M and
ragged-K (the weight gradient: `scaled_ragged_k_kernel`, its tiles multiplied in
float16, on a grid of work items only). On the CPU the same kernel source runs in Triton's
interpreter, which decodes fp8 exactly.

The weights' layout (`config.rhs_k_major`): FP8 wgmma reads its shared-memory
operands K-major only, and the canonical rhs is (G, K, N). Read in place, its tiles
are multiplied in float16 (exact; half FP8's rate, `scaled.dot_f16`); with
rhs_k_major the experts are transposed to (G, N, K) first (one pass over the
weights, Triton's fp8 transpose) and multiplied in fp8. The heuristic transposes
where each expert has more rows on average than scaled_matmul's in-place bound
(`IN_PLACE_MAX_ROWS`: there the GEMM, not the weights' bytes, bounds the time) and
the operands reach a megabyte (`ALIGN_MIN_OPERAND_BYTES`). Not measured on a GPU yet:
no `structural_win`, so `backend="auto"` takes it only from a tuning record.
"""

from __future__ import annotations

import dataclasses
import importlib

from jaxgemm import registry
from jaxgemm.config import (KernelConfig, check_shared_memory, int_range, power_of_two,
                            within_shared_memory)
from jaxgemm.gemm import SMEM_CAPACITY_BYTES, pow2_at_least
from jaxgemm.ops.matmul.triton import ALIGN_MIN_OPERAND_BYTES
from jaxgemm.ops.scaled_matmul.triton import (BLOCK_K_CHOICES, IN_PLACE_MAX_ROWS,
                                              check_fp8_operands, check_k_step,
                                              fp8_smem_bytes)
from jaxgemm.ops.scaled_ragged_dot.problem import ScaledRaggedDotProblem

# Tiles, largest first: (block_m, block_n, block_k, num_warps, num_stages), scaled_matmul's
# (its `_TILES`: two fp32 tiles in registers, the accumulator and the block's partial sum,
# so 128x128 on 8 warps; block_k = 128, one scale block a K step). The 64-row tiles
# waste fewer rows where experts have few (a group's last tile is cut at its end).
_TILES = ((128, 128, 128, 8, 4), (64, 128, 128, 4, 4), (64, 64, 128, 4, 4))
# Below this many rows per expert on average, the heuristic takes 64-row tiles.
SMALL_GROUP_ROWS = 128


@dataclasses.dataclass(frozen=True)
class ScaledRaggedDotTritonConfig(KernelConfig):
  """Tiling and launch parameters of the FP8 grouped Triton kernel.

  Output tile block_m (rows of one group) x block_n, K in block_k steps (32, 64 or
  128: a step never crosses a 128-wide scale block). group_m: tile rows walked per
  column (L2 reuse). rhs_k_major: transpose the experts to (N, K) first and multiply
  in fp8, else read them (K, N) in place and multiply in float16 (module docstring).
  persistent: one program per SM walking the work items (ragged_dot's), so that the
  next item's loads overlap this one's epilogue.

  >>> ScaledRaggedDotTritonConfig(block_m=64, block_k=64, rhs_k_major=True).block_k
  64
  """

  backend = "triton"
  block_m: int = power_of_two(16, 256, default=128)
  block_n: int = power_of_two(16, 256, default=128)
  block_k: int = power_of_two(16, 256, default=128)
  group_m: int = int_range(1, 64, default=8)
  num_warps: int = power_of_two(1, 16, default=8)
  num_stages: int = int_range(1, 8, default=4)
  rhs_k_major: bool = False
  persistent: bool = False


class TritonScaledRaggedDot(registry.Backend):
  op = "scaled_ragged_dot"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records (the
  # kernels it imports, ragged_dot's and scaled_matmul's, are followed).
  kernel_modules = ("jaxgemm.kernels.triton.scaled_ragged_dot.grouped", "jaxgemm.triton_call",
                    "jaxgemm.ragged_schedule")
  config_cls = ScaledRaggedDotTritonConfig
  variants = ("grouped",)

  @staticmethod
  def _rows_per_group(problem: ScaledRaggedDotProblem) -> float:
    return problem.m / max(1, problem.groups)

  @classmethod
  def _transposes_rhs(cls, problem: ScaledRaggedDotProblem) -> bool:
    operand_bytes = problem.batch * (problem.m + problem.groups * problem.n) * problem.k
    return (cls._rows_per_group(problem) > IN_PLACE_MAX_ROWS
            and operand_bytes >= ALIGN_MIN_OPERAND_BYTES)

  @staticmethod
  def _config(problem: ScaledRaggedDotProblem, tile, rhs_k_major: bool):
    """The tile clamped to the problem: rows to the next power of two from 16 below 64
    rows (wgmma needs 64), columns from 16, K steps from 32 up to 128."""
    block_m, block_n, block_k, num_warps, num_stages = tile
    return ScaledRaggedDotTritonConfig(
        block_m=pow2_at_least(problem.m, 64 if problem.m >= 64 else 16, block_m),
        block_n=pow2_at_least(problem.n, 16, block_n),
        block_k=pow2_at_least(problem.k, BLOCK_K_CHOICES[0], block_k),
        group_m=8, num_warps=num_warps, num_stages=num_stages, rhs_k_major=rhs_k_major)

  @staticmethod
  def _ragged_k_config(problem: ScaledRaggedDotProblem, tile):
    """The ragged-K kernel's tile (block_m along K, block_k rows a step) clamped to the
    problem: block_m from 16 by K (64 from 64 up), block_n from 16 by N, block_k from 32
    up to 128 by the rows per group."""
    block_m, block_n, block_k, num_warps, num_stages = tile
    rows = max(1, problem.m // max(1, problem.groups))
    return ScaledRaggedDotTritonConfig(
        block_m=pow2_at_least(problem.k, 64 if problem.k >= 64 else 16, block_m),
        block_n=pow2_at_least(problem.n, 16, block_n),
        block_k=pow2_at_least(rows, BLOCK_K_CHOICES[0], block_k),
        group_m=8, num_warps=num_warps, num_stages=num_stages)

  def default_config(self, problem: ScaledRaggedDotProblem,
                     variant: str) -> ScaledRaggedDotTritonConfig:
    """scaled_matmul's 128x128x128 tile (64 rows where experts average fewer than
    SMALL_GROUP_ROWS rows), clamped to the problem, fitted to shared memory; the
    experts transposed first where `_transposes_rhs` (module docstring). Ragged-K: the
    128x128 output tile (K x N) over 128-row steps, clamped (not measured yet)."""
    if problem.ragged_contracting:
      return self._within_smem(self._ragged_k_config(problem, _TILES[0]))
    tile = _TILES[1] if self._rows_per_group(problem) < SMALL_GROUP_ROWS else _TILES[0]
    return self._within_smem(self._config(problem, tile, self._transposes_rhs(problem)))

  def tuning_candidates(self, problem: ScaledRaggedDotProblem
                        ) -> list[tuple[str, KernelConfig]]:
    """The heuristic's config first, then each tile of `_TILES` with the experts read in
    place and transposed, each on a grid of work items and persistent (clamped, fitted,
    without repeats)."""
    out = [("grouped", self.default_config(problem, "grouped"))]
    if problem.ragged_contracting:   # no transposed weights, no persistent form
      for tile in _TILES:
        candidate = ("grouped", self._within_smem(self._ragged_k_config(problem, tile)))
        if candidate not in out:
          out.append(candidate)
      return out
    for tile in _TILES:
      for rhs_k_major in (False, True):
        config = self._within_smem(self._config(problem, tile, rhs_k_major))
        for persistent in (False, True):
          candidate = ("grouped", dataclasses.replace(config, persistent=persistent))
          if candidate not in out:
            out.append(candidate)
    return out

  def _within_smem(self, config: ScaledRaggedDotTritonConfig) -> ScaledRaggedDotTritonConfig:
    return within_shared_memory(config, lambda c: fp8_smem_bytes(c)[0], SMEM_CAPACITY_BYTES)

  def check(self, problem: ScaledRaggedDotProblem, variant: str, config: KernelConfig) -> None:
    what = f"backend='triton' variant={variant!r} (scaled_ragged_dot)"
    if variant not in self.variants:
      raise ValueError(f"unknown variant={variant!r} for {what}; valid: {list(self.variants)}")
    if problem.ragged_contracting:
      for field in ("rhs_k_major", "persistent"):
        if getattr(config, field):
          raise ValueError(f"{what}: the ragged-K kernel takes {field}=False (it has no "
                           f"experts' weights to transpose and no persistent form); got "
                           f"{field}=True")
    check_fp8_operands(what, lhs=problem.dtype, rhs=problem.rhs_dtype)
    if not isinstance(config, ScaledRaggedDotTritonConfig):
      raise TypeError(f"{what} takes a ScaledRaggedDotTritonConfig; got "
                      f"{type(config).__name__}")
    check_k_step(what, config.block_k)
    check_shared_memory(what, *fp8_smem_bytes(config), SMEM_CAPACITY_BYTES)

  def impl(self, problem: ScaledRaggedDotProblem, variant: str, config: KernelConfig,
           platform: str):
    """fn(lhs, rhs, group_bounds, lhs_scale, rhs_scale) -> out on canonical operands
    (see `scaled_ragged_dot_p`)."""
    grouped = importlib.import_module("jaxgemm.kernels.triton.scaled_ragged_dot.grouped")
    return lambda lhs, rhs, group_bounds, lhs_scale, rhs_scale: grouped.scaled_ragged_dot(
        lhs, rhs, group_bounds, lhs_scale, rhs_scale, problem, config, platform)


registry.register(TritonScaledRaggedDot())
