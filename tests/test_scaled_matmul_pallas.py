"""The pallas backend of scaled_matmul: its checks, heuristic, promotion and cuda lowering.

tests/test_scaled_matmul.py runs the kernel (in the Mosaic GPU interpreter on
the CPU) through every case of the op; here what is the backend's own:

* `check` refuses what the kernel cannot run, naming the argument and what is valid;
* every default config is valid for large problems in every layout;
* the promotion: each K step's wgmma starts from a zero accumulator (one 128-wide
  scale block), and with the interpreter's wgmma made to keep 14 bits as Hopper's
  FP8 tensor cores do, the result stays within fp32-level error at K = 16384;
* the kernel lowers for cuda (Mosaic GPU's own checks: fp8 wgmma operands
  K-major, layout inference) on the CPU, under the local jax;
* the same for variant warp_specialized_tma_scales (block scales through the TMA
  ring, K steps in overlapped pairs; the default for block scales);
* on a GPU (`gpu` marker), large problems against float64.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64, assert_gemm_close
from jaxgemm import registry
from jaxgemm.ops.matmul.pallas import PallasConfig
from jaxgemm.ops.scaled_matmul import pallas as scaled_pallas
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem
from test_scaled_matmul import (A_BLOCK, ACC_TOL, B_BLOCK, BF16, E4M3, E5M2, F16, F32, check,
                                operands, reference)

pytestmark = pytest.mark.skipif(
    registry.why_unavailable(registry.get_backend("pallas", "scaled_matmul")) is not None,
    reason="Mosaic GPU is not importable")

BACKEND = registry.get_backend("pallas", "scaled_matmul")
VARIANT = "warp_specialized"
TMA = scaled_pallas.TMA_SCALES   # block scales only
# The shapes, MxKxN.
LARGE = [(8192, 8192, 8192), (8192, 4096, 14336), (128, 4096, 14336)]
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]


def problem(m, k, n, *, a=E4M3, b=E4M3, out=BF16, kind="block", trans_a=False, trans_b=False,
            batch=1):
  return ScaledMatmulProblem(batch, m, n, k, a, out, F32, trans_a, trans_b, None, b_dtype=b,
                             scale_kind=kind)


# ---------------------------------------------------------------- check and heuristic


GOOD = PallasConfig(tile_m=128, tile_n=128, tile_k=128, max_concurrent_steps=4, epi_tile_n=64)


@pytest.mark.parametrize("variant,change,error,match", [(VARIANT, *c) for c in [
    (dict(tile_k=64), ValueError, r"tile_k=64 must be 128"),
    (dict(tile_m=64), ValueError, r"tile_m=64 must be 128 or 256"),
    (dict(tile_m=256, tile_n=128), ValueError, r"tile_m=256, tile_n=128 need more than 192 "
                                               r"registers.*128x192, 128x128, 256x64"),
    (dict(tile_n=192), ValueError, r"variant='warp_specialized' with block scales takes "
                                   r"tile_n dividing 128.*tile_n=192.*tma_scales"),
    (dict(tile_n=128, epi_tile_n=256), None, None),
    (dict(tile_n=64, epi_tile_n=32), None, None),
    (dict(cluster_n=2), None, None),
    (dict(cluster_m=2), None, None),
    (dict(cluster_m=2, cluster_n=2), ValueError, r"at most one of cluster_m=2, cluster_n=2"),
    (dict(split_rounds=2), ValueError, r"split_rounds=2 must be 1"),
    (dict(max_concurrent_steps=8), ValueError, r"needs 294912 bytes of shared memory "
                                               r"\(a=131072 \+ b=131072 \+ out=32768\)"),
]] + [(TMA, *c) for c in [
    (dict(), None, None),
    (dict(tile_n=64), None, None),
    (dict(tile_m=256, tile_n=64), None, None),
    (dict(tile_n=192), None, None),                 # three 64-column runs of one scale
    (dict(tile_n=192, epi_tile_n=32), None, None),
    (dict(tile_n=192, epi_tile_n=128), ValueError, r"stores a tile_n=192 tile by 64-column "
                                                   r"runs.*epi_tile_n=128 must divide 64"),
    # Each ring slot holds the step's scales too: 128 + 4 floats in two buffers
    # aligned to 1 KiB; the ring's 16 barriers counted.
    (dict(max_concurrent_steps=8), ValueError, r"needs 300160 bytes of shared memory "
                                               r"\(a=131072 \+ b=131072 \+ out=32768 \+ "
                                               r"scales=5120 \+ barriers=128\)"),
]])
def test_check_names_the_argument(variant, change, error, match):
  config = dataclasses.replace(GOOD, **change)
  p = problem(1024, 1024, 1024)
  if error is None:
    BACKEND.check(p, variant, config)
    return
  with pytest.raises(error, match=match):
    BACKEND.check(p, variant, config)


def test_check_refuses_other_dtypes_variants_and_configs():
  p = problem(256, 256, 256)
  with pytest.raises(ValueError, match=r"unknown variant='clusters'.*\['warp_specialized', "
                                       r"'warp_specialized_tma_scales'\]"):
    BACKEND.check(p, "clusters", GOOD)
  for kind in ("tensor", "row_col"):   # the TMA-scales variant: block scales only
    with pytest.raises(NotImplementedError, match=rf"variant='warp_specialized_tma_scales' "
                                                  rf"takes block scales only.*{kind}"):
      BACKEND.check(problem(256, 256, 256, kind=kind), TMA, GOOD)
  xla_config = registry.get_backend("xla", "scaled_matmul").default_config(p, "dot_general")
  with pytest.raises(TypeError, match="takes a PallasConfig; got XlaConfig"):
    BACKEND.check(p, VARIANT, xla_config)
  bf = dataclasses.replace(p, dtype=np.dtype(jnp.bfloat16))
  with pytest.raises(NotImplementedError, match=r"takes fp8 operands.*got a.dtype=bfloat16"):
    BACKEND.check(bf, VARIANT, GOOD)
  with pytest.raises(NotImplementedError, match=r"got b.dtype=float16"):
    BACKEND.check(dataclasses.replace(p, b_dtype=F16), VARIANT, GOOD)
  with pytest.raises(NotImplementedError, match=r"got out_dtype=float8_e4m3fn"):
    BACKEND.check(dataclasses.replace(p, out_dtype=E4M3), VARIANT, GOOD)
  # A mixed pair runs as float16: 64 KiB a stage at 128x128, so 4 stages do not fit.
  mixed = problem(256, 256, 256, b=E5M2)
  with pytest.raises(ValueError, match=r"float16 operands in SMEM\) needs 294912 bytes"):
    BACKEND.check(mixed, VARIANT, GOOD)


@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
@pytest.mark.parametrize("m,k,n", LARGE)
def test_default_configs_are_valid_for_large_problems(m, k, n, trans_a, trans_b):
  """Every scale kind, dtype pair and out dtype: the default config passes `check`,
  with 128-deep K steps, 128x128 tiles (64-wide N for M <= 128; 128x192 for one
  fp8 dtype where the rounds of tiles favour it, as at these M >= 8192 shapes,
  except block scales read from GMEM) and the deepest ring that fits."""
  for variant, kind in [(VARIANT, "tensor"), (VARIANT, "row_col"), (VARIANT, "block"),
                        (TMA, "block")]:
    for a, b in ((E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2)):
      for out in (BF16, F16, F32):
        p = problem(m, k, n, a=a, b=b, out=out, kind=kind, trans_a=trans_a, trans_b=trans_b)
        config = BACKEND.default_config(p, variant)
        BACKEND.check(p, variant, config)
        assert config.tile_k == 128 and config.tile_m == 128
        wide = variant == TMA or kind != "block" if a == b else False
        assert config.tile_n == (64 if m <= 128 else 192 if wide else 128)
        if config.max_concurrent_steps < 8:   # the ring is as deep as shared memory allows
          deeper = dataclasses.replace(config,
                                       max_concurrent_steps=config.max_concurrent_steps + 1)
          with pytest.raises(ValueError, match="shared memory"):
            BACKEND.check(p, variant, deeper)
      # Block scales default to the TMA-scales variant (1.4-1.6x on the H200), the
      # other kinds to the one that takes them.
      assert BACKEND.default_variant(p) == (TMA if kind == "block" else VARIANT)
  # fp8 128x128 with a bf16 epilogue: 6 stages; 128x192: 40 KiB a stage, 4 stages,
  # with the TMA scales' 512 + 768 bytes a slot too.
  p = problem(m, k, n, trans_a=trans_a, trans_b=trans_b)
  if m > 128:
    assert BACKEND.default_config(p, VARIANT).max_concurrent_steps == 6
    assert BACKEND.default_config(p, TMA).max_concurrent_steps == 4
    per_tensor = dataclasses.replace(p, scale_kind="tensor")
    assert BACKEND.default_config(per_tensor, VARIANT).max_concurrent_steps == 4


def test_auto_takes_the_kernel_where_it_was_measured_to_win():
  """From 4096 rows and columns on Hopper, block or per-tensor scales; not a mixed
  pair (run as float16), not another device kind (structural_win's measurement)."""
  h100 = "NVIDIA H100 80GB HBM3"
  assert BACKEND.structural_win(problem(8192, 8192, 8192, kind="tensor", trans_b=True), h100)
  assert BACKEND.structural_win(problem(4096, 4096, 4096, kind="block"), "NVIDIA H200")
  assert BACKEND.structural_win(problem(1024, 8192, 8192, kind="tensor"), h100) is None
  assert BACKEND.structural_win(problem(8192, 8192, 8192), "NVIDIA A100-SXM4-80GB") is None
  assert BACKEND.structural_win(problem(8192, 8192, 8192, b=E5M2), h100) is None
  # Triton takes what Pallas leaves on Hopper (kernel_win: one table for both).
  triton = registry.get_backend("triton", "scaled_matmul")
  assert triton.structural_win(problem(1024, 8192, 8192, kind="tensor"), h100)
  assert triton.structural_win(problem(8192, 8192, 8192, b=E5M2, kind="block"), h100)
  # a mixed pair with per-tensor scales (dgrad, wgrad): XLA's program won on the H200
  assert triton.structural_win(problem(8192, 8192, 8192, b=E5M2, kind="tensor"), h100) is None
  assert triton.structural_win(problem(8192, 8192, 8192), h100) is None
  assert triton.structural_win(problem(128, 4096, 512), "cpu") is None


def test_pre_pass_relays_only_what_wgmma_cannot_read():
  """K-major fp8 passes untouched; other layouts are transposed, mixed pairs cast to
  float16 (exact for both fp8 formats)."""
  a = jnp.asarray(np.arange(12).reshape(1, 3, 4), E4M3)
  b = jnp.asarray(np.arange(20).reshape(1, 5, 4), E4M3)
  p = problem(3, 4, 5, trans_b=True)
  a2, b2 = scaled_pallas.k_major_operands(p, a, b)
  assert a2 is a and b2 is b
  p = problem(4, 3, 4, trans_a=True)   # a stored (K, M) = (3, 4), b stored (K, N) = (3, 4)
  a2, b2 = scaled_pallas.k_major_operands(p, a, jnp.swapaxes(b[:, :4, :3], 1, 2))
  assert a2.shape == (1, 4, 3) and b2.shape == (1, 4, 3)
  mixed = problem(3, 4, 5, b=E5M2, trans_b=True)
  values = np.array([448, -448, 2.0**-9, 0.875, -3.5], np.float32)
  q4 = jnp.asarray(values, E4M3)
  q5 = jnp.asarray(np.array([57344, -2.0**-16, 1.5, 3.0, 0.0], np.float32), E5M2)
  a2, b2 = scaled_pallas.k_major_operands(mixed, q4[None, None], q5[None, None])
  assert a2.dtype == b2.dtype == np.float16
  np.testing.assert_array_equal(as_f64(a2)[0, 0], as_f64(q4))
  np.testing.assert_array_equal(as_f64(b2)[0, 0], as_f64(q5))


# ---------------------------------------------------------------- the promotion


@contextlib.contextmanager
def fp8_accumulator(mantissa_bits: int = 13):
  """The interpreter's wgmma made to keep `mantissa_bits` fraction bits (14
  significant, truncated) in its accumulator, as Hopper's FP8 tensor cores do;
  yields the list of whether each wgmma found its accumulator zero."""
  try:
    from jax._src.pallas.mosaic.interpret import utils as iutils
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks as gc
    from jaxgemm.kernels.pallas import common
  except ImportError as e:
    pytest.skip(f"no Mosaic GPU interpreter internals to patch: {e}")
  common.interpret_params()   # the project's own patch first, so we wrap it
  # A kernel traced before (the shared tests run the same call) would keep the
  # unpatched callback: trace afresh.
  jax.clear_caches()
  inner = gc.wgmma
  drop = np.uint32((1 << (23 - mantissa_bits)) - 1)
  started_at_zero = []

  def acc_content(kw):
    mem = gc._get_shared_memory()
    tid = mem.get_global_thread_id(int(kw["device_id"]), int(kw["thread_id"]))
    key = gc.HostAllocationKey.from_array(kw["acc_allocation_key_as_array"])
    transforms = jax.tree.map(int, gc._remove_noop_transforms(kw["acc_transforms"]))
    rnge = iutils.to_range(transforms)
    val, _, _ = mem.get_buffer_content(key, rnge, tid)
    return mem, key, rnge, tid, np.asarray(val, np.float32)

  def wgmma(**kw):
    started_at_zero.append(not np.any(acc_content(kw)[-1]))
    token = inner(**kw)
    mem, key, rnge, tid, val = acc_content(kw)
    truncated = (val.view(np.uint32) & ~drop).view(np.float32)
    mem.store_buffer_content(key, rnge, truncated, tid)
    return token

  gc.wgmma = wgmma
  try:
    yield started_at_zero
  finally:
    gc.wgmma = inner
    jax.clear_caches()   # nor may a later call reuse the patched one


@pytest.mark.parametrize("kind,variant", [("tensor", VARIANT), ("block", VARIANT),
                                          ("block", TMA)])
def test_each_k_block_is_promoted_to_fp32(kind, variant, rng):
  """K = 16320 (128 blocks, the last partial) with a 14-bit wgmma accumulator: every
  wgmma starts from zero, and the error stays within ACC_TOL of |A| @ |B|. With
  per-tensor scales, the same 14-bit accumulator carried across all blocks (what no
  promotion would give; block scales cannot even be applied so) errs several
  times more: the emulation is strong enough to tell. The TMA-scales variant
  (steps in pairs, the second's wgmma issued before the first's promotion)
  promotes every 128 of K the same."""
  m, k, n = 16, 16384 - 64, 24
  a, sa, a64 = operands(rng, (m, k), E4M3, A_BLOCK[kind], spread=False)
  b, sb, b64 = operands(rng, (k, n), E4M3, B_BLOCK[kind], spread=False)
  ref, bound = reference(a64, b64)
  with fp8_accumulator() as started_at_zero:
    out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, trans_b=False, backend="pallas",
                                variant=variant)
    out = np.asarray(out)
  assert len(started_at_zero) == 2 * 128 and all(started_at_zero)   # 2 consumers x 128 blocks
  assert_gemm_close(out, ref, bound, ACC_TOL, f"promoted, {kind}")
  if kind != "tensor":
    return
  promoted = float(np.max(np.abs(as_f64(out) - ref) / bound))
  # The unpromoted control in numpy: one 14-bit accumulator over every block.
  a8, b8 = as_f64(a).astype(np.float32), as_f64(b).astype(np.float32)
  drop = np.uint32((1 << 10) - 1)
  acc = np.zeros((m, n), np.float32)
  for kb in range(0, k, 128):
    acc = ((acc + a8[:, kb:kb + 128] @ b8[kb:kb + 128]).view(np.uint32) & ~drop).view(np.float32)
  unpromoted = float(np.max(np.abs(acc * float(sa) * float(sb) - ref) / bound))
  assert unpromoted > 4 * promoted, (unpromoted, promoted)


