"""Pallas-specific checks: config validation, the SMEM check, and each rung in
the Mosaic GPU interpreter on small ragged problems (CPU), plus GPU runs.

The generic checks (every variant through jit/grad/vmap, dtypes, shapes) are
the shared test base's; here is what only the pallas backend has. CPU time is
kept small: shapes of ~65x129x33 with 64-wide tiles take well under a second
per interpreted kernel call.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgemm import registry
import jaxgemm
from jaxgemm import GemmProblem
from gemm_testing import rotated

pallas = importlib.import_module("jaxgemm.ops.matmul.pallas")
PallasConfig = pallas.PallasConfig
BACKEND = jaxgemm.registry.get_backend("pallas")

pytestmark = pytest.mark.skipif(registry.why_unavailable(BACKEND) is not None,
                                reason=str(registry.why_unavailable(BACKEND)))

F32 = np.dtype(np.float32)


def on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


def problem(batch, m, n, k, dtype=jnp.bfloat16, out_dtype=None, trans_a=False,
            trans_b=False) -> GemmProblem:
  dtype = np.dtype(dtype)
  return GemmProblem(batch, m, n, k, dtype, np.dtype(out_dtype or dtype), F32,
                     trans_a, trans_b)


def operands(p: GemmProblem, seed=0):
  rng = np.random.default_rng(seed)
  a = jnp.asarray(rng.standard_normal(p.a_shape, np.float32), p.dtype)
  b = jnp.asarray(rng.standard_normal(p.b_shape, np.float32), p.dtype)
  return a, b


def bind(a, b, p: GemmProblem, variant: str, cfg: PallasConfig):
  """op(A) @ op(B) through `matmul_p` on the pallas backend, as `jaxgemm.matmul` runs it."""
  return jaxgemm.matmul_p.bind(
      a, b, trans_a=p.trans_a, trans_b=p.trans_b, out_dtype=p.out_dtype,
      acc_dtype=p.acc_dtype, precision=None, backend="pallas", variant=variant, config=cfg)


def reference(a, b, p: GemmProblem) -> np.ndarray:
  a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if p.trans_a:
    a64 = a64.transpose(0, 2, 1)
  if p.trans_b:
    b64 = b64.transpose(0, 2, 1)
  return a64 @ b64


def assert_close(out, ref, p: GemmProblem):
  """Relative to max|ref|: inputs are exact in f64, the products are summed in
  f32 (error ~K * 2^-24, negligible here) and the result is rounded once to
  the output dtype (2^-9 relative for bf16, 2^-12 for fp16). 1e-2 leaves room
  for that rounding at near-maximal entries and catches any wrong or missing
  tile contribution (each is O(1) relative)."""
  out = np.asarray(out, np.float64)
  assert out.shape == ref.shape, (out.shape, ref.shape)
  tol = 1e-2 if np.dtype(p.out_dtype).itemsize == 2 else 1e-4
  err = np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30)
  assert err < tol, f"{p.describe()}: relative error {err:.3e} >= {tol}"


# Small tiles for the interpreter: the rungs that split a tile between two
# consumers need tile_m >= 128 (64 rows per consumer warpgroup); the others
# (pingpong's consumers take whole tiles) take 64.
def small_config(variant: str, **overrides) -> PallasConfig:
  two = variant in pallas._TWO_CONSUMERS
  kw = dict(tile_m=128 if two else 64, tile_n=64, tile_k=32, max_concurrent_steps=2,
            grid_group=2, epi_tile_n=32)
  if variant in pallas._CLUSTERED:
    kw["cluster_m"] = 2
  kw.update(overrides)
  return PallasConfig(**kw)


# ---------------------------------------------------------------- config

def test_variants_in_ladder_order():
  assert jaxgemm.variants("pallas") == pallas.VARIANTS


@pytest.mark.parametrize("field,value", [("tile_m", 96), ("tile_m", 32), ("tile_n", 512),
                                         ("tile_n", 96),
                                         ("tile_k", 8), ("max_concurrent_steps", 0),
                                         ("cluster_m", 3), ("split_rounds", 3)])
def test_config_rejects_bad_fields(field, value):
  with pytest.raises(ValueError, match=f"PallasConfig.{field}={value}"):
    PallasConfig(**{field: value})


def test_config_types_and_json():
  with pytest.raises(TypeError):
    PallasConfig(tile_m=128.0)
  with pytest.raises(TypeError):
    PallasConfig(grid_minor_m=1)
  cfg = PallasConfig(tile_m=256, grid_minor_m=True)
  assert PallasConfig.from_json(cfg.to_json()) == cfg


def test_smem_overflow_is_a_clear_error_before_launch():
  p = problem(1, 4096, 4096, 4096)
  cfg = PallasConfig(tile_m=256, tile_n=256, tile_k=128, max_concurrent_steps=4)
  for variant in pallas.VARIANTS:
    v_cfg = dataclasses.replace(cfg, cluster_m=2) if variant in pallas._CLUSTERED else cfg
    with pytest.raises(ValueError, match=r"needs \d+ bytes of shared memory .* more than the 232448"):
      BACKEND.check(p, variant, v_cfg)
  # The same through the public API: raised before tracing anything.
  a = jax.ShapeDtypeStruct((64, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="bytes of shared memory"):
    jax.eval_shape(lambda a: jaxgemm.matmul(a, a, backend="pallas", variant="basic",
                                            config=cfg), a)


def test_float64_not_implemented():
  p = GemmProblem(1, 64, 64, 64, np.dtype(np.float64), np.dtype(np.float64),
                  np.dtype(np.float64))
  for variant in pallas.VARIANTS:
    with pytest.raises(NotImplementedError, match="does not support dtype"):
      BACKEND.check(p, variant, BACKEND.default_config(p, variant))


@pytest.mark.parametrize("precision", [jax.lax.Precision.HIGH, jax.lax.Precision.HIGHEST])
def test_fp32_beyond_tf32_points_to_triton(precision):
  p = dataclasses.replace(problem(1, 64, 64, 64, jnp.float32), precision=(precision,) * 2)
  for variant in pallas.VARIANTS:
    with pytest.raises(NotImplementedError, match="TF32 .* use backend='triton'"):
      BACKEND.check(p, variant, BACKEND.default_config(p, variant))


# Each layout on one of the two rungs on the CPU (`rotated`); every pair in the GPU tier.
@pytest.mark.parametrize("variant,trans_a,trans_b", [
    pytest.param(p.values[0], *p.values[1], id=p.id, marks=p.marks)
    for p in rotated(["pipelined", "pingpong"],
                     [pytest.param(t, id=f"{t[0]}-{t[1]}")
                      for t in [(False, False), (True, False), (True, True)]],
                     heavy=["pipelined", "pingpong"])])
def test_fp32_any_layout_runs_k_major(variant, trans_a, trans_b):
  """TF32 wgmma reads only K-major operands: every stored layout is brought to it."""
  p = problem(1, 65, 129, 70, jnp.float32, trans_a=trans_a, trans_b=trans_b)
  a, b = operands(p, seed=3)
  out = bind(a, b, p, variant, BACKEND.default_config(p, variant))
  # On the GPU TF32 rounds the operands to 10 mantissa bits (3e-3, see
  # tests/gemm_testing.py); the interpreter multiplies in fp32 exactly.
  tol = 3e-3 if on_gpu() else 1e-5
  ref = reference(a, b, p)
  assert np.linalg.norm(np.asarray(out[0], np.float64) - ref) <= tol * np.linalg.norm(ref)


def test_fp32_tiles_fill_the_swizzle_span_in_bytes():
  for variant in pallas.VARIANTS:
    bf16 = BACKEND.default_config(problem(1, 4096, 4096, 4096), variant)
    f32 = BACKEND.default_config(problem(1, 4096, 4096, 4096, jnp.float32), variant)
    assert f32.tile_k * 4 == bf16.tile_k * 2, variant


def test_variant_specific_config_errors():
  p = problem(1, 256, 256, 256)
  if "warp_specialized" in pallas.VARIANTS:
    with pytest.raises(ValueError, match="tile_m=64 must be >= 128"):
      BACKEND.check(p, "warp_specialized", PallasConfig(tile_m=64))
  for variant in ("clusters", "pingpong"):
    if variant in pallas.VARIANTS:
      with pytest.raises(ValueError, match="exactly one of"):
        BACKEND.check(p, variant, PallasConfig(tile_m=128, cluster_m=1, cluster_n=1))
  if "pingpong" in pallas.VARIANTS:   # a consumer holds a whole tile: 64 rows will do
    BACKEND.check(p, "pingpong", PallasConfig(tile_m=64, cluster_n=2))
  with pytest.raises(ValueError, match="does not use clusters"):
    BACKEND.check(p, "basic", PallasConfig(cluster_m=2))
  with pytest.raises(ValueError, match="split_rounds=2 .only 'stream_k' takes it"):
    BACKEND.check(p, "clusters", PallasConfig(tile_m=256, cluster_n=2, split_rounds=2))
  BACKEND.check(p, "stream_k", PallasConfig(tile_m=256, cluster_n=2, split_rounds=2))
  # 192-wide tiles are the FP8 kernel's (scaled_matmul); the 16-bit rungs take powers of two.
  for variant in pallas.VARIANTS:
    with pytest.raises(ValueError, match="power-of-two tile_n; got tile_n=192"):
      BACKEND.check(p, variant, PallasConfig(tile_n=192))


@pytest.mark.parametrize("variant", pallas.VARIANTS)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 65, 129, 33), (3, 8192, 8192, 8192),
                                   (1, 128, 8192, 8192), (1, 4095, 4093, 4097)])
def test_default_config_is_valid_and_clamped(variant, shape):
  p = problem(*shape)
  cfg = BACKEND.default_config(p, variant)
  _, m, n, k = shape
  BACKEND.check(p, variant, cfg)
  # Clamped to the problem, but never below one 128-byte swizzle span (64 bf16).
  assert cfg.tile_m <= max(128, 2 * m) and cfg.tile_n <= max(64, 2 * n)
  assert cfg.tile_k <= max(64, 2 * k)


# ---------------------------------------------------------------- interpreter

CASES = [
    # (batch, m, n, k, trans_a, trans_b, dtype): ragged in every dimension.
    pytest.param((1, 65, 129, 33, False, False, jnp.bfloat16), id="NN-bf16-65x129x33"),
    pytest.param((2, 65, 72, 40, True, True, jnp.float16), id="TT-fp16-b2-65x72x40"),
    pytest.param((1, 130, 64, 70, True, False, jnp.bfloat16), id="TN-bf16-130x64x70"),
    pytest.param((2, 70, 100, 64, False, True, jnp.float16), id="NT-fp16-b2-70x100x64"),
    # One output tile: clusters' second CTA has none and recomputes its partner's
    # (B^T wholly past its box was the case that went wrong on the H200).
    pytest.param((1, 33, 24, 40, False, True, jnp.bfloat16), id="NT-bf16-one-tile-33x24x40"),
]


PERSISTENT = [v for v in pallas._PERSISTENT if v in pallas.VARIANTS]


# The persistent rungs take 10-15 s a case in the interpreter: on the CPU they take the
# cases in turn (each case and rung once; `rotated`), the GPU tier runs every pair.
@pytest.mark.parametrize("variant,case", rotated(pallas.VARIANTS, CASES, heavy=PERSISTENT))
def test_interpreter_matches_reference(variant, case):
  batch, m, n, k, ta, tb, dtype = case
  p = problem(batch, m, n, k, dtype, trans_a=ta, trans_b=tb)
  cfg = small_config(variant)
  BACKEND.check(p, variant, cfg)
  kernel_fn = getattr(importlib.import_module(f"jaxgemm.kernels.pallas.matmul.{variant}"), variant)
  a, b = operands(p)
  out = jax.jit(lambda a, b: kernel_fn(a, b, p, cfg, interpret=True))(a, b)
  assert out.dtype == p.out_dtype
  assert_close(out, reference(a, b, p), p)


def test_interpreter_f32_output():
  p = problem(1, 65, 40, 33, jnp.bfloat16, out_dtype=jnp.float32)
  kernel_fn = getattr(importlib.import_module("jaxgemm.kernels.pallas.matmul.basic"), "basic")
  a, b = operands(p)
  out = kernel_fn(a, b, p, small_config("basic"), interpret=True)
  assert out.dtype == jnp.float32
  assert_close(out, reference(a, b, p), p)


def test_matmul_p_cpu_lowering_runs_the_interpreter():
  """jaxgemm.matmul(backend='pallas') on the CPU: matmul_p's cpu lowering, the
  interpreted kernel, and the backward GEMMs (transpose flags) under grad."""
  if on_gpu():
    pytest.skip("the cpu lowering is what this checks")
  rng = np.random.default_rng(1)
  a = jnp.asarray(rng.standard_normal((2, 65, 33)), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal((2, 33, 72)), jnp.bfloat16)
  variant = pallas.VARIANTS[0]
  f = lambda a, b: jaxgemm.matmul(a, b, backend="pallas", variant=variant)
  out = jax.jit(f)(a, b)
  p = problem(2, 65, 72, 33)
  assert_close(out, reference(a, b, p), p)
  da, db = jax.grad(lambda a, b: f(a, b).astype(jnp.float32).sum(), argnums=(0, 1))(a, b)
  ones = np.ones((2, 65, 72))
  a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
  pa = problem(2, 65, 33, 72, trans_b=True)
  assert_close(da, ones @ b64.transpose(0, 2, 1), pa)
  pb = problem(2, 33, 72, 65, trans_a=True)
  assert_close(db, a64.transpose(0, 2, 1) @ ones, pb)


# ---------------------------------------------------------------- GPU

GPU_SHAPES = [(1, 512, 384, 320), (1, 4095, 4093, 4097), (2, 1000, 520, 777),
              (1, 128, 2048, 1024), (3, 190, 93, 40)]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", pallas.VARIANTS)
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_default_config_matches_reference(variant, trans, dtype):
  if not on_gpu():
    pytest.skip("needs an NVIDIA GPU")
  for shape in GPU_SHAPES:
    p = problem(*shape, dtype=dtype, trans_a=trans[0], trans_b=trans[1])
    a, b = operands(p)
    out = bind(a, b, p, variant, BACKEND.default_config(p, variant))
    ref = jax.lax.dot_general(
        a, b, (((1 if p.trans_a else 2,), (2 if p.trans_b else 1,)), ((0,), (0,))),
        preferred_element_type=jnp.float32)
    assert_close(out, np.asarray(ref, np.float64), p)


NARROW_K_CONFIGS = [
    # (tile_m, tile_n, tile_k): K steps or N tiles narrower than a 128-byte swizzle
    # span next to wider tiles. The K steps compiled on the H200 only once both
    # operands shared one swizzle (`common.operand_swizzle`).
    pytest.param((128, 128, 32), id="128x128x32"),
    pytest.param((128, 64, 16), id="128x64x16"),
    pytest.param((128, 16, 64), id="128x16x64"),
    pytest.param((128, 32, 128), id="128x32x128"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", pallas.VARIANTS)
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("tiles", NARROW_K_CONFIGS)
def test_gpu_narrow_k_step_configs_match_reference(variant, trans, tiles):
  if not on_gpu():
    pytest.skip("needs an NVIDIA GPU")
  tile_m, tile_n, tile_k = tiles
  p = problem(2, 300, 200, 100, trans_a=trans[0], trans_b=trans[1])
  cfg = BACKEND.default_config(p, variant)
  cfg = dataclasses.replace(cfg, tile_m=tile_m if variant in pallas._TWO_CONSUMERS else 64,
                            tile_n=tile_n, tile_k=tile_k, epi_tile_n=min(64, tile_n))
  a, b = operands(p)
  out = bind(a, b, p, variant, cfg)
  assert_close(out, reference(a, b, p), p)


# ---------------------------------------------------------------- exact C stores

ws = importlib.import_module("jaxgemm.kernels.pallas.matmul.warp_specialized")
common = importlib.import_module("jaxgemm.kernels.pallas.common")


@pytest.mark.parametrize("valid,extent", [(v, e) for e in (8, 32, 64) for v in range(1, e + 1)])
def test_store_windows_cover_exactly_the_valid_part(valid, extent):
  size, offsets = ws.windows(valid, extent)
  covered = np.zeros(extent, bool)
  for o in offsets:
    assert 0 <= o and o + size <= valid       # nothing past C's edge
    covered[o:o + size] = True
  assert covered[:valid].all() and not covered[valid:].any()
  assert len(offsets) <= 2 and size & (size - 1) == 0


def exact_case(p: GemmProblem, cfg: PallasConfig, variant: str = "clusters") -> bool:
  row_parts = 2 if variant in pallas._TWO_CONSUMERS else 1
  return common.stores_exact(p, p.out_dtype) and ws.exact_store_fits(
      p.m, p.n, cfg.tile_m, cfg.tile_n, min(cfg.epi_tile_n, cfg.tile_n), p.out_dtype,
      row_parts)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_operands_share_the_largest_swizzle_that_fits_both_and_the_k_step(dtype):
  """wgmma reads A and B with one swizzle and steps K in swizzle spans: the
  swizzle must divide both tiles' stored minor dimensions and the K step."""
  item = np.dtype(dtype).itemsize
  seen = set()
  for tm in (64, 128, 256):
    for tn in (16, 32, 64, 128, 160, 192, 256):
      for tk in (16, 32, 64, 128):
        for ta in (False, True):
          for tb in (False, True):
            s = common.operand_swizzle(tm, tn, tk, dtype, ta, tb)
            seen.add(s)
            minors = (tm if ta else tk, tk if tb else tn, tk)
            assert all(d * item % s == 0 for d in minors), (tm, tn, tk, ta, tb, s)
            assert s == 128 or any(d * item % (2 * s) for d in minors), (tm, tn, tk, ta, tb, s)
            if min(tm, tn, tk) >= 64 and tn != 160:
              assert s == 128   # every default and tuned config keeps 128 bytes
  assert seen == {32, 64, 128}


