"""The Pallas Mosaic GPU grouped kernels of `ragged_dot`, called through the backend's `impl`.

CPU: both rungs run in the Mosaic GPU interpreter (slow: tiny problems) with
group sizes that exercise the slot tables: empty groups, a one-row group,
groups cutting tiles, rows past sum(group_sizes) (zeros), M not a multiple of
the tile, rhs transposed, batch 2, against float64 references. NaNs where a
kernel must not read (an empty group's weights, the rows in no group) must not
reach the result. Plus the slot tables themselves (plain XLA, fast) and the
backend's config checks. The op-level contract is tests/test_ragged_dot.py's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gemm_testing import assert_gemm_close, ragged_dot_reference, random_array, tolerance
from jaxgemm import registry
from jaxgemm import ragged_schedule as schedule
from jaxgemm.ops.ragged_dot.pallas import PallasRaggedDot, RaggedDotPallasConfig
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem

BACKEND = PallasRaggedDot()
pytestmark = pytest.mark.skipif(registry.why_unavailable(BACKEND) is not None,
                                reason=str(registry.why_unavailable(BACKEND)))

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
# The smallest tiles each rung takes: the interpreter's time grows with tiles x K steps.
TINY = {"pipelined": RaggedDotPallasConfig(tile_m=64, tile_n=64, tile_k=64,
                                           max_concurrent_steps=2),
        "grouped": RaggedDotPallasConfig(tile_m=128, tile_n=64, tile_k=64,
                                         max_concurrent_steps=2, group_aligned=True)}


def _problem(batch, groups, m, k, n, dtype=BF16, out_dtype=None, *, trans_rhs=False,
             ragged_contracting=False, precision=None):
  return RaggedDotProblem(batch, groups, m, k, n, np.dtype(dtype),
                          np.dtype(out_dtype or dtype), F32, trans_rhs=trans_rhs,
                          ragged_contracting=ragged_contracting, precision=precision)


def _run(problem, sizes, variant, config=None, *, seed=0, nan_outside=True):
  rng = np.random.default_rng(seed)
  lhs = random_array(rng, problem.lhs_shape, problem.dtype)
  rhs = random_array(rng, problem.rhs_shape, problem.dtype)
  group_sizes = np.asarray(sizes, np.int32).reshape(problem.batch, problem.groups)
  ref, bound = ragged_dot_reference(problem, lhs, rhs, group_sizes)
  if nan_outside:   # what no stored row may depend on: empty groups' weights, rows in no group
    lhs, rhs = np.array(lhs), np.array(rhs)
    for b in range(problem.batch):
      used = min(int(np.maximum(group_sizes[b], 0).sum()), problem.m)
      lhs[b, used:] = np.nan
      if problem.ragged_contracting:
        rhs[b, used:] = np.nan
      else:
        rhs[b, group_sizes[b] <= 0] = np.nan
  config = config or TINY[variant]
  BACKEND.check(problem, variant, config)
  out = jax.jit(BACKEND.impl(problem, variant, config, "cpu"))(
      jnp.asarray(lhs), jnp.asarray(rhs),
      schedule.group_bounds(jnp.asarray(group_sizes), problem.m))
  assert out.shape == problem.out_shape and out.dtype == problem.out_dtype
  assert_gemm_close(out, ref, bound, tolerance(problem.dtype, problem.out_dtype),
                    f"{variant} {problem.describe()} sizes={np.asarray(sizes).tolist()}")


# ----------------------------------------------------------------- the kernels

# (problem, group sizes): M = 200 is no multiple of the 64- or 128-row tiles;
# [70, 0, 1, 100]: a group cutting a tile, an empty group, a one-row group,
# 29 rows past the sum (zeros).
RAGGED = (_problem(1, 4, 200, 64, 64), [70, 0, 1, 100])


@pytest.mark.parametrize("variant,group_aligned", [("pipelined", False), ("pipelined", True),
                                                   ("grouped", True),
                                                   pytest.param("grouped", False,
                                                                marks=pytest.mark.slow)])
def test_ragged_groups(variant, group_aligned):
  """Both slot tables on both rungs (tile-aligned: `schedule.row_tiles`)."""
  _run(*RAGGED, variant,
       dataclasses.replace(TINY[variant], group_aligned=group_aligned))


@pytest.mark.parametrize("variant", ["pipelined", "grouped"])
def test_trans_rhs(variant):
  _run(_problem(1, 3, 136, 64, 64, trans_rhs=True), [0, 9, 120], variant)


def test_pipelined_192_row_tiles():
  # A tile height that is no power of two: the store ladder's largest box is 128.
  _run(_problem(1, 3, 400, 64, 64), [191, 1, 200], "pipelined",
       dataclasses.replace(TINY["pipelined"], tile_m=192, group_aligned=True))


def test_batch_two_with_different_sizes():
  # Batch 0: sizes summing past M (clamped); batch 1: one group takes every row.
  _run(_problem(2, 3, 72, 64, 64, F16), [50, 40, 5, 0, 72, 0], "pipelined")


@pytest.mark.parametrize("variant", ["pipelined", pytest.param("grouped", marks=pytest.mark.slow)])
def test_float32_as_tf32(variant):
  # rhs (G, K, N) is transposed by XLA for TF32's K-major reads; K = 32 is one step.
  _run(_problem(1, 3, 100, 32, 64, F32), [40, 0, 51], variant,
       dataclasses.replace(TINY[variant], tile_k=32))


def test_unaligned_n_and_k_and_f32_out():
  # N = 40 and K = 24 are padded to the 128-byte span (weights only); C is sliced.
  _run(_problem(1, 2, 40, 24, 40, BF16, F32), [17, 20], "pipelined")


def test_grouped_batch_two_trans_rhs():
  _run(_problem(2, 3, 136, 64, 64, trans_rhs=True), [1, 0, 130, 60, 60, 16], "grouped")


def test_ragged_k():
  # out (G, K, N) = lhs[rows g]^T @ rhs[rows g]: chunks of 64 rows cut by the
  # groups (masked), an empty group's block zero, a one-row group, 29 rows in no
  # group (NaN: never reach the result); K = 128 is one tile of two consumers.
  _run(_problem(1, 4, 200, 128, 64, ragged_contracting=True), [70, 0, 1, 100], "grouped")


@pytest.mark.slow
def test_ragged_k_float32_as_tf32():
  # Both operands transposed by XLA (TF32 reads K-major); chunks are 32 columns.
  p = _problem(1, 3, 100, 128, 64, F32, ragged_contracting=True)
  _run(p, [40, 0, 51], "pipelined", BACKEND.default_config(p, "pipelined"))


@pytest.mark.slow
def test_ragged_k_batch_two_f32_out():
  _run(_problem(2, 3, 136, 128, 64, BF16, F32, ragged_contracting=True),
       [1, 0, 130, 60, 60, 16], "grouped")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["pipelined", "grouped"])
def test_default_configs_on_a_larger_problem(variant):
  p = _problem(1, 5, 520, 192, 192, BF16)
  _run(p, [100, 3, 0, 250, 160], variant, BACKEND.default_config(p, variant))


# ----------------------------------------------------------------- checks

def test_check_refuses_what_the_kernels_do_not_run():
  cfg = TINY["pipelined"]
  # Ragged-K: one kernel for either rung, two consumers of 64-row pieces.
  with pytest.raises(ValueError, match="tile_m=64 must be >= 128"):
    BACKEND.check(_problem(1, 2, 64, 64, 64, ragged_contracting=True), "pipelined", cfg)
  highest = (jax.lax.Precision.HIGHEST,) * 2
  with pytest.raises(NotImplementedError, match="TF32"):
    BACKEND.check(_problem(1, 2, 64, 64, 64, F32, precision=highest), "pipelined", cfg)
  with pytest.raises(NotImplementedError, match="dtype=int8"):
    BACKEND.check(_problem(1, 2, 64, 64, 64, np.int8, F32), "pipelined", cfg)
  with pytest.raises(ValueError, match="tile_k=32 must be >= 64"):
    BACKEND.check(_problem(1, 2, 64, 64, 64), "pipelined",
                  dataclasses.replace(cfg, tile_k=32))
  with pytest.raises(ValueError, match="tile_m=64 must be >= 128"):
    BACKEND.check(_problem(1, 2, 64, 64, 64), "grouped", cfg)
  with pytest.raises(ValueError, match="shared memory"):
    BACKEND.check(_problem(1, 2, 4096, 4096, 4096), "grouped",
                  RaggedDotPallasConfig(tile_m=256, tile_n=256, tile_k=128,
                                        max_concurrent_steps=4))
  with pytest.raises(ValueError, match="one of 64, 128, 192, 256"):
    RaggedDotPallasConfig(tile_m=96)
  with pytest.raises(ValueError, match="power of two"):
    RaggedDotPallasConfig(tile_n=96)
  with pytest.raises(ValueError, match="tile_m=192 must be 128 or 256"):
    BACKEND.check(_problem(1, 2, 64, 64, 64), "grouped",
                  dataclasses.replace(TINY["grouped"], tile_m=192))
  with pytest.raises(ValueError, match="unknown variant"):
    BACKEND.check(_problem(1, 2, 64, 64, 64), "nope", cfg)


def test_default_configs_pass_their_checks():
  for p in (_problem(1, 8, 16384, 4096, 14336), _problem(1, 64, 16384, 2048, 1408),
            _problem(1, 3, 40, 24, 40, BF16, F32), _problem(2, 4, 200, 64, 64, trans_rhs=True),
            _problem(1, 8, 16384, 4096, 14336, ragged_contracting=True),
            _problem(1, 8, 4096, 1024, 2048, F32),
            _problem(1, 8, 4096, 1024, 2048, F32, ragged_contracting=True)):
    for variant in BACKEND.variants:
      BACKEND.check(p, variant, BACKEND.default_config(p, variant))
    BACKEND.check(p, BACKEND.default_variant(p),
                  BACKEND.default_config(p, BACKEND.default_variant(p)))
    for variant, cfg in BACKEND.tuning_candidates(p):
      BACKEND.check(p, variant, cfg)


# ----------------------------------------------------------------- sm_90a lowering

@pytest.mark.parametrize("variant,mode", [("pipelined", "N"), ("pipelined", "T"),
                                          ("pipelined", "N-group-aligned"),
                                          ("pipelined", "N-192"),
                                          ("grouped", "N"), ("grouped", "T"),
                                          ("grouped", "K"), ("pipelined", "F32"),
                                          ("grouped", "F32"), ("grouped", "K-F32")])
def test_lowers_for_the_gpu(variant, mode):
  """Each rung lowers to Mosaic GPU for sm_90a without a GPU: layout and transform
  inference run here, so what the interpreter accepts and the compiler refuses
  (a TMA row offset it cannot prove a multiple of 8, a C width off the 64-wide
  tiling) shows in CI. Lowering is not compiling: PTX and ptxas still need the GPU."""
  p = _problem(1, 5, 1000, 320, 200, F32 if mode.endswith("F32") else BF16,
               trans_rhs=mode == "T", ragged_contracting=mode.startswith("K"))
  config = BACKEND.default_config(p, variant)
  if mode.endswith("group-aligned"):
    config = dataclasses.replace(config, group_aligned=True)
  if mode.endswith("192"):
    config = dataclasses.replace(config, tile_m=192)
  BACKEND.check(p, variant, config)
  f = BACKEND.impl(p, variant, config, "cuda")
  args = (jax.ShapeDtypeStruct(p.lhs_shape, p.dtype), jax.ShapeDtypeStruct(p.rhs_shape, p.dtype),
          jax.ShapeDtypeStruct(p.group_bounds_shape, jnp.int32))
  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