# ---------------------------------------------------------------- cuda lowering


def _lowers_for_cuda(p, config=None, variant=VARIANT):
  config = config or BACKEND.default_config(p, variant)
  BACKEND.check(p, variant, config)
  sds = jax.ShapeDtypeStruct
  args = [sds(p.a_shape, p.dtype), sds(p.b_shape, p.b_dtype), sds(p.a_scale_shape, F32),
          sds(p.b_scale_shape, F32)]
  fn = BACKEND.impl(p, variant, config, "cuda")
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("kind,m,k,n,b,out,trans_a,trans_b", [
    ("block", 256, 512, 256, E4M3, BF16, False, True),
    ("row_col", 256, 512, 384, E5M2, F32, False, False),
    ("tensor", 128, 384, 256, E4M3, F16, True, False),
    ("block", 256, 384, 256, E5M2, BF16, True, True),       # mixed: float16 wgmma
    ("block", 4095, 4097, 4093, E4M3, BF16, False, True),  # exact stores, ragged K
    ("block", 128, 1024, 512, E4M3, BF16, False, True),    # skinny: 128x64 tiles
    ("tensor", 8192, 8192, 8192, E4M3, BF16, False, True),  # 128x192 tiles
    ("block", 8192, 8192, 8192, E4M3, BF16, False, False),  # 2-CTA clusters
])
def test_lowers_for_cuda(kind, m, k, n, b, out, trans_a, trans_b):
  """Mosaic GPU lowers the kernel for sm_90 here, with its checks (fp8 wgmma only
  K-major, one operand dtype, layout inference of the scale vectors' loads).
  (Shapes whose exact-store windows are narrower than a tile, e.g. 300x260x300,
  fail layout inference under jax 0.10.2 for the matmul's rung 3 too.)"""
  _lowers_for_cuda(problem(m, k, n, b=b, out=out, kind=kind, trans_a=trans_a,
                           trans_b=trans_b))