def test_exact_stores_only_where_tma_cannot_store_c():
  cfg = PallasConfig(tile_m=256, tile_n=128, epi_tile_n=64)
  assert exact_case(problem(1, 4095, 4093, 4097), cfg)          # odd N: 2-byte stores
  assert not exact_case(problem(1, 4096, 4096, 4097), cfg)      # TMA stores C
  # A last tile with a single row inside C has no window of 128 elements: padded C.
  assert not exact_case(problem(1, 4097, 4093, 64), cfg)
  assert ws.store_vector_size(4093, 64, jnp.bfloat16) == 1
  assert ws.store_vector_size(4100, 64, jnp.bfloat16) == 4
  assert ws.store_vector_size(4104, 64, jnp.float32) == 4       # 16 bytes at most


EXACT_CASES = [
    # (batch, m, n, k, trans_a, trans_b, dtype): C's rows not TMA-describable,
    # ragged last tiles in M and N (both consumers' pieces partly inside C).
    pytest.param((1, 190, 93, 40, False, False, jnp.bfloat16), id="NN-bf16-190x93x40"),
    pytest.param((2, 150, 77, 33, True, True, jnp.float16), id="TT-fp16-b2-150x77x33"),
    pytest.param((1, 190, 93, 70, True, False, jnp.bfloat16), id="TN-bf16-190x93x70"),
    pytest.param((3, 60, 75, 33, False, True, jnp.bfloat16), id="NT-bf16-b3-60x75x33"),
]


