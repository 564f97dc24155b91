"""The `triton` backend of `fused_matmul`: the matmul's tensor-core kernels with the epilogue fused.

Variants `tensorcore` and `persistent` are the matmul's rungs of those names
(`jaxgemm.kernels.triton.matmul.tiled.blocked_epilogue_kernel`,
`persistent.persistent_epilogue_kernel`): the same kernels with compile-time
switches for a bias, an activation, a residual and the saved pre-activation
(`jaxgemm.kernels.triton.epilogue`), or a gate ("out": the accumulator times
act'(Z), in the kernel; "lhs"/"rhs": A or B times act'(Z), in fp32, rounded to
the operand's dtype before the dot: by an XLA pre-pass, see
OPERAND_GATE_IN_KERNEL for the measurement, or in the kernel). Split-K is not
offered: the epilogue needs the whole K sum (the kernel launch refuses it too).

Operand layout (`matmul.layout.tensor_core_layout`): bias, residual and an
"out" gate's Z are read in C's coordinates as given; an "lhs"/"rhs" gate's Z is
transposed and zero-padded exactly as the operand it gates, so the kernel
reads both with the same strides (the pad's zeros meet zeros of the operand).

Heuristics are the matmul's on `problem.as_gemm()` (split-K off), fitted to
shared memory as the matmul's (the epilogue adds none: `_smem_bytes`).

Measured on the H100, 4096^3 bf16, heuristic configs, against XLA's program of
the same expression (the Triton epilogue probe at 6ab896e, CUPTI, paired):
bias+gelu+residual 0.98-0.99x, bias+silu 1.03x, saved Z 0.95x (3 stages),
gate out 1.02x, gates lhs/rhs (pre-pass) 0.98x / 0.97x; the plain matmul 0.97x.
"""

from __future__ import annotations

import dataclasses
import importlib


from jaxgemm import registry
from jaxgemm.config import KernelConfig, check_shared_memory, within_shared_memory
from jaxgemm.gemm import SMEM_CAPACITY_BYTES
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.fused_matmul.problem import (EPILOGUE_WIN_PALLAS_MIN_M,
                                              activation_epilogue_wins)
from jaxgemm.ops.matmul.triton import TritonConfig, TritonMatmul

_VARIANTS = ("tensorcore", "persistent")
# Gates "lhs"/"rhs" in the kernel (each loaded A/B tile times act'(Z) before the
# dot) ran at 0.30x / 0.15x XLA's pre-pass + dot on the H100 (4096^3 bf16,
# persistent 128x256x64: 0.680 / 1.368 ms against 0.204;
# the Triton epilogue probe's run 1 at b3ef967): the tile,
# changed in registers, leaves Triton's cp.async pipeline, and B goes back to
# shared memory for wgmma. So the backend computes A * act'(Z) (or B *
# act'(Z)) in one XLA fusion, in fp32 rounded to the operand's dtype (the
# kernel's arithmetic), and runs the plain kernel on it; True runs the
# in-kernel gate (`tiled.accumulate_tile`'s GATE switch, kept tested).
OPERAND_GATE_IN_KERNEL = False