def test_lowers_for_cuda_with_256x64_tiles():
  p = problem(1024, 1024, 1024, kind="block", trans_b=True)
  candidates = BACKEND.tuning_candidates(p)
  assert [(c.tile_m, c.tile_n) for _, c in candidates] == [
      (128, 128), (256, 64), (128, 128), (128, 192), (128, 128), (128, 128)]
  # block scales: the TMA-scales default's five (the last with clusters), then the
  # GMEM-scales variant's default
  assert [v for v, _ in candidates] == [TMA] * 5 + [VARIANT]
  assert [c.cluster_n for _, c in candidates] == [1, 1, 1, 1, 2, 1]
  per_tensor = BACKEND.tuning_candidates(dataclasses.replace(p, scale_kind="tensor"))
  assert [c.tile_n for _, c in per_tensor] == [128, 64, 128, 192]
  wide = candidates[1][1]
  assert wide.max_concurrent_steps == 4   # 40 KiB a stage: 4 fit beside the epilogue
  _lowers_for_cuda(p, wide)
  _lowers_for_cuda(p, fit_tma(p, wide), TMA)


def test_default_tiles_and_clusters_follow_the_rounds_of_tiles():
  """Per tensor, 128x192 where fewer persistent rounds pay for its 1.34x tile time
  (8192^3: 21 rounds of 2752 tiles against 32 of 4096) and 128x128 where they do not
  (4096^3: 6 rounds of 704 against 8 of 1024). Block scales, 1.30x: 128x192 at
  4096^3 too (7.8 < 8), with 2-CTA clusters along M from 512 tiles; on 128x128 tiles
  along N from 2048."""
  def default(m, k, n, kind):
    p = problem(m, k, n, kind=kind, trans_b=True)
    config = BACKEND.default_config(p, BACKEND.default_variant(p))
    BACKEND.check(p, BACKEND.default_variant(p), config)
    return config.tile_n, config.cluster_m, config.cluster_n
  assert default(8192, 8192, 8192, "tensor") == (192, 1, 1)
  assert default(8192, 4096, 14336, "row_col") == (192, 1, 1)
  assert default(4096, 4096, 4096, "tensor") == (128, 1, 1)
  assert default(128, 4096, 14336, "tensor") == (64, 1, 1)
  assert default(8192, 8192, 8192, "block") == (192, 2, 1)
  assert default(4096, 4096, 4096, "block") == (192, 2, 1)
  assert default(2048, 4096, 2048, "block") == (128, 1, 1)    # 2 rounds either way
  assert default(262144, 256, 128, "block") == (128, 1, 2)    # 2048 tiles either way
  # block scales read from GMEM keep 128-wide tiles (a third array for the scales)
  gmem = problem(8192, 8192, 8192, kind="block")
  assert BACKEND.default_config(gmem, VARIANT).tile_n == 128
  # a mixed pair runs float16 wgmma: its 2-byte stages keep 128-wide tiles
  mixed = problem(8192, 8192, 8192, kind="tensor", b=E5M2)
  assert BACKEND.default_config(mixed, VARIANT).tile_n == 128