@pytest.mark.parametrize("variant,case", rotated(PERSISTENT, EXACT_CASES, heavy=PERSISTENT))
def test_interpreter_exact_c_stores(variant, case):
  batch, m, n, k, ta, tb, dtype = case
  p = problem(batch, m, n, k, dtype, trans_a=ta, trans_b=tb)
  cfg = small_config(variant)
  assert exact_case(p, cfg, variant), "the case must exercise the exact-store epilogue"
  kernel_fn = getattr(importlib.import_module(f"jaxgemm.kernels.pallas.matmul.{variant}"), variant)
  a, b = operands(p, seed=3)
  out = jax.jit(lambda a, b: kernel_fn(a, b, p, cfg, interpret=True))(a, b)
  assert out.shape == p.out_shape
  assert_close(out, reference(a, b, p), p)


# ---------------------------------------------------------------- stream-K

def test_stream_k_plan():
  # 8192x4096x14336 in 256x256 cluster tiles on the H200's 66 clusters: 27
  # whole rounds, and the last round's 10 tiles split over all 66 workers.
  sk = ws.plan_stream_k(tiles=1792, workers=66, k_iters=64)
  assert (sk.dp_tiles, sk.sk_tiles, sk.units_per_tile, sk.units_per_worker) == (
      27 * 66, 10, 32, 5)
  assert sk.units_per_worker * sk.workers >= sk.sk_units             # every unit has a worker
  # 8192^3: 15 whole rounds, 34 tiles of 64 units in about two halves each.
  sk = ws.plan_stream_k(1024, 66, 128)
  assert (sk.dp_tiles, sk.sk_tiles, sk.units_per_worker) == (990, 34, 33)
  assert ws.plan_stream_k(128, 66, 64) is None       # 4096^3: the last round 94% full
  assert ws.plan_stream_k(1980, 66, 128) is None     # whole rounds
  assert ws.plan_stream_k(1792, 66, 65) is None      # K steps not in pairs
  assert ws.plan_stream_k(1024, 66, 16) is None      # 8192x1024x8192: tiles too short
  assert ws.plan_stream_k(40, 66, 64) is None        # a partial round only: all tiles split
  assert ws.plan_stream_k(512, 66, 224) is None      # 8192x14336x4096: split tiles 10%


