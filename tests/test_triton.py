"""Triton-specific checks; the shared base (test_backends, test_transforms...) covers every rung.

On CPU the kernels run in Triton's interpreter; the `gpu` tests compile them
for the device and read what Triton emitted.
"""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64, assert_gemm_close, dot_general_reference, random_array, tolerance

pytest.importorskip("triton")
from jaxgemm.ops.matmul.triton import TritonMatmul, TritonConfig  # noqa: E402
from jaxgemm.kernels.triton.matmul.tiled import needs_index_64  # noqa: E402
from jaxgemm import GemmProblem  # noqa: E402

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


def _problem(m, n, k, dtype=BF16, batch=1, trans_a=False, trans_b=False, precision=None):
  return GemmProblem(batch, m, n, k, np.dtype(dtype), np.dtype(dtype), F32, trans_a, trans_b,
                     precision)


def _dims(trans_a, trans_b, batched):
  nb = 1 if batched else 0
  batch = ((0,), (0,)) if batched else ((), ())
  return (((nb if trans_a else nb + 1,), (nb + 1 if trans_b else nb,)), batch)


def _operands(rng, m, n, k, dtype, batch, trans_a, trans_b):
  lead = (batch,) if batch > 1 else ()
  a = random_array(rng, lead + ((k, m) if trans_a else (m, k)), dtype)
  b = random_array(rng, lead + ((n, k) if trans_b else (k, n)), dtype)
  return a, b


# ----------------------------------------------------------------- config checks

@pytest.mark.parametrize("variant,config,match", [
    ("tensorcore", TritonConfig(block_m=256, block_n=256, block_k=128, num_stages=4),
     "shared memory"),
    ("persistent", TritonConfig(block_m=128, block_n=256, block_k=32, num_stages=3),
     "for the epilogue"),
    ("tensorcore", TritonConfig(split_k=4), "does not split K"),
    ("tensorcore", TritonConfig(tma=True), "has no TMA path"),
    ("tensorcore", TritonConfig(swap_ab=True), "config.swap_ab must be False"),
    ("pipelined", TritonConfig(block_k=8), "block_k >= 16"),
])
def test_invalid_config_for_the_problem_is_a_clear_error(variant, config, match):
  a, b = jnp.ones((64, 64), jnp.float32), jnp.ones((64, 64), jnp.float32)
  with pytest.raises(ValueError, match=match):
    jaxgemm.matmul(a, b, backend="triton", variant=variant, config=config)


def test_tma_needs_aligned_rows():
  a, b = jnp.ones((8, 9), jnp.bfloat16), jnp.ones((9, 16), jnp.bfloat16)
  with pytest.raises(NotImplementedError, match="16-byte aligned rows: a's rows are 9"):
    jaxgemm.matmul(a, b, backend="triton", variant="persistent", config=TritonConfig(tma=True))


@pytest.mark.parametrize("variant", ["tensorcore", "persistent", "splitk"])
def test_exact_fp32_is_refused_by_tensor_core_rungs(variant):
  a = jnp.ones((16, 16), jnp.float32)
  with pytest.raises(NotImplementedError, match="variant='pipelined'"):
    jaxgemm.matmul(a, a, precision="highest", backend="triton", variant=variant)


def test_config_fields_are_validated():
  with pytest.raises(ValueError, match=r"TritonConfig.block_m=96 is invalid: it must be a power of two"):
    TritonConfig(block_m=96)
  with pytest.raises(ValueError, match=r"epilogue_subtile=3 is invalid: it must be 1 or 2"):
    TritonConfig(epilogue_subtile=3)


@pytest.mark.parametrize("problem,variant", [
    (_problem(4096, 4096, 4096), "persistent"),
    (_problem(16, 8192, 8192), "splitk"),
    (_problem(4096, 4096, 4096, F32), "tensorcore"),
    (_problem(4096, 4096, 4096, F32, precision=(jax.lax.Precision.HIGHEST,) * 2), "pipelined"),
])
def test_default_variant(problem, variant):
  assert _hopper().default_variant(problem) == variant


# ------------------------------------------------------------ the no-record heuristic
# Each case is a measured class of the random suite (the no-record heuristic probe at eda866f, H200),
# on a Hopper GPU's 132 SMs: what `dispatch.choose` sizes for a kernel lowered for "cuda"
# (without a GPU here, `heuristic_num_sms` falls back to the H100/H200's count).

def _hopper():
  backend = TritonMatmul().for_platform("cuda")
  assert backend.num_sms == 132
  return backend


@pytest.mark.parametrize("problem,variant,tile", [
    # Enough 128x256 tiles for the SMs and a long K loop: persistent.
    (_problem(4096, 4096, 4096), "persistent", (128, 256)),
    # Short K: smaller tiles, several per SM, no persistent grid (K=7: 1.62x XLA).
    (_problem(761, 1959, 7), "tensorcore", (64, 64)),
    # Too few tiles even at 64x64 and a long K: split K (r01: 1.23x, r27: 1.38x).
    (_problem(3968, 32, 3968, trans_a=True), "splitk", (64, 32)),
    (_problem(64, 32, 1472, F16, trans_a=True), "splitk", (64, 32)),
    # fp32 (TF32) stays on the tensor-core rung that ran 383 TFLOP/s.
    (_problem(1080, 1857, 669, F32, trans_a=True), "tensorcore", (128, 128)),
])
def test_heuristic_picks_by_waves_of_sms(problem, variant, tile):
  backend = _hopper()
  assert backend.default_variant(problem) == variant
  config = backend.default_config(problem, variant)
  assert (config.block_m, config.block_n) == tile
  backend.check(problem, variant, config)


