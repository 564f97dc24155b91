"""The `triton` backend of `glu`: the dual-GEMM kernel in `jaxgemm.kernels.triton.glu`.

One variant, `dual`: each program loads its X tile once per K step for both
weights' tiles and keeps two fp32 accumulators, then stores act(Zg) * Zu (and
Zg, Zu with save_preactivation). On the CPU the same kernel source runs in
Triton's interpreter.

Config: the matmul's `TritonConfig` (split_k, tma, epilogue_subtile and
warp_specialize unused; split_k and tma refused). Tiles: the matmul
heuristic's tensor-core tile on `problem.as_gemm()`, its N capped at
MAX_BLOCK_N (two accumulators: 128x128 fp32 each is 128 registers per thread
at 8 warps, as much as one 128x256 matmul tile), then fewer stages until the
three operand tiles fit shared memory. Operand layout as the matmul's
tensor-core rungs (`matmul.layout.tensor_core_layout`, Wu relaid like Wg).

Measured on the H100, 4096^3 bf16 silu, heuristic config (128x128x64, 8 warps,
3 stages), CUPTI paired with XLA's `silu(x @ wg) * (x @ wu)`: 1.00x (666
TFLOP/s), with Zg, Zu saved 1.09x (the Triton epilogue probe's run 1 at b3ef967).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgemm import registry
from jaxgemm.config import KernelConfig, check_shared_memory, within_shared_memory
from jaxgemm.gemm import SMEM_CAPACITY_BYTES
from jaxgemm.ops import activations
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul.triton import TritonConfig, TritonMatmul

# The widest N tile: two (block_m, block_n) fp32 accumulators live in registers.
MAX_BLOCK_N = 128


class TritonGlu(registry.Backend):
  op = "glu"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records.
  kernel_modules = ("jaxgemm.kernels.triton.glu.dual", "jaxgemm.kernels.triton.matmul.layout",
                    "jaxgemm.triton_call")
  config_cls = TritonConfig
  variants = ("dual",)

  def __init__(self, num_sms: int | None = None):
    """num_sms: as `TritonMatmul`'s (the SMs the heuristic sizes grids for)."""
    self._matmul = TritonMatmul(num_sms)

  def for_platform(self, platform: str | None) -> "TritonGlu":
    backend = TritonGlu()
    backend._matmul = self._matmul.for_platform(platform)
    return backend

  def default_variant(self, problem: GluProblem) -> str:
    return "dual"

  def default_config(self, problem: GluProblem, variant: str) -> TritonConfig:
    gemm = problem.as_gemm()
    base = self._matmul.default_config(gemm, "tensorcore")
    config = dataclasses.replace(base, block_n=min(base.block_n, MAX_BLOCK_N), split_k=1,
                                 epilogue_subtile=1)
    return self._within_smem(problem, config)

  def tuning_candidates(self, problem: GluProblem) -> list[tuple[str, TritonConfig]]:
    """The heuristic's tile, and 64-row and 64-column ones (more tiles on the SMs)."""
    base = self.default_config(problem, "dual")
    out = [("dual", base)]
    for tile in (dict(block_m=64, num_warps=4), dict(block_n=64, num_warps=4)):
      config = self._within_smem(problem, dataclasses.replace(base, **{
          k: min(v, getattr(base, k)) if k.startswith("block") else v
          for k, v in tile.items()}))
      if ("dual", config) not in out:
        out.append(("dual", config))
    return out

  def _within_smem(self, problem, config: TritonConfig) -> TritonConfig:
    return within_shared_memory(config, lambda c: self._smem_bytes(problem, c)[0],
                                SMEM_CAPACITY_BYTES)

  @staticmethod
  def _smem_bytes(problem: GluProblem, config) -> tuple[int, str]:
    """(bytes of shared memory the launch needs, the formula in words): num_stages
    copies of X's tile and both weight tiles in their dtype."""
    itemsize = np.dtype(problem.dtype).itemsize
    smem = config.num_stages * (config.block_m * config.block_k
                                + 2 * config.block_k * config.block_n) * itemsize
    formula = (f"num_stages={config.num_stages} x (block_m={config.block_m} x "
               f"block_k={config.block_k} + 2 x block_k x block_n={config.block_n}) x "
               f"{itemsize} B")
    return smem, formula

  def check(self, problem: GluProblem, variant: str, config: KernelConfig) -> None:
    what = f"backend='triton' variant={variant!r} (glu)"
    if variant not in self.variants:
      raise ValueError(f"unknown variant={variant!r} for {what}; valid: {list(self.variants)}")
    activations.check(problem.activation, allow_none=False)
    if config.split_k > 1:
      raise NotImplementedError(f"{what} does not split K (the epilogue needs the whole K "
                                f"sum); config.split_k must be 1, got {config.split_k}")
    if config.tma:
      raise NotImplementedError(f"{what} has no TMA path; use tma=False")
    # The tensor-core rung's checks: dtypes, no exact fp32, block_k >= 16.
    self._matmul.check(problem.as_gemm(), "tensorcore",
                       dataclasses.replace(config, num_stages=1))
    check_shared_memory(what, *self._smem_bytes(problem, config), SMEM_CAPACITY_BYTES)

  def impl(self, problem: GluProblem, variant: str, config: KernelConfig, platform: str):
    """fn(x, wg, wu[, bias_gate, bias_up]) -> H, or (H, Zg, Zu) with save_preactivation."""
    from jaxgemm.kernels.triton.glu import dual  # noqa: PLC0415 (needs triton)
    from jaxgemm.kernels.triton.matmul import layout  # noqa: PLC0415
    roles = ("b",) + ("out",) * len(problem.extra_shapes)
    return layout.tensor_core_layout(dual.glu, problem, config, platform, extra_roles=roles)


registry.register(TritonGlu())