def test_stream_k_plan_over_two_rounds():
  sk = ws.plan_stream_k(tiles=1792, workers=66, k_iters=64, split_rounds=2)
  assert (sk.dp_tiles, sk.sk_tiles, sk.units_per_tile) == (26 * 66, 76, 32)
  assert sk.units_per_tile < sk.units_per_worker < 2 * sk.units_per_tile  # <= 2 workers a tile


STREAM_K_CASES = [
    # Cluster tiles of 128x128 on the interpreter's 3 clusters, K steps of 32.
    # 7 tiles: 2 whole rounds, then one tile of 6 units split three ways (an
    # owner and two contributors).
    pytest.param((1, 128, 896, 384, False, False, jnp.bfloat16), 1, 6, id="NN-bf16-128x896x384"),
    # 5 tiles: a whole round, then two tiles of 3 units on 2 units a worker:
    # the middle worker contributes to one and owns the other.
    pytest.param((1, 128, 640, 192, False, False, jnp.bfloat16), 1, 6, id="NN-bf16-128x640x192"),
    pytest.param((2, 128, 256, 384, True, True, jnp.float16), 1, 6, id="TT-fp16-b2-128x256x384"),
    # C stored exact (N = 890) under the split.
    pytest.param((1, 128, 890, 192, False, True, jnp.bfloat16), 1, 6, id="NT-bf16-128x890x192"),
    # Over the last two rounds: (dp_tiles, sk_tiles) = (3, 4), a worker's share
    # longer than a tile.
    pytest.param((1, 128, 896, 128, False, False, jnp.bfloat16), 2, 6, id="NN-bf16-128x896x128-2r"),
    # On 8 SMs (four clusters): 5 tiles, the last one split four ways, one
    # unit each: an owner adds three partials.
    pytest.param((1, 128, 640, 256, False, False, jnp.bfloat16), 1, 8, id="NN-bf16-128x640x256-8sm"),
]