@pytest.mark.parametrize("problem,align", [
    (_problem(2568, 3724, 12, F16), False),                  # 151 KB of operands
    (_problem(148, 3575, 399, trans_a=True, trans_b=True), True),  # 3 MB, rows of 798 B
    (_problem(24, 16083, 4188, F32, trans_a=True), False),   # fp32 B N-major, M = 24
    (_problem(1080, 1857, 669, F32, trans_a=True), True),    # fp32, M and N > 32
])
def test_heuristic_aligns_operands_where_the_pass_pays(problem, align):
  backend = _hopper()
  assert backend.default_config(problem, backend.default_variant(problem)).align_operands == align


@pytest.mark.parametrize("problem,win", [
    (_problem(1080, 1857, 669, F32, trans_a=True), "unaligned rows"),
    (_problem(4095, 4093, 4097), "unaligned rows"),
    (_problem(1327, 853, 7, F16, trans_a=True, trans_b=True), "one K step"),
    (_problem(4096, 4096, 4096), None),                  # aligned: XLA's ground
    (_problem(6016, 32, 64, F16), "one K step"),         # r37: 192512 outputs, 1.85x XLA
    (_problem(11, 8, 7, F16), None),                     # 88 outputs: a microsecond either way
    (_problem(317, 461, 33, trans_b=True), None),        # r12: 146137 outputs, 0.85x XLA
    (_problem(430, 357, 26, F16, trans_a=True, trans_b=True), None),  # holdout r17: 0.93x
    (_problem(6, 256, 3484, F32, trans_a=True), None),   # unaligned, but a GEMV (M <= 16)
    (_problem(300, 8, 4, F32), None),                    # one K step, but fp32
])
def test_structural_wins_on_hopper_only(problem, win):
  backend = _hopper()
  reason = backend.structural_win(problem, "NVIDIA H200")
  assert (reason is None) if win is None else (win in reason)
  assert backend.structural_win(problem, "cpu") is None
  assert backend.structural_win(problem, "NVIDIA A100-SXM4-80GB") is None


@pytest.mark.parametrize("problem,gpu,cpu", [
    # (variant, block_m, block_n, split_k) on 132 SMs, and in the CPU interpreter (none)
    (_problem(65, 129, 33), ("tensorcore", 64, 64, 1), ("tensorcore", 128, 256, 1)),
    (_problem(761, 1959, 7), ("tensorcore", 64, 64, 1), ("tensorcore", 128, 256, 1)),
    (_problem(64, 32, 1472, F16, trans_a=True), ("splitk", 64, 32, 2),
     ("tensorcore", 64, 32, 1)),
])
def test_heuristic_sizes_tiles_for_the_platform_that_runs_the_kernel(monkeypatch, problem,
                                                                     gpu, cpu):
  """The interpreter runs a grid's programs one after another: the largest tile and no
  split K there, tiles for 132 SMs on the GPU, from the same `dispatch.choose`."""
  from jaxgemm import dispatch  # noqa: PLC0415
  monkeypatch.setattr(dispatch, "device_kind", lambda platform=None: "cpu")
  for platform, want in (("cuda", gpu), ("cpu", cpu)):
    c = dispatch.choose(problem, "triton", platform=platform)
    assert (c.variant, c.config.block_m, c.config.block_n, c.config.split_k) == want, platform
  assert TritonMatmul().num_sms == 0     # jax's default device here is the CPU


def test_auto_takes_a_structural_win_only_without_records(monkeypatch):
  """auto runs the heuristic kernel where Triton names a structural win and no
  record exists; a record where XLA won keeps XLA."""
  from jaxgemm import dispatch, tuning_cache  # noqa: PLC0415
  monkeypatch.setattr(dispatch, "device_kind", lambda platform=None: "NVIDIA H200")
  monkeypatch.setattr(tuning_cache, "lookup", lambda *a, **k: [])
  win = _problem(1327, 853, 7, F16, trans_a=True, trans_b=True)
  choice = dispatch.choose(win, "auto")
  assert (choice.backend, choice.source) == ("triton", "heuristic")
  assert dispatch.choose(_problem(4096, 4096, 4096), "auto").backend == "xla"
  xla_won = tuning_cache.Tuned("xla", "dot_general", {}, time_ms=1.0, xla_time_ms=1.0,
                               shape="1x1327x853x7", source="table")
  monkeypatch.setattr(tuning_cache, "lookup", lambda *a, **k: [xla_won])
  assert dispatch.choose(win, "auto").backend == "xla"