@pytest.mark.parametrize("kind,variant,m,k,n,change", [
    ("tensor", VARIANT, 200, 300, 400, dict(tile_n=192)),                  # 2 x 3 tiles
    ("tensor", VARIANT, 200, 300, 400, dict(tile_n=192, cluster_m=2)),
    ("row_col", VARIANT, 300, 260, 200, dict(cluster_n=2)),                # odd along N
    ("block", TMA, 300, 260, 200, dict(cluster_m=2)),                      # odd along M
    # block scales on 192-wide tiles: tile 0 crosses a column block at 128, tile 1 at 64
    ("block", TMA, 200, 300, 400, dict(tile_n=192)),
    ("block", TMA, 130, 260, 900, dict(tile_n=192, cluster_n=2)),          # 5 (odd) along N
])
def test_wide_tiles_and_clusters_in_the_interpreter(kind, variant, m, k, n, change, rng):
  """128x192 tiles and 2-CTA clusters with ragged edges, against float64: the
  cluster's tile walk, and its second CTA past an odd tile count storing nothing
  (each CTA loads its own copy of the shared tile here; multicast is the GPU's)."""
  a, sa, a64 = operands(rng, (m, k), E4M3, A_BLOCK[kind], spread=False)
  b, sb, b64 = operands(rng, (k, n), E4M3, B_BLOCK[kind], spread=False)
  p = problem(m, k, n, kind=kind, out=F32)
  config = scaled_pallas.fit_stages(
      p, dataclasses.replace(BACKEND.default_config(p, variant), **change), variant)
  BACKEND.check(p, variant, config)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, backend="pallas", variant=variant,
                              config=config)
  check(out, *reference(a64, b64), F32)