class TritonFusedMatmul(registry.Backend):
  op = "fused_matmul"
  name = "triton"
  # Code that decides a tuned config's speed: a change to it stales the records.
  rung_package = "jaxgemm.kernels.triton.matmul"
  kernel_modules = ("jaxgemm.kernels.triton.matmul.layout", "jaxgemm.triton_call")
  config_cls = TritonConfig
  variants = _VARIANTS

  def __init__(self, num_sms: int | None = None):
    """num_sms: as `TritonMatmul`'s (the SMs the heuristic sizes grids for)."""
    self._matmul = TritonMatmul(num_sms)

  def for_platform(self, platform: str | None) -> "TritonFusedMatmul":
    backend = TritonFusedMatmul()
    backend._matmul = self._matmul.for_platform(platform)
    return backend

  def structural_win(self, problem: FusedMatmulProblem, device_kind: str) -> str | None:
    """A 16-bit activation epilogue below EPILOGUE_WIN_PALLAS_MIN_M rows, on Hopper
    (`fused_matmul.problem.activation_epilogue_wins` has the measurement)."""
    if activation_epilogue_wins(problem, device_kind) and problem.m < EPILOGUE_WIN_PALLAS_MIN_M:
      return f"{problem.activation} epilogue fused at {problem.m} rows"
    return None

  def default_variant(self, problem: FusedMatmulProblem) -> str:
    """The matmul's choice on the bare GEMM, where it is one of ours; else `tensorcore`
    (the matmul's exact-fp32 and split-K rungs have no epilogue)."""
    variant = self._matmul.default_variant(problem.as_gemm())
    return variant if variant in _VARIANTS else "tensorcore"

  def default_config(self, problem: FusedMatmulProblem, variant: str) -> TritonConfig:
    config = dataclasses.replace(self._matmul.default_config(problem.as_gemm(), variant),
                                 split_k=1)
    return within_shared_memory(config, lambda c: self._smem_bytes(problem, variant, c)[0],
                                SMEM_CAPACITY_BYTES)

  def tuning_candidates(self, problem: FusedMatmulProblem) -> list[tuple[str, TritonConfig]]:
    """The matmul's tensor-core candidates on the bare GEMM, fitted to the epilogue."""
    out = []
    for variant, config in self._matmul.tuning_candidates(problem.as_gemm()):
      if variant not in _VARIANTS:
        continue
      config = within_shared_memory(dataclasses.replace(config, split_k=1),
                                    lambda c: self._smem_bytes(problem, variant, c)[0],
                                    SMEM_CAPACITY_BYTES)
      if (variant, config) not in out:
        out.append((variant, config))
    return out

  @staticmethod
  def _smem_bytes(problem: FusedMatmulProblem, variant: str, config) -> tuple[int, str]:
    """The matmul's count: bias, residual and gate tiles are read straight into
    registers, and the saved Z reuses the C tile's staging buffer (persistent
    128x256x64 bf16 with Z saved launched in 3 stages and ran 0.95x XLA; counted
    as a second tile it fell to 2 stages and 0.65x: the probe's run-2 log)."""
    return TritonMatmul.smem_bytes(problem.as_gemm(), variant, config)

  def check(self, problem: FusedMatmulProblem, variant: str, config: KernelConfig) -> None:
    what = f"backend='triton' variant={variant!r} (fused_matmul)"
    if variant not in _VARIANTS:
      raise ValueError(f"unknown variant={variant!r} for {what}; valid: {list(_VARIANTS)}")
    if config.split_k > 1:
      raise NotImplementedError(
          f"{what}: split-K cannot fuse an epilogue or a gate (the epilogue needs the whole "
          f"K sum); config.split_k must be 1, got {config.split_k}")
    activations.check(problem.activation)
    activations.check(problem.gate_activation, "gate_activation")
    if config.tma and problem.gate in ("lhs", "rhs") and OPERAND_GATE_IN_KERNEL:
      raise NotImplementedError(f"{what}: the TMA path does not gate operand tiles "
                                f"(gate={problem.gate!r}); use tma=False")
    self._matmul.check(problem.as_gemm(), variant, config)
    check_shared_memory(what, *self._smem_bytes(problem, variant, config), SMEM_CAPACITY_BYTES)

  def impl(self, problem: FusedMatmulProblem, variant: str, config: KernelConfig,
           platform: str):
    """fn(a, b, *extras) -> C, or (C, Z) with save_preactivation; extras in
    `problem.extra_shapes` order (bias, residual | gate Z)."""
    from jaxgemm.kernels.triton import epilogue  # noqa: PLC0415 (needs triton)
    from jaxgemm.kernels.triton.matmul import layout  # noqa: PLC0415
    kernel = importlib.import_module(f"jaxgemm.kernels.triton.matmul.{variant}")
    if problem.gate in ("lhs", "rhs") and not OPERAND_GATE_IN_KERNEL:
      plain = layout.tensor_core_layout(kernel.matmul, problem.as_gemm(), config, platform)
      return lambda a, b, z: plain(*gated_operands(problem, a, b, z))
    return layout.tensor_core_layout(kernel.matmul, problem, config, platform,
                                     extra_roles=epilogue.extra_roles(problem))


def gated_operands(problem: FusedMatmulProblem, a, b, z):
  """(A, B) with the gated one multiplied by act'(Z) in fp32, rounded to its dtype."""
  import jax.numpy as jnp  # noqa: PLC0415
  def gate(x):
    g = activations.derivative(problem.gate_activation, z.astype(jnp.float32))
    return (x.astype(jnp.float32) * g).astype(x.dtype)
  return (gate(a), b) if problem.gate == "lhs" else (a, gate(b))


registry.register(TritonFusedMatmul())
