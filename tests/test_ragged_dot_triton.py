"""The Triton grouped kernels of `ragged_dot`, called through the backend's `impl` directly.

CPU: the kernels run in Triton's interpreter on small problems whose group
sizes exercise the schedule (empty groups, a one-row group, groups cutting
tiles, rows past sum(group_sizes), sums past M), against float64 references.
The op-level contract and the transformations are tests/test_ragged_dot.py's.
Also the sm_90 PTX of the launches (wgmma, cp.async), compiled without a GPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from gemm_testing import (as_f64, assert_gemm_close, ragged_dot_reference,
                          random_array, tolerance)

triton = pytest.importorskip("triton")
from jaxgemm.kernels.triton.ragged_dot import grouped  # noqa: E402
from jaxgemm import ragged_schedule as schedule  # noqa: E402
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem  # noqa: E402
from jaxgemm.ops.ragged_dot.triton import (  # noqa: E402
    RaggedDotTritonConfig, TritonRaggedDot)

BACKEND = TritonRaggedDot()
BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
TINY = RaggedDotTritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)


def _problem(batch, groups, m, k, n, dtype, out_dtype=None, *, trans_rhs=False,
             ragged_contracting=False, precision=None):
  return RaggedDotProblem(batch, groups, m, k, n, np.dtype(dtype),
                          np.dtype(out_dtype or dtype), F32, trans_rhs=trans_rhs,
                          ragged_contracting=ragged_contracting, precision=precision)


def _run(problem, sizes, config=TINY, *, seed=0, nan_outside=False):
  rng = np.random.default_rng(seed)
  lhs = random_array(rng, problem.lhs_shape, problem.dtype)
  rhs = random_array(rng, problem.rhs_shape, problem.dtype)
  group_sizes = np.asarray(sizes, np.int32).reshape(problem.batch, problem.groups)
  ref, bound = ragged_dot_reference(problem, lhs, rhs, group_sizes)
  if nan_outside:   # what the kernel must not read: empty groups' weights, tail rows
    lhs, rhs = np.array(lhs), np.array(rhs)
    for b in range(problem.batch):
      used = min(int(np.maximum(group_sizes[b], 0).sum()), problem.m)
      if problem.ragged_contracting:
        lhs[b, used:] = np.nan
        rhs[b, used:] = np.nan
      else:
        lhs[b, used:] = np.nan
        rhs[b, group_sizes[b] <= 0] = np.nan
  BACKEND.check(problem, "grouped", config)
  out = jax.jit(BACKEND.impl(problem, "grouped", config, "cpu"))(
      jnp.asarray(lhs), jnp.asarray(rhs),
      schedule.group_bounds(jnp.asarray(group_sizes), problem.m))
  assert out.shape == problem.out_shape and out.dtype == problem.out_dtype
  tol = tolerance(problem.dtype, problem.out_dtype,
                  problem.precision[0] if problem.precision else None)
  if ref.any():
    assert_gemm_close(out, ref, bound, tol, problem.describe())
  else:   # no row in any group
    assert not np.asarray(out).any(), f"{problem.describe()}: nonzero output, no group"
  return out


# (batch, groups, m, k, n), group sizes per batch: M, N and K not multiples of
# the 16-wide tiles; empty groups, a one-row group, groups cutting tiles.
RAGGED_M_CASES = [
    pytest.param((2, 4, 45, 40, 24), [[10, 0, 1, 30], [3, 17, 0, 25]], id="cuts-empty-one-row"),
    pytest.param((1, 3, 40, 32, 20), [[5, 0, 12]], id="sum-below-m"),
    pytest.param((1, 3, 40, 24, 16), [[20, 15, 30]], id="sum-above-m"),
    pytest.param((1, 2, 33, 16, 40), [[0, 0]], id="all-empty"),
]


@pytest.mark.parametrize("shape,sizes", RAGGED_M_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=lambda d: d.name)
def test_ragged_m(shape, sizes, dtype):
  _run(_problem(*shape, dtype), sizes)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=lambda d: d.name)
def test_ragged_m_trans_rhs(dtype):
  _run(_problem(2, 4, 45, 40, 24, dtype, trans_rhs=True), [[10, 0, 1, 30], [3, 17, 0, 25]])


def test_ragged_m_fp32_output_and_nan_weights_of_empty_groups_unread():
  out = _run(_problem(1, 4, 48, 32, 24, BF16, F32), [[16, 0, 9, 0]], nan_outside=True)
  assert not np.asarray(out)[:, 25:].any(), "rows past sum(group_sizes) must be zeros"


@pytest.mark.parametrize("precision", [lax.Precision.HIGH, lax.Precision.HIGHEST],
                         ids=["high", "highest"])
def test_ragged_m_fp32_precisions(precision):
  problem = _problem(1, 3, 40, 24, 20, F32, precision=(precision, precision))
  _run(problem, [[7, 0, 30]], BACKEND.default_config(problem, "grouped"))


def test_ragged_m_wide_tile_spans_groups():
  """block_m > every group: each 32-row tile is run by up to four slots."""
  config = RaggedDotTritonConfig(block_m=32, block_n=16, block_k=32, num_warps=4,
                                 num_stages=2, group_m=2)
  _run(_problem(1, 6, 50, 64, 40, F16), [[3, 1, 9, 0, 20, 5]], config)


RAGGED_K_CASES = [
    pytest.param((2, 4, 45, 40, 24), [[10, 0, 1, 30], [3, 17, 0, 25]], id="cuts-empty-one-row"),
    pytest.param((1, 3, 40, 20, 36), [[20, 15, 30]], id="sum-above-m"),
]


@pytest.mark.parametrize("shape,sizes", RAGGED_K_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=lambda d: d.name)
def test_ragged_k(shape, sizes, dtype):
  _run(_problem(*shape, dtype, ragged_contracting=True), sizes)


def test_ragged_k_rows_outside_groups_unread():
  out = _run(_problem(1, 4, 48, 24, 20, F16, ragged_contracting=True), [[10, 0, 1, 12]],
             nan_outside=True)
  assert not np.asarray(out)[0, 1].any(), "an empty group's block must be zeros"


@pytest.mark.parametrize("ragged_contracting", [False, True], ids=["ragged-M", "ragged-K"])
def test_default_config_runs(ragged_contracting):
  problem = _problem(1, 3, 40, 24, 20, BF16, ragged_contracting=ragged_contracting)
  config = BACKEND.default_config(problem, "grouped")
  assert max(config.block_m, config.block_n, config.block_k) <= 64   # clamped: few programs
  _run(problem, [[7, 0, 30]], config)


def test_empty_problem_launches_nothing():
  problem = _problem(1, 2, 0, 16, 16, F32)
  out = BACKEND.impl(problem, "grouped", TINY, "cpu")(
      jnp.zeros(problem.lhs_shape), jnp.ones(problem.rhs_shape), jnp.zeros((1, 2, 2), jnp.int32))
  assert out.shape == (1, 0, 16)


# ------------------------------------------------------------------ configs


def test_check_refuses_unsupported_and_oversized():
  problem = _problem(1, 8, 4096, 4096, 4096, BF16)
  with pytest.raises(NotImplementedError, match="float64"):
    BACKEND.check(_problem(1, 8, 64, 64, 64, np.float64), "grouped", TINY)
  big = RaggedDotTritonConfig(block_m=256, block_n=256, block_k=128, num_stages=4)
  with pytest.raises(ValueError, match="shared memory.*num_stages=4"):
    BACKEND.check(problem, "grouped", big)
  with pytest.raises(ValueError, match="power of two"):
    RaggedDotTritonConfig(block_k=8)


@pytest.mark.parametrize("mode", ["ragged-M", "ragged-K"])
def test_large_problem_configs_fit(mode):
  for shape in [(8, 16384, 4096, 14336), (64, 16384, 2048, 1408), (128, 8192, 7168, 2048)]:
    for dtype in (BF16, F32):
      problem = _problem(1, *shape, dtype, ragged_contracting=mode == "ragged-K")
      for variant, config in BACKEND.tuning_candidates(problem):
        BACKEND.check(problem, variant, config)
        assert config.block_m >= 64


def test_index_64_where_an_operand_matrix_passes_2_31():
  assert not grouped.needs_index_64(_problem(1, 128, 8192, 7168, 2048, BF16))
  assert grouped.needs_index_64(_problem(1, 2, 2**20, 4096, 64, BF16))


# ------------------------------------------------------------------ PTX


@pytest.mark.parametrize("persistent", [False, True], ids=["grid", "persistent"])
@pytest.mark.parametrize("mode", ["ragged-M", "ragged-M-trans", "ragged-K"])
def test_sm90_ptx_has_wgmma_and_cp_async(mode, persistent, monkeypatch):
  from test_triton_ptx import compile_like_jax_triton
  problem = _problem(1, 8, 16384, 4096, 14336, BF16, trans_rhs=mode == "ragged-M-trans",
                     ragged_contracting=mode == "ragged-K")
  config = RaggedDotTritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8,
                                 num_stages=3, persistent=persistent)
  launch = (grouped.ragged_k_launch if problem.ragged_contracting
            else grouped.ragged_m_launch)(problem, config, "cuda")
  ptx = compile_like_jax_triton(launch, [problem.dtype, problem.dtype, np.int32], monkeypatch)
  assert "wgmma.mma_async" in ptx, "no wgmma: the grouped kernel fell off Hopper's MMA"
  cp_async_16 = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async_16 >= 8, f"only {cp_async_16} cp.async in the PTX: specialization lost"


@pytest.mark.parametrize("ragged_contracting", [False, True], ids=["ragged-M", "ragged-K"])
def test_group_bounds_with_rows_before_the_first_group(ragged_contracting):
  """The primitive may pass (B, 2, G) row ranges (a device's share of a sharded call):
  rows before the first group and after the last are in no group."""
  problem = _problem(1, 3, 40, 24, 20, F16, ragged_contracting=ragged_contracting)
  rng = np.random.default_rng(1)
  lhs = random_array(rng, problem.lhs_shape, problem.dtype)
  rhs = random_array(rng, problem.rhs_shape, problem.dtype)
  starts, ends = np.array([5, 12, 12]), np.array([12, 12, 33])
  bounds = jnp.asarray(np.stack([starts, ends])[None], jnp.int32)
  out = jax.jit(BACKEND.impl(problem, "grouped", TINY, "cpu"))(lhs, rhs, bounds)
  a, w = as_f64(lhs)[0], as_f64(rhs)[0]
  if ragged_contracting:
    ref = np.stack([a[s:e].T @ w[s:e] for s, e in zip(starts, ends)])[None]
    bound = np.stack([np.abs(a[s:e]).T @ np.abs(w[s:e]) for s, e in zip(starts, ends)])[None]
  else:
    ref, bound = np.zeros(problem.out_shape), np.zeros(problem.out_shape)
    for g, (s, e) in enumerate(zip(starts, ends)):
      ref[0, s:e], bound[0, s:e] = a[s:e] @ w[g], np.abs(a[s:e]) @ np.abs(w[g])
  assert_gemm_close(out, ref, bound, tolerance(problem.dtype), problem.describe())


PERSISTENT = RaggedDotTritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4,
                                   num_stages=2, persistent=True)


@pytest.mark.parametrize("mode", ["ragged-M", "ragged-M-trans", "ragged-K"])
def test_persistent(mode):
  """The persistent kernels (interpreted: DEFAULT_NUM_SMS programs, most walking
  several items, unused slots and the rows in no group among them)."""
  _run(_problem(2, 4, 45, 40, 24, BF16, trans_rhs=mode == "ragged-M-trans",
                ragged_contracting=mode == "ragged-K"),
       [[10, 0, 1, 30], [3, 17, 0, 20]], PERSISTENT, nan_outside=True)


def test_structural_win_only_where_measured():
  moe = _problem(1, 64, 16384, 2048, 1408, BF16)
  assert BACKEND.structural_win(moe, "NVIDIA H200")
  assert BACKEND.structural_win(moe, "NVIDIA H100 80GB HBM3")
  assert BACKEND.structural_win(moe, "NVIDIA A100") is None
  assert BACKEND.structural_win(_problem(1, 8, 128, 256, 256, BF16), "NVIDIA H200") is None
  assert BACKEND.structural_win(_problem(1, 64, 16384, 2048, 1408, F32), "NVIDIA H200") is None
  wgrad = _problem(1, 64, 16384, 2048, 1408, BF16, ragged_contracting=True)
  assert BACKEND.structural_win(wgrad, "NVIDIA H200") is None
