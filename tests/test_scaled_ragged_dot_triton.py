"""The Triton FP8 grouped kernel of `scaled_ragged_dot`: what is particular to this backend.

CPU: Triton's interpreter runs the kernel itself, through the backend's `impl`, on small
problems: the experts read in place (f16 math) and transposed first (`rhs_k_major`, fp8
math), K steps of 32 inside the 128-wide scale blocks, the rows before the first group of
a device's share (`rows_before_groups`), and nothing read of an empty expert (its weights
and scales NaN) against float64 of the dequantized operands, and the persistent
kernel; the config checks (errors name the field and what is valid) and the tuning
candidates on the issue's MoE shapes; the sm_90 PTX of the heuristic's launches (wgmma
in fp8 or f16, cp.async, the promotion). The op-level contract (every scale kind and
fp8 pairing, routings, jit, vmap) is tests/test_scaled_ragged_dot.py's, which runs this
kernel too.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gemm_testing import as_f64, assert_gemm_close
from test_scaled_ragged_dot import (ACC_TOL, BF16, E4M3, E5M2, F32, LHS_BLOCK, OUT_STEP,
                                    RHS_BLOCK, operand)

pytest.importorskip("triton")
from jaxgemm.gemm import SMEM_CAPACITY_BYTES  # noqa: E402
from jaxgemm.kernels.triton.scaled_ragged_dot import grouped  # noqa: E402
from jaxgemm.ops.scaled_ragged_dot.problem import ScaledRaggedDotProblem  # noqa: E402
from jaxgemm.ops.scaled_ragged_dot.triton import (  # noqa: E402
    ScaledRaggedDotTritonConfig, TritonScaledRaggedDot)

BACKEND = TritonScaledRaggedDot()
SMALL = ScaledRaggedDotTritonConfig(block_m=16, block_n=32, block_k=32, num_warps=4,
                                    num_stages=2)


def _problem(groups, m, k, n, kind="block", *, dtype=E4M3, rhs_dtype=E5M2, out_dtype=F32,
             rows_before_groups=False):
  return ScaledRaggedDotProblem(1, groups, m, k, n, dtype, out_dtype, rhs_dtype, kind,
                                rows_before_groups=rows_before_groups)


def _run(problem, starts, ends, config, rng):
  """The kernel on (B=1) operands whose groups are rows [starts[g], ends[g]), against
  float64; an empty group's weights and scales are NaN (never read)."""
  x, sx, x64 = operand(rng, (problem.m, problem.k), problem.dtype,
                       LHS_BLOCK[problem.scale_kind])
  w, sw, w64 = operand(rng, (problem.groups, problem.k, problem.n), problem.rhs_dtype,
                       RHS_BLOCK[problem.scale_kind])
  empty = np.asarray(ends) <= np.asarray(starts)
  w = jnp.where(empty[:, None, None], jnp.nan, w.astype(F32)).astype(w.dtype)
  if problem.scale_kind != "tensor":
    sw = jnp.where(empty[:, None, None], jnp.nan, sw)
  bounds = jnp.asarray(np.stack([starts, ends])[None], jnp.int32)
  BACKEND.check(problem, "grouped", config)
  canonical = lambda s: s if problem.scale_kind == "tensor" else s[None]
  out = jax.jit(BACKEND.impl(problem, "grouped", config, "cpu"))(
      x[None], w[None], bounds, canonical(sx), canonical(sw))
  assert out.shape == problem.out_shape and out.dtype == problem.out_dtype
  ref, bound = np.zeros(problem.out_shape), np.zeros(problem.out_shape)
  for g, (s, e) in enumerate(zip(starts, ends)):
    if e > s:
      ref[0, s:e], bound[0, s:e] = x64[s:e] @ w64[g], np.abs(x64[s:e]) @ np.abs(w64[g])
  assert_gemm_close(out, ref, bound, OUT_STEP[problem.out_dtype] + ACC_TOL,
                    f"{problem.describe()} {config}")
  return out