# 75-105 s a case in the interpreter: the CPU runs the one where a worker both owns a
# split tile and contributes to another; the GPU tier runs them all.
CPU_STREAM_K_CASE = "NN-bf16-128x640x192"


@pytest.mark.parametrize("case,split_rounds,sms", [
    c if c.id == CPU_STREAM_K_CASE else pytest.param(*c.values, id=c.id, marks=pytest.mark.slow)
    for c in STREAM_K_CASES])
def test_interpreter_stream_k(case, split_rounds, sms, monkeypatch):
  """Rung 5 with the split forced (small problems never meet its rules of 5%
  of the tiles and 64 K steps), on 6 interpreted SMs (unless the case says
  otherwise): three clusters share the split tiles."""
  monkeypatch.setattr(ws, "MAX_STREAM_K_SHARE", 1.0)
  monkeypatch.setattr(ws, "MIN_STREAM_K_STEPS", 4)
  monkeypatch.setattr(common, "num_sms", lambda interpret: sms)
  batch, m, n, k, ta, tb, dtype = case
  p = problem(batch, m, n, k, dtype, trans_a=ta, trans_b=tb)
  cfg = small_config("stream_k", cluster_m=1, cluster_n=2, split_rounds=split_rounds)
  tiles = batch * common.cdiv(m, cfg.tile_m) * common.cdiv(n, 2 * cfg.tile_n)
  assert ws.plan_stream_k(tiles, common.num_sms(True) // 2, k // cfg.tile_k,
                          split_rounds) is not None
  stream_k = importlib.import_module("jaxgemm.kernels.pallas.matmul.stream_k").stream_k
  a, b = operands(p, seed=4)
  out = jax.jit(lambda a, b: stream_k(a, b, p, cfg, interpret=True))(a, b)
  assert_close(out, reference(a, b, p), p)


