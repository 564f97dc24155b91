"""The `pallas` backend of `glu`: both GEMMs of a gated linear unit in one persistent kernel.

`jaxgemm.kernels.pallas.glu.dual`: the matmul ladder's persistent
warp-specialized body with its dual switch. Each K step loads X's tile once
and both weight tiles; each consumer warpgroup holds two fp32 accumulators
((tile_m / 2) x tile_n each, so 256x64 or 128x128 tiles), and the epilogue
computes act(X Wg + bg) * (X Wu + bu) per (64, epi_tile_n) piece in fp32
(storing Zg and Zu too with save_preactivation). Variants: `dual` (one CTA
per SM) and `dual_clusters` (2-CTA clusters multicasting the shared tile).
On `cpu` the same kernel runs in the Mosaic GPU interpreter.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import pallas_call, registry
from jaxgemm.config import KernelConfig
from jaxgemm.gemm import SMEM_CAPACITY_BYTES
from jaxgemm.ops import activations
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.fused_matmul.problem import (EPILOGUE_WIN_PALLAS_MIN_M,
                                              activation_epilogue_wins)
from jaxgemm.ops.matmul import pallas as matmul_pallas
from jaxgemm.ops.matmul.pallas import PallasConfig, PallasMatmul

VARIANTS = ("dual", "dual_clusters")
# The matmul rung whose checks and tiles each variant shares.
_RUNG = {"dual": "warp_specialized", "dual_clusters": "clusters"}
_MATMUL = PallasMatmul()
# Both accumulators of a consumer warpgroup: at most 128 fp32 registers per thread.
_MAX_ACC_ELEMENTS = 2 * 64 * 128


def smem_bytes(problem: GluProblem, variant: str, config: PallasConfig) -> dict[str, int]:
  """The matmul rung's buffers plus the second weight's ring."""
  parts = matmul_pallas.smem_bytes(problem.as_gemm(), _RUNG[variant], config)
  parts["b2"] = parts["b"]
  return parts


def reference(problem: GluProblem, x, wg, wu, *biases):
  """The problem in jnp (fp32 epilogue): empty problems take it."""
  f32 = jnp.float32
  lhs = jnp.swapaxes(x, 1, 2) if problem.trans_a else x
  zs = []
  for i, w in enumerate((wg, wu)):
    rhs = jnp.swapaxes(w, 1, 2) if problem.trans_b else w
    z = jnp.matmul(lhs, rhs, preferred_element_type=f32)
    if biases:
      b = biases[i].astype(f32)
      z = z + (b[None, None, :] if problem.bias == "shared" else b[:, None, :])
    zs.append(z)
  h = (activations.apply(problem.activation, zs[0]) * zs[1]).astype(problem.out_dtype)
  if problem.save_preactivation:
    return (h, *(z.astype(problem.out_dtype) for z in zs))
  return h


def _fit_stages(problem: GluProblem, variant: str, config: PallasConfig) -> PallasConfig:
  """`config` with its ring shrunk until shared memory fits: stages down to 2, then
  tile_k halved down to one 128-byte swizzle span (64 16-bit or 32 fp32 elements).

  Skinny problems (M <= 128) take 128-deep K steps from PallasMatmul; with the
  second weight's ring and fp32 epilogue slots, two such stages of 128x128 tiles
  need 256 KiB (more than the 227 KiB a CTA can have), 64-deep ones 160 KiB.
  """
  min_k = 128 // np.dtype(problem.dtype).itemsize
  while sum(smem_bytes(problem, variant, config).values()) > SMEM_CAPACITY_BYTES:
    if config.max_concurrent_steps > 2:
      config = dataclasses.replace(config, max_concurrent_steps=config.max_concurrent_steps - 1)
    elif config.tile_k > min_k:
      config = dataclasses.replace(config, tile_k=config.tile_k // 2)
    else:
      break
  return config


class PallasGlu(registry.Backend):
  op = "glu"
  name = "pallas"
  kernel_modules = ("jaxgemm.kernels.pallas.glu.dual", "jaxgemm.kernels.pallas.common")
  config_cls = PallasConfig
  variants = VARIANTS

  def structural_win(self, problem: GluProblem, device_kind: str) -> str | None:
    """SwiGLU-like 16-bit dual GEMMs from EPILOGUE_WIN_PALLAS_MIN_M rows, on Hopper
    (`fused_matmul.problem.activation_epilogue_wins` has the measurement)."""
    if activation_epilogue_wins(problem, device_kind) and problem.m >= EPILOGUE_WIN_PALLAS_MIN_M:
      return f"glu {problem.activation}: both GEMMs and the gate in one kernel"
    return None

  def check(self, problem: GluProblem, variant: str, config: KernelConfig) -> None:
    if variant not in VARIANTS:
      raise ValueError(f"unknown variant={variant!r} for backend='pallas' op 'glu'; "
                       f"valid variants: {list(VARIANTS)}")
    activations.check(problem.activation, allow_none=False)
    _MATMUL.check(problem.as_gemm(), _RUNG[variant], config)
    if (config.tile_m // 2) * config.tile_n * 2 > _MAX_ACC_ELEMENTS:
      raise ValueError(
          f"backend='pallas' glu keeps two fp32 accumulators of (tile_m / 2) x tile_n per "
          f"consumer warpgroup: tile_m={config.tile_m}, tile_n={config.tile_n} need more than "
          f"128 registers per thread; use tile_m * tile_n <= 16384 (128x128, 256x64)")
    parts = smem_bytes(problem, variant, config)
    total = sum(parts.values())
    if total > SMEM_CAPACITY_BYTES:
      detail = " + ".join(f"{k}={v}" for k, v in parts.items())
      raise ValueError(
          f"backend='pallas' glu variant={variant!r} with tile_m={config.tile_m}, "
          f"tile_n={config.tile_n}, tile_k={config.tile_k}, max_concurrent_steps="
          f"{config.max_concurrent_steps} needs {total} bytes of shared memory ({detail}), "
          f"more than the {SMEM_CAPACITY_BYTES} bytes a Hopper CTA can have; "
          f"lower max_concurrent_steps, tile_k or the tiles")

  def default_config(self, problem: GluProblem, variant: str) -> PallasConfig:
    """PallasMatmul's tiles for one of the GEMMs, tile_n halved until both
    accumulators fit (256x128 -> 256x64; M <= 128 has 64-wide N tiles already),
    the ring shrunk until the second weight's fits.

    H100, jax 0.11.2, glu silu, CUPTI paired with XLA's `silu(x @ wg) * (x @ wu)`:
    256x64x64 in 4 stages 353.0 us at 4096^3 (1.183x XLA) and 2454.3 us at
    8192x4096x14336 (1.058x), against 356.9 and 2497.7 us for 128x128x64
    (the Pallas epilogue probe's runs 1 and 2 at f97c058).
    """
    config = _MATMUL.default_config(problem.as_gemm(), _RUNG[variant])
    tile_n = config.tile_n
    while (config.tile_m // 2) * tile_n * 2 > _MAX_ACC_ELEMENTS and tile_n > 16:
      tile_n //= 2
    config = dataclasses.replace(config, tile_n=tile_n, epi_tile_n=min(config.epi_tile_n, tile_n))
    return _fit_stages(problem, variant, config)

  def tuning_candidates(self, problem: GluProblem) -> list[tuple[str, PallasConfig]]:
    out = [(v, self.default_config(problem, v)) for v in ("dual_clusters", "dual")]
    square = dataclasses.replace(out[0][1], tile_m=128, tile_n=128, epi_tile_n=64,
                                 max_concurrent_steps=4)
    out.append(("dual_clusters", _fit_stages(problem, "dual_clusters", square)))
    return out

  def impl(self, problem: GluProblem, variant: str, config: KernelConfig, platform: str):
    if platform not in ("cuda", "cpu"):
      raise NotImplementedError(f"backend='pallas' runs on cuda (or the cpu "
                                f"interpreter), not {platform!r}")
    interpret = platform == "cpu"
    empty = 0 in (problem.batch, problem.m, problem.n, problem.k)
    clustered = variant == "dual_clusters"

    def pallas_glu(x, wg, wu, *biases):
      from jaxgemm.kernels.pallas import common  # noqa: PLC0415 (needs Mosaic GPU)
      from jaxgemm.kernels.pallas.glu import dual  # noqa: PLC0415
      if empty:
        return reference(problem, x, wg, wu, *biases)
      gemm = problem.as_gemm()
      x2, wg2, laid_out = common.k_major_operands(x, wg, gemm)
      if laid_out is not gemm and gemm.trans_b != laid_out.trans_b:
        wu = jnp.swapaxes(wu, 1, 2)   # TF32 reads K-major: as wg was
      out = dual.dual(x2, wg2, wu, biases, laid_out, config, activation=problem.activation,
                      bias=problem.bias, save_preactivation=problem.save_preactivation,
                      interpret=interpret,
                      cluster_m=config.cluster_m if clustered else 1,
                      cluster_n=config.cluster_n if clustered else 1)
      # The kernel returns its epilogue's outputs as a tuple, a 1-tuple without
      # save_preactivation; the op's contract is one array then.
      return out[0] if isinstance(out, tuple) and problem.num_outputs == 1 else out

    if not interpret or empty:
      return pallas_glu
    out = jax.ShapeDtypeStruct(problem.out_shape, problem.out_dtype)
    return pallas_call.interpreted(
        pallas_glu, (out,) * problem.num_outputs if problem.num_outputs > 1 else out)


registry.register(PallasGlu())
