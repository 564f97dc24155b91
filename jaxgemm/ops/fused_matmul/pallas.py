"""The `pallas` backend of `fused_matmul`: a GEMM with its epilogue in the persistent kernel.

The kernel is the matmul ladder's persistent warp-specialized body
(`jaxgemm.kernels.pallas.matmul.warp_specialized.persistent_kernel`) with its
epilogue switches on (`jaxgemm.kernels.pallas.epilogue.Epilogue`); rungs
`warp_specialized` and `clusters` (2-CTA clusters, the shared operand
multicast). The epilogue runs per (64, epi_tile_n) piece of each consumer's
fp32 accumulator, before its one rounding to out_dtype:

* bias ("shared" (N,) or "batched" (batch, N)): the piece's columns read from
  GMEM (L2) into the accumulator's column layout and broadcast over its rows;
* activation: `epilogue.activation` (jax.nn's formulas in fp32);
* residual, and gate "out"'s Z: a (64, epi_tile_n) tile per piece, TMA-loaded
  into two SMEM slots per consumer warpgroup one piece ahead (the first
  piece's during the tile's main loop). That is 4 more 64 x epi_tile_n
  buffers: the default 256x128x64 tiles keep their 4 stages with 32-wide
  pieces (`default_config`; a Z wider than out_dtype shrinks the ring at trace time);
* save_preactivation: Z stored as a second output through the same slots.

Gates "lhs" and "rhs" (C = op(A * g(Z)) @ op(B), op(A) @ op(B * g(Z))) are an
XLA pre-pass: g(Z) * operand in fp32, rounded to the operand dtype by one XLA
fusion, then the plain kernel. In-kernel they would need the gated operand to
go SMEM -> registers -> SMEM inside the main loop (wgmma reads SMEM), a
second ring for Z and a consumer-side transform stage; the pre-pass costs one
read of the operand and Z and one write of the operand.

`stream_k` (split tiles: an epilogue must wait for every partial) and the
lower rungs (`basic`, `pipelined`) are not variants of this backend.
On `cpu` the same kernels run in the Mosaic GPU interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import pallas_call, registry
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import SMEM_CAPACITY_BYTES
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.fused_matmul.problem import (EPILOGUE_WIN_PALLAS_MIN_M,
                                              activation_epilogue_wins)
from jaxgemm.ops.matmul import pallas as matmul_pallas
from jaxgemm.ops.matmul.pallas import PallasConfig, PallasMatmul

VARIANTS = ("warp_specialized", "clusters")
_EPI_TILE_M = 64
_MATMUL = PallasMatmul()


def epilogue_smem_bytes(problem, config: PallasConfig, tile_itemsize: int | None) -> int:
  """Shared memory the epilogue adds: two (64, epi_tile_n) tile slots per consumer
  when it reads a residual or Z (`tile_itemsize`: that tensor's element size)."""
  if not tile_itemsize:
    return 0
  return 2 * 2 * _EPI_TILE_M * min(config.epi_tile_n, config.tile_n) * tile_itemsize


def tile_itemsize(problem: FusedMatmulProblem) -> int | None:
  """The element size assumed for the loaded tile: the residual's (out_dtype),
  or Z's, taken as out_dtype (what save_preactivation stores) until the call
  shows Z's dtype."""
  if problem.residual or problem.gate == "out":
    return np.dtype(problem.out_dtype).itemsize
  return None


def smem_bytes(problem, variant: str, config: PallasConfig,
               itemsize: int | None = None) -> dict[str, int]:
  parts = matmul_pallas.smem_bytes(problem.as_gemm(), variant, config)
  extra = epilogue_smem_bytes(problem, config, itemsize)
  if extra:
    parts["epilogue"] = extra
  return parts


def fit_stages(problem, variant: str, config: PallasConfig, itemsize: int | None):
  """`config` with its ring shrunk (to 2 stages at least) until shared memory fits."""
  while (sum(smem_bytes(problem, variant, config, itemsize).values())
         > SMEM_CAPACITY_BYTES and config.max_concurrent_steps > 2):
    config = dataclasses.replace(config, max_concurrent_steps=config.max_concurrent_steps - 1)
  return config


def kernel_epilogue(problem: FusedMatmulProblem):
  """The kernel's Epilogue for `problem` (None for the lhs/rhs gates: a plain GEMM)."""
  from jaxgemm.kernels.pallas.epilogue import Epilogue  # noqa: PLC0415 (needs Mosaic GPU)
  if problem.gate in ("lhs", "rhs"):
    return None
  return Epilogue(activation=problem.activation, bias=problem.bias, residual=problem.residual,
                  save_preactivation=problem.save_preactivation,
                  gate=problem.gate_activation if problem.gate == "out" else None)


def reference(problem: FusedMatmulProblem, a, b, *extras):
  """The problem in jnp (fp32 epilogue, one rounding): empty problems take it."""
  f32 = jnp.float32
  if problem.gate == "lhs":
    a = gated(a, extras[0], problem.gate_activation)
  if problem.gate == "rhs":
    b = gated(b, extras[0], problem.gate_activation)
  lhs = jnp.swapaxes(a, 1, 2) if problem.trans_a else a
  rhs = jnp.swapaxes(b, 1, 2) if problem.trans_b else b
  acc = jnp.matmul(lhs, rhs, preferred_element_type=f32)
  out_dtype = problem.out_dtype
  if problem.gate == "out":
    return (activations.derivative(problem.gate_activation, extras[0].astype(f32))
            * acc).astype(out_dtype)
  if problem.gate:
    return acc.astype(out_dtype)
  extras = list(extras)
  z = acc
  if problem.bias:
    bias = extras.pop(0).astype(f32)
    z = z + (bias[None, None, :] if problem.bias == "shared" else bias[:, None, :])
  y = activations.apply(problem.activation, z)
  if problem.residual:
    y = y + extras.pop(0).astype(f32)
  y = y.astype(out_dtype)
  return (y, z.astype(out_dtype)) if problem.save_preactivation else y


def gated(x, z, activation: str):
  """x * activation'(Z) in fp32, rounded to x's dtype: the lhs/rhs gates' pre-pass."""
  return (x.astype(jnp.float32)
          * activations.derivative(activation, z.astype(jnp.float32))).astype(x.dtype)


class PallasFusedMatmul(registry.Backend):
  op = "fused_matmul"
  name = "pallas"
  rung_package = "jaxgemm.kernels.pallas.matmul"
  kernel_modules = ("jaxgemm.kernels.pallas.common", "jaxgemm.kernels.pallas.epilogue",
                    "jaxgemm.kernels.pallas.matmul.warp_specialized")
  config_cls = PallasConfig
  variants = VARIANTS

  def structural_win(self, problem: FusedMatmulProblem, device_kind: str) -> str | None:
    """A 16-bit activation epilogue from EPILOGUE_WIN_PALLAS_MIN_M rows, on Hopper
    (`fused_matmul.problem.activation_epilogue_wins` has the measurement)."""
    if activation_epilogue_wins(problem, device_kind) and problem.m >= EPILOGUE_WIN_PALLAS_MIN_M:
      return f"{problem.activation} epilogue fused at {problem.m} rows"
    return None

  def check(self, problem: FusedMatmulProblem, variant: str, config: KernelConfig) -> None:
    if variant not in VARIANTS:
      if variant in matmul_pallas.VARIANTS:
        raise NotImplementedError(
            f"backend='pallas' runs fused_matmul's epilogue in the persistent rungs "
            f"{list(VARIANTS)} only; variant={variant!r} has none (stream_k's split tiles "
            f"would need every partial before the epilogue)")
      raise ValueError(f"unknown variant={variant!r} for backend='pallas' op 'fused_matmul'; "
                       f"valid variants: {list(VARIANTS)}")
    for name in (problem.activation, problem.gate_activation):
      activations.check(name)
    if problem.gate is not None and problem.gate_activation is None:
      raise ValueError(f"gate={problem.gate!r} needs a gate_activation")
    # Everything the plain GEMM needs (dtypes, precision, tiles, clusters)...
    _MATMUL.check(problem.as_gemm(), variant, config)
    # ...and shared memory with the epilogue's tile slots.
    parts = smem_bytes(problem, variant, config, tile_itemsize(problem))
    total = sum(parts.values())
    if total > SMEM_CAPACITY_BYTES:
      detail = " + ".join(f"{k}={v}" for k, v in parts.items())
      raise ValueError(
          f"backend='pallas' variant={variant!r} fused_matmul ({problem.epilogue}) with "
          f"tile_m={config.tile_m}, tile_n={config.tile_n}, tile_k={config.tile_k}, "
          f"max_concurrent_steps={config.max_concurrent_steps} needs {total} bytes of shared "
          f"memory ({detail}), more than the {SMEM_CAPACITY_BYTES} bytes a "
          f"Hopper CTA can have; lower max_concurrent_steps, tile_k or the tiles")

  def default_config(self, problem: FusedMatmulProblem, variant: str) -> PallasConfig:
    """PallasMatmul's tiles for the bare GEMM; where the epilogue's tile slots
    (residual, Z) would cost a stage, 32-wide epilogue pieces instead (half the
    slots), else the ring shrunk to fit.

    H100, jax 0.11.2, bias+residual, CUPTI paired with XLA's `x @ w + b + r`:
    256x128x64 in 3 stages with 64-wide pieces 195.0 us at 4096^3 (0.928x XLA)
    and 1407.2 us at 8192x4096x14336 (0.894x); in 4 stages with 32-wide pieces
    185.1 us (0.979x) and 1297.3 us (0.970x); the plain matmul in 3 stages
    loses the same 7% (the Pallas epilogue probe's run 2 at f97c058).
    Without tile slots 64-wide pieces stay (gelu+bias: 184.6 against 185.9 us).
    """
    config = _MATMUL.default_config(problem.as_gemm(), variant)
    itemsize = tile_itemsize(problem)
    narrow = dataclasses.replace(config, epi_tile_n=min(32, config.epi_tile_n))
    if (itemsize and sum(smem_bytes(problem, variant, config, itemsize).values())
        > SMEM_CAPACITY_BYTES):
      config = narrow
    return fit_stages(problem, variant, config, itemsize)

  def tuning_candidates(self, problem: FusedMatmulProblem) -> list[tuple[str, PallasConfig]]:
    out = [(v, self.default_config(problem, v)) for v in ("clusters", "warp_specialized")]
    out.append(("clusters", dataclasses.replace(out[0][1], grid_minor_m=True)))
    if out[0][1].epi_tile_n > 32:
      out.append(("clusters", dataclasses.replace(out[0][1], epi_tile_n=32)))
    return out

  def impl(self, problem: FusedMatmulProblem, variant: str, config: KernelConfig,
           platform: str):
    if platform not in ("cuda", "cpu"):
      raise NotImplementedError(f"backend='pallas' runs on cuda (or the cpu "
                                f"interpreter), not {platform!r}")
    interpret = platform == "cpu"
    module = importlib.import_module(f"jaxgemm.kernels.pallas.matmul.{variant}")
    kernel_fn = getattr(module, variant)
    empty = 0 in (problem.batch, problem.m, problem.n, problem.k)

    def pallas_fused_matmul(a, b, *extras):
      from jaxgemm.kernels.pallas import common  # noqa: PLC0415 (needs Mosaic GPU)
      from jaxgemm.kernels.pallas.matmul import warp_specialized  # noqa: PLC0415
      if empty:
        return reference(problem, a, b, *extras)
      if problem.gate == "lhs":
        a = gated(a, extras[0], problem.gate_activation)
      elif problem.gate == "rhs":
        b = gated(b, extras[0], problem.gate_activation)
      ep = kernel_epilogue(problem)
      a, b, laid_out = common.k_major_operands(a, b, problem)
      if ep is None:
        return kernel_fn(a, b, laid_out, config, interpret=interpret)
      cfg = config
      if ep.loads_tile:   # Z's own dtype may be wider than out_dtype
        cfg = fit_stages(problem, variant, config, np.dtype(extras[-1].dtype).itemsize)
      cluster = ((cfg.cluster_m, cfg.cluster_n) if variant == "clusters" else (1, 1))
      out = warp_specialized.persistent_call(
          a, b, laid_out, cfg, interpret, cluster_m=cluster[0], cluster_n=cluster[1],
          epilogue=ep, extras=extras)
      # An epilogue's outputs come back as a tuple, a 1-tuple without
      # save_preactivation; the op's contract is one array then.
      return out[0] if isinstance(out, tuple) and problem.num_outputs == 1 else out

    if not interpret or empty:
      return pallas_fused_matmul
    out = jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype)
    return pallas_call.interpreted(
        pallas_fused_matmul, (out,) * problem.num_outputs if problem.num_outputs > 1 else out)


registry.register(PallasFusedMatmul())