@pytest.mark.gpu
@pytest.mark.parametrize("split_rounds", [1, 2])
@pytest.mark.parametrize("shape,trans", [((1, 8192, 14336, 4096), (False, False)),
                                         ((8, 4096, 4096, 4096), (True, True))])
def test_gpu_stream_k_matches_reference_and_is_deterministic(shape, trans, split_rounds):
  if not on_gpu():
    pytest.skip("needs an NVIDIA GPU")
  p = problem(*shape, trans_a=trans[0], trans_b=trans[1])
  cfg = dataclasses.replace(BACKEND.default_config(p, "stream_k"), split_rounds=split_rounds)
  tiles = p.batch * common.cdiv(p.m, cfg.tile_m * cfg.cluster_m) * common.cdiv(
      p.n, cfg.tile_n * cfg.cluster_n)
  workers = common.num_sms(False) // 2
  assert ws.plan_stream_k(tiles, workers, common.cdiv(p.k, cfg.tile_k), split_rounds) is not None
  f = jax.jit(lambda a, b: bind(a, b, p, "stream_k", cfg))
  a, b = operands(p, seed=5)
  out = f(a, b)
  ref = jax.lax.dot_general(
      a, b, (((1 if p.trans_a else 2,), (2 if p.trans_b else 1,)), ((0,), (0,))),
      preferred_element_type=jnp.float32)
  assert_close(out, np.asarray(ref, np.float64), p)
  assert np.array_equal(np.asarray(out), np.asarray(f(a, b)))   # the fixup's order is fixed