def fit_tma(p, config):
  return scaled_pallas.fit_stages(p, config, TMA)


@pytest.mark.parametrize("m,k,n,b,trans_b,overlap", [
    (8192, 8192, 8192, E4M3, True, True),      # the shapes
    (128, 4096, 14336, E4M3, True, True),      # skinny: 128x64 tiles
    (8192, 4096, 14336, E4M3, False, True),
    (4095, 4097, 4093, E4M3, True, True),      # exact stores, ragged K: 33 steps (odd)
    (256, 384, 256, E5M2, True, True),         # mixed: float16 wgmma; 3 steps
    (8192, 8192, 8192, E4M3, True, False),     # the TMA scales without the pairs
])
def test_lowers_for_cuda_tma_scales(m, k, n, b, trans_b, overlap, monkeypatch):
  """The TMA-scales variant lowers for sm_90 (Mosaic GPU's layout inference of the
  scale vectors' SMEM loads, the 1-D TMA copies, the paired accumulators)."""
  from jaxgemm.kernels.pallas.scaled_matmul import scaled  # noqa: PLC0415
  monkeypatch.setattr(scaled, "OVERLAP_PROMOTION", overlap)
  _lowers_for_cuda(problem(m, k, n, b=b, trans_b=trans_b), variant=TMA)