# ---------------------------------------------------------------- the kernel


@pytest.mark.parametrize("rhs_k_major", [False, True], ids=["in-place-f16", "k-major-fp8"])
@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
def test_k_steps_inside_scale_blocks_rows_before_groups_and_empty_experts(kind, rhs_k_major,
                                                                          rng):
  """K steps of 32 (four a scale block, K = 200 with a partial last block), N = 72 (a
  partial 128-wide scale column), groups of a device's share: rows before the first
  group and after the last are zeros, an empty expert (NaN weights, NaN scales) unread,
  a group of one row, tiles cut by group ends."""
  problem = _problem(4, 48, 200, 72, kind, rows_before_groups=True)
  out = _run(problem, [5, 12, 12, 13], [12, 12, 13, 41],
             dataclasses.replace(SMALL, rhs_k_major=rhs_k_major), rng)
  assert not np.any(as_f64(out)[0, :5]) and not np.any(as_f64(out)[0, 41:])


@pytest.mark.parametrize("kind", ["row_col", "block"])
def test_persistent(kind, rng):
  """The persistent kernel (interpreted: DEFAULT_NUM_SMS programs, most walking none or
  several items), unused slots and the rows in no group among them: the rows in no
  group are zeros though the last expert, which their items clamp to, is empty and its
  scales NaN."""
  problem = _problem(4, 48, 200, 72, kind)
  out = _run(problem, [0, 9, 10, 30], [9, 10, 30, 30],
             dataclasses.replace(SMALL, persistent=True, rhs_k_major=kind == "block"), rng)
  assert not np.any(as_f64(out)[0, 30:])


def test_bf16_output_rounds_to_nearest(rng):
  """A bfloat16 result rounded as the GPU rounds (the interpreter stores fp32 and XLA
  rounds it: `scaled.stored_dtype`), through the heuristic's config."""
  problem = _problem(2, 24, 128, 64, "tensor", dtype=E5M2, rhs_dtype=E4M3, out_dtype=BF16)
  _run(problem, [0, 9], [9, 24], BACKEND.default_config(problem, "grouped"), rng)


# ---------------------------------------------------------------- configs


def test_check_names_the_field_and_valid_values():
  p = _problem(8, 4096, 1024, 512)
  BACKEND.check(p, "grouped", SMALL)
  with pytest.raises(ValueError, match=r"unknown variant='tiled'.*valid: \['grouped'\]"):
    BACKEND.check(p, "tiled", SMALL)
  for block_k in (16, 256):
    with pytest.raises(ValueError, match=rf"config.block_k={block_k} must be one of "
                                         rf"\[32, 64, 128\]"):
      BACKEND.check(p, "grouped", dataclasses.replace(SMALL, block_k=block_k))
  big = ScaledRaggedDotTritonConfig(block_m=256, block_n=256, block_k=128, num_stages=8)
  with pytest.raises(ValueError, match=rf"shared memory \(num_stages=8 x \(block_m=256 \+ "
                                       rf"block_n=256\) x block_k=128 x 1 B\).*"
                                       rf"{SMEM_CAPACITY_BYTES} available"):
    BACKEND.check(p, "grouped", big)
  with pytest.raises(NotImplementedError, match=r"fp8 operands.*rhs.dtype=bfloat16"):
    BACKEND.check(_problem(8, 64, 128, 128, rhs_dtype=BF16), "grouped", SMALL)
  with pytest.raises(ValueError, match=r"ScaledRaggedDotTritonConfig.block_m=48 is invalid: "
                                       r"it must be a power of two in \[16, 256\]"):
    ScaledRaggedDotTritonConfig(block_m=48)


# The MoE shapes (issue 45): Qwen3-MoE, DeepSeek-V3 at EP 8, the contiguous FP8
# targets, decode; and a small CPU one.
SHAPES = [(128, 16384, 2048, 768), (32, 16384, 7168, 4096), (4, 32768, 7168, 4096),
          (64, 256, 2048, 1408), (5, 40, 300, 200)]