def test_last_tile_rows_by_consumer():
  # M = 190 in 128-row tiles: the last tile holds rows 128..189 (62 of them).
  assert [ws.last_tile_rows(190, 128, em) for em in range(1)] == [(62, 0)]   # two halves
  assert [ws.last_tile_rows(190, 128, em, 1) for em in range(2)] == [(62,), (0,)]
  assert ws.last_tile_rows(250, 128, 0) == (64, 58)


@pytest.mark.skipif("pingpong" not in pallas.VARIANTS, reason="no pingpong rung")
@pytest.mark.parametrize("case", [
    # 9 cluster tiles on the interpreter's one cluster: consumer 0 takes 5,
    # consumer 1 takes 4; 3 K steps on a 2-slot ring, so each consumer's tiles
    # start on either slot and the two consumers' barriers interleave.
    pytest.param((3, 65, 129, 96, False, False, jnp.bfloat16), id="NN-bf16-b3-65x129x96"),
    pytest.param((3, 65, 129, 96, True, True, jnp.float16), id="TT-fp16-b3-65x129x96"),
])
def test_interpreter_pingpong_uneven_tiles(case):
  batch, m, n, k, ta, tb, dtype = case
  p = problem(batch, m, n, k, dtype, trans_a=ta, trans_b=tb)
  cfg = small_config("pingpong")
  assert (cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.max_concurrent_steps) == (64, 64, 32, 2)
  kernel_fn = importlib.import_module("jaxgemm.kernels.pallas.matmul.pingpong").pingpong
  a, b = operands(p, seed=6)
  out = jax.jit(lambda a, b: kernel_fn(a, b, p, cfg, interpret=True))(a, b)
  assert_close(out, reference(a, b, p), p)


# clusters and pingpong take their persistent loop from warp_specialized and stream_k,
# which the CPU checks; the GPU tier runs them too.
@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.slow) if v in ("clusters", "pingpong") else v
    for v in pallas.VARIANTS])
def test_interpreter_single_k_step_several_tiles_per_cta(variant):
  """K fits one tile and each CTA walks several tiles (batch 6 on the
  interpreter's 2 CTAs): once a barrier phase completed twice and hung."""
  p = problem(6, 7, 65, 33)
  cfg = small_config(variant, tile_k=64)
  kernel_fn = getattr(importlib.import_module(f"jaxgemm.kernels.pallas.matmul.{variant}"), variant)
  a, b = operands(p)
  assert_close(kernel_fn(a, b, p, cfg, interpret=True), reference(a, b, p), p)