def test_index_64_switches_on_at_2_to_the_31_elements():
  assert not needs_index_64(_problem(2**15, 2**15, 2**15 - 1))
  assert needs_index_64(_problem(2**16, 64, 2**15))          # A has 2^31 elements
  assert needs_index_64(_problem(64, 64, 64, batch=2**19))   # batched C


# ------------------------------------------------------------ kernel paths on CPU

SPLIT_CASES = [  # (m, n, k, split_k): K slices that are ragged, empty and uneven
    (17, 40, 300, 2), (5, 33, 129, 3), (64, 16, 64, 4),
]


@pytest.mark.parametrize("m,n,k,split_k", SPLIT_CASES)
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_split_k_slices_sum_to_the_product(m, n, k, split_k, dtype, rng):
  a, b = _operands(rng, m, n, k, dtype, 2, False, True)
  config = TritonConfig(block_m=16, block_n=16, block_k=16, split_k=split_k, num_stages=2)
  out = jaxgemm.dot_general(a, b, _dims(False, True, True), backend="triton",
                            variant="splitk", config=config)
  ref, bound = dot_general_reference(a, b, _dims(False, True, True))
  assert_gemm_close(out, ref, bound, tolerance(dtype))
  again = jaxgemm.dot_general(a, b, _dims(False, True, True), backend="triton",
                              variant="splitk", config=config)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(again))  # deterministic


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
@pytest.mark.parametrize("tma,subtile", [(False, 1), (False, 2), (True, 2)])
def test_persistent_paths(trans_a, trans_b, tma, subtile, rng):
  """Pointer and TMA loads, whole and split epilogues, ragged tiles, batches."""
  m, n, k = 40, 48, 56  # 16-byte rows in bf16 (TMA), ragged against 32-wide tiles
  a, b = _operands(rng, m, n, k, BF16, 3, trans_a, trans_b)
  config = TritonConfig(block_m=32, block_n=32, block_k=16, epilogue_subtile=subtile, tma=tma)
  dims = _dims(trans_a, trans_b, True)
  out = jaxgemm.dot_general(a, b, dims, backend="triton", variant="persistent", config=config)
  ref, bound = dot_general_reference(a, b, dims)
  assert_gemm_close(out, ref, bound, tolerance(BF16))


@pytest.mark.parametrize("dtype,trans_a,trans_b", [
    (F32, False, False),   # B transposed to K-major for TF32
    (F32, True, False),    # A and B transposed
    (BF16, False, False),  # K=33: rows padded to 16 bytes
    (BF16, True, True),
])
def test_tensor_core_layout_preparation(dtype, trans_a, trans_b, rng):
  m, n, k = 23, 37, 33
  a, b = _operands(rng, m, n, k, dtype, 2, trans_a, trans_b)
  dims = _dims(trans_a, trans_b, True)
  out = jaxgemm.dot_general(a, b, dims, backend="triton", variant="tensorcore")
  assert out.shape == (2, m, n)
  ref, bound = dot_general_reference(a, b, dims)
  assert_gemm_close(out, ref, bound, tolerance(dtype))


def test_interpreted_bf16_is_the_exact_product(rng):
  """The interpreter does arithmetic on bf16's raw bits unless tiles are upcast
  (triton_call.py); with the upcast, an fp32 result is the float64 product of
  the bf16 operands up to fp32 accumulation (without it: relative error ~1e10)."""
  a, b = _operands(rng, 33, 65, 129, BF16, 1, False, False)
  out = jaxgemm.matmul(a, b, preferred_element_type=jnp.float32, backend="triton",
                       variant="tensorcore")
  ref = as_f64(a) @ as_f64(b)
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------ on the GPU

@pytest.mark.gpu
def test_gpu_compiled_kernels_use_wgmma(tmp_path, monkeypatch):
  """What jax-triton actually compiled on the device: wgmma and cp.async."""
  from jax_triton import triton_lib  # noqa: PLC0415
  monkeypatch.setattr(triton_lib, "_JAX_TRITON_DUMP_DIR", str(tmp_path))
  rng = np.random.default_rng(0)
  a, b = _operands(rng, 512, 512, 512, BF16, 1, False, False)
  for variant in ("tensorcore", "persistent"):
    jax.block_until_ready(jaxgemm.matmul(a, b, backend="triton", variant=variant))
  ptx = [open(p).read() for p in glob.glob(os.path.join(tmp_path, "*", "*.ptx"))]
  assert len(ptx) >= 2, "jax-triton dumped no PTX"
  for text in ptx:
    assert "wgmma.mma_async" in text
    assert "cp.async" in text


@pytest.mark.gpu
def test_gpu_more_than_2_to_the_31_elements():
  """int64 index math: A has 2^31 + 2^21 elements (4.3 GB of bf16)."""
  m, k, n = 2**20 + 1024, 2048, 64
  a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
  out = jaxgemm.matmul(a, b, backend="triton", variant="tensorcore")
  rows = np.r_[0:4, m - 4:m]   # the last rows are those a wrapped int32 offset would corrupt
  ref = as_f64(a[rows]) @ as_f64(b)
  got = np.asarray(out[rows], np.float64)
  assert np.linalg.norm(got - ref) <= 1e-2 * np.linalg.norm(ref)