@pytest.mark.parametrize("kind", ["tensor", "block"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "G{}-M{}-K{}-N{}".format(*s))
def test_tuning_candidates_pass_check(shape, kind):
  """Every candidate passes `check`, the heuristic's first, none repeated; both weight
  layouts are among them; the heuristic transposes the weights where experts have
  many rows and reads them in place for decode."""
  problem = _problem(*shape, kind)
  candidates = BACKEND.tuning_candidates(problem)
  assert candidates[0] == ("grouped", BACKEND.default_config(problem, "grouped"))
  assert len(set(candidates)) == len(candidates) >= 2
  for variant, config in candidates:
    BACKEND.check(problem, variant, config)
  assert {c.rhs_k_major for _, c in candidates} == {False, True}
  assert {c.persistent for _, c in candidates} == {False, True}
  groups, m = shape[:2]
  assert candidates[0][1].rhs_k_major == (m // groups > 128), candidates[0]


# ---------------------------------------------------------------- PTX


@pytest.mark.parametrize("persistent", [False, True], ids=["grid", "persistent"])
@pytest.mark.parametrize("shape", [(4, 32768, 7168, 4096), (64, 256, 2048, 1408)],
                         ids=["contiguous", "decode"])
def test_sm90_ptx_of_the_heuristic_launch(shape, persistent, monkeypatch):
  """The heuristic's launch (block scales) compiles for sm_90 to wgmma with both operands
  in the cp.async pipeline (no byte-permute transposes): FP8 wgmma (e4m3 x e5m2) on
  transposed experts (32 cp.async at 128x128x128 in 4 stages, Triton 3.9); f16 wgmma on
  experts read (K, N) in place (64); and one fp32 fma per accumulator element per 128
  of K, the promotion."""
  import re  # noqa: PLC0415
  from test_triton_ptx import compile_like_jax_triton  # noqa: PLC0415
  problem = _problem(*shape)
  config = dataclasses.replace(BACKEND.default_config(problem, "grouped"),
                               persistent=persistent)
  ptx = compile_like_jax_triton(grouped.launch(problem, config, "cuda"),
                                [E4M3, E5M2, np.int32, F32, F32], monkeypatch)
  kind = "e4m3.e5m2" if config.rhs_k_major else "f16.f16"
  assert f"wgmma.mma_async.sync.aligned.m64n{config.block_n}k" in ptx
  assert f".f32.{kind}" in ptx, f"no {kind} wgmma"
  cp_async_16 = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async_16 >= 16, f"only {cp_async_16} cp.async: an operand left the pipeline"
  assert "prmt" not in ptx, "an operand transposed in registers, outside the pipeline"
  per_thread = config.block_m * config.block_n // (32 * config.num_warps)
  promotions = len(re.findall(r"\bfma\.rn\.f32", ptx))
  assert promotions >= per_thread, f"{promotions} fp32 fma for {per_thread} elements"


# ---------------------------------------------------------------- the ragged-K kernel
#
# The weight gradient, out[g] = lhs[rows g]^T @ rhs[rows g] (`scaled_ragged_k_kernel`):
# tests/test_scaled_ragged_dot.py checks its contract through the op (every scale
# layout, routings, jit, vmap); here what the op's heuristic config does not reach.


def _ragged_k_problem(groups, m, k, n, kind="block", **kw):
  return dataclasses.replace(_problem(groups, m, k, n, kind, **kw), ragged_contracting=True)


@pytest.mark.parametrize("kind", ["tensor", "block"])
def test_ragged_k_steps_inside_scale_blocks_and_rows_in_no_group_unread(kind, rng):
  """16x32 output tiles (several along K = 40 and N = 72, partial), 32-row steps (four
  a 128-row scale block), groups starting and ending inside blocks, a device's share
  (rows before the first group), an empty group in the middle; the rows in no group
  hold NaN and are never read (their loads are masked)."""
  problem = _ragged_k_problem(4, 300, 40, 72, kind, rows_before_groups=True)
  starts, ends = [7, 100, 140, 140], [100, 140, 140, 290]
  blocks = {"tensor": None, "block": (128, 1)}[kind]
  a, sa, a64 = operand(rng, (problem.m, problem.k), problem.dtype, blocks)
  b, sb, b64 = operand(rng, (problem.m, problem.n), problem.rhs_dtype, blocks)
  outside = np.ones(problem.m, bool)
  outside[7:290] = False
  nan_rows = lambda x: jnp.where(outside[:, None], jnp.nan, x.astype(F32)).astype(x.dtype)
  a, b = nan_rows(a), nan_rows(b)
  bounds = jnp.asarray(np.stack([starts, ends])[None], jnp.int32)
  BACKEND.check(problem, "grouped", SMALL)
  canonical = lambda s: s if kind == "tensor" else s[None]
  out = jax.jit(BACKEND.impl(problem, "grouped", SMALL, "cpu"))(
      a[None], b[None], bounds, canonical(sa), canonical(sb))
  assert out.shape == problem.out_shape == (1, 4, 40, 72)
  ref, bound = np.zeros(problem.out_shape), np.zeros(problem.out_shape)
  for g, (s, e) in enumerate(zip(starts, ends)):
    ref[0, g], bound[0, g] = a64[s:e].T @ b64[s:e], np.abs(a64[s:e]).T @ np.abs(b64[s:e])
  assert_gemm_close(out, ref, bound, OUT_STEP[F32] + ACC_TOL, problem.describe())
  assert not np.any(as_f64(out)[0, 2]), "the empty group's block is zeros"


def test_ragged_k_check_names_the_field():
  problem = _ragged_k_problem(8, 4096, 1024, 512)
  BACKEND.check(problem, "grouped", SMALL)
  for field in ("rhs_k_major", "persistent"):
    with pytest.raises(ValueError, match=rf"ragged-K kernel takes {field}=False.*"
                                         rf"got {field}=True"):
      BACKEND.check(problem, "grouped", dataclasses.replace(SMALL, **{field: True}))
  with pytest.raises(ValueError, match=r"config.block_k=16 must be one of \[32, 64, 128\]"):
    BACKEND.check(problem, "grouped", dataclasses.replace(SMALL, block_k=16))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "G{}-M{}-K{}-N{}".format(*s))
def test_ragged_k_tuning_candidates_pass_check(shape):
  problem = _ragged_k_problem(*shape)
  candidates = BACKEND.tuning_candidates(problem)
  assert candidates[0] == ("grouped", BACKEND.default_config(problem, "grouped"))
  assert len(set(candidates)) == len(candidates) >= 1
  for variant, config in candidates:
    BACKEND.check(problem, variant, config)
    assert not config.rhs_k_major and not config.persistent


def test_sm90_ptx_of_the_ragged_k_launch(monkeypatch):
  """The ragged-K heuristic launch (block scales, G=128 M=16384 K=2048 N=768) compiles for
  sm_90 to f16 wgmma (both tiles are MN-major: the module docstring) with one fp32 fma
  per accumulator element per 128 rows, the promotion."""
  import re  # noqa: PLC0415
  from test_triton_ptx import compile_like_jax_triton  # noqa: PLC0415
  problem = _ragged_k_problem(*SHAPES[0])
  config = BACKEND.default_config(problem, "grouped")
  ptx = compile_like_jax_triton(grouped.ragged_k_launch(problem, config, "cuda"),
                                [E4M3, E5M2, np.int32, F32, F32], monkeypatch)
  assert "wgmma.mma_async.sync.aligned" in ptx and ".f32.f16.f16" in ptx
  per_thread = config.block_m * config.block_n // (32 * config.num_warps)
  promotions = len(re.findall(r"\bfma\.rn\.f32", ptx))
  assert promotions >= per_thread, f"{promotions} fp32 fma for {per_thread} elements"