@pytest.mark.parametrize("cluster_m,cluster_n", [(1, 1), (2, 1), (1, 2)])
def test_lowers_for_cuda_tma_scales_on_192_wide_tiles(cluster_m, cluster_n):
  """Block scales on 128x192 tiles: three (64, 64) sums a consumer, one b_scale
  value each, and the K steps one at a time (a pair's third array would not fit)."""
  p = problem(8192, 8192, 8192, trans_b=True)
  config = dataclasses.replace(BACKEND.default_config(p, TMA), tile_n=192, cluster_m=cluster_m,
                               cluster_n=cluster_n)
  _lowers_for_cuda(p, fit_tma(p, config), TMA)


# ---------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
def test_large_problems_on_gpu(kind, trans_a, trans_b, rng):
  """K = 16384, compiled, against float64 of the dequantized operands (ACC_TOL holds
  only with the promotion: Hopper's FP8 accumulator keeps ~14 bits)."""
  for m, k, n, a_dtype, b_dtype in ((512, 16384, 1024, E4M3, E4M3),
                                    (128, 16384, 4096, E4M3, E5M2),
                                    (1000, 16384 - 64, 520, E5M2, E5M2)):
    a_block = {"tensor": None, "row_col": (None, 1), "block": (128, 1)}[kind] if trans_a \
        else A_BLOCK[kind]
    b_block = {"tensor": None, "row_col": (1, None), "block": (128, 128)}[kind] if trans_b \
        else B_BLOCK[kind]
    a, sa, a64 = operands(rng, (k, m) if trans_a else (m, k), a_dtype, a_block)
    b, sb, b64 = operands(rng, (n, k) if trans_b else (k, n), b_dtype, b_block)
    out = jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(
        a, b, sa, sb, out_dtype=BF16, trans_a=trans_a, trans_b=trans_b, backend="pallas"))(
            a, b, sa, sb)
    check(out, *reference(a64.T if trans_a else a64, b64.T if trans_b else b64), BF16,
          f"{m}x{k}x{n} {a_dtype.name}x{b_dtype.name}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind,variant,m,k,n,change", [
    ("tensor", VARIANT, 1000, 2000, 1100, dict(tile_n=192)),               # 8 x 6 tiles
    ("tensor", VARIANT, 1100, 2000, 1000, dict(tile_n=192, cluster_m=2)),  # 9 (odd) x 6
    ("row_col", VARIANT, 1000, 1500, 1100, dict(cluster_n=2)),             # 8 x 9 (odd)
    ("block", TMA, 1100, 1500, 1000, dict(cluster_n=2)),                   # 9 x 8
    ("block", TMA, 1000, 1500, 1100, dict(cluster_n=2)),                   # 8 x 9 (odd)
    ("block", TMA, 1000, 1500, 1100, dict(tile_n=192)),                    # 8 x 6
    ("block", TMA, 1100, 1500, 900, dict(tile_n=192, cluster_n=2)),        # 9 x 5 (odd)
])
def test_wide_tiles_and_clusters_on_gpu(kind, variant, m, k, n, change, rng):
  """The interpreter test's configs compiled, where clusters multicast the shared tile
  and a CTA past an odd tile count reads a box beside its partner's."""
  test_wide_tiles_and_clusters_in_the_interpreter(kind, variant, m, k, n, change, rng)


def test_float16_out_in_the_interpreter(rng):
  """The op's out-dtype cases run on the GPU tier only for this backend
  (slow_for_kernels); one float16 result here, block scales, ragged edges."""
  a, sa, a64 = operands(rng, (70, 300), E4M3, A_BLOCK["block"], spread=False)
  b, sb, b64 = operands(rng, (300, 200), E5M2, B_BLOCK["block"], spread=False)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F16, backend="pallas")
  check(out, *reference(a64, b64), F16)
