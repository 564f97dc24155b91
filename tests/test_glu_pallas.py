"""The Pallas Mosaic GPU GLU dual GEMM, called through the backend's `impl`.

CPU: the persistent kernel with its dual switch runs in the Mosaic GPU
interpreter (slow: a few small problems) covering every activation, bias
none/shared/batched, save_preactivation, the four layouts, batch 2, ragged M,
N, K, fp16/bf16/fp32 (TF32), both variants, against float64 references built
with `jaxgemm.ops.activations`; the sm_90a lowering and the backend's checks.
GPU tier (`gpu`): larger problems on the GPU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from epilogue_testing import run_impl
from jaxgemm import registry
from jaxgemm.ops import activations
from jaxgemm.ops.glu.pallas import PallasGlu
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul.pallas import PallasConfig

BACKEND = PallasGlu()
pytestmark = pytest.mark.skipif(registry.why_unavailable(BACKEND) is not None,
                                reason=str(registry.why_unavailable(BACKEND)))

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
TINY = PallasConfig(tile_m=128, tile_n=64, tile_k=64, max_concurrent_steps=2, epi_tile_n=64)
TINY_CLUSTERS = dataclasses.replace(TINY, cluster_n=2)


def _problem(batch, m, n, k, dtype=BF16, out_dtype=None, *, layout="NN", **kw):
  return GluProblem(batch, m, n, k, np.dtype(dtype), np.dtype(out_dtype or dtype), F32,
                    layout[0] == "T", layout[1] == "T", None, **kw)


def run(problem, variant="dual", config=TINY, *, seed=0, platform="cpu"):
  run_impl(BACKEND, problem, variant, config, platform=platform, seed=seed)


# Every activation once; the switches spread over them.
CASES = [
    pytest.param(_problem(1, 200, 136, 72, activation="silu", bias="shared",
                          save_preactivation=True), "dual", id="silu-bias-Z-ragged"),
    pytest.param(_problem(2, 128, 64, 64, F16, layout="NT", activation="gelu", bias="batched"),
                 "dual_clusters", id="gelu-bias[b]-NT-fp16-batch2-clusters"),
    pytest.param(_problem(1, 128, 64, 128, layout="TN", activation="gelu_exact"), "dual",
                 id="gelu_exact-TN"),
    pytest.param(_problem(1, 136, 64, 64, F32, activation="relu", bias="shared"), "dual",
                 id="relu-bias-tf32"),
    pytest.param(_problem(1, 128, 64, 64, BF16, F32, layout="TT", activation="sigmoid",
                          save_preactivation=True), "dual", id="sigmoid-Z-TT-f32out"),
    pytest.param(_problem(1, 128, 128, 64, layout="NN", activation="tanh"), "dual_clusters",
                 id="tanh-clusters"),
]


@pytest.mark.parametrize("problem,variant", CASES)
def test_glu(problem, variant):
  run(problem, variant, TINY_CLUSTERS if variant == "dual_clusters" else TINY)


@pytest.mark.parametrize("layout,dtype", [("NN", BF16), ("TT", F16), ("NN", F32)])
def test_lowers_for_the_gpu(layout, dtype):
  p = _problem(2, 512, 1024, 512, dtype, layout=layout, activation="gelu_exact",
               bias="batched", save_preactivation=True)
  for variant in BACKEND.variants:
    config = BACKEND.default_config(p, variant)
    BACKEND.check(p, variant, config)
    args = [jax.ShapeDtypeStruct(s, p.dtype)
            for s in (p.a_shape, p.b_shape, p.b_shape, *p.extra_shapes)]
    text = (jax.jit(BACKEND.impl(p, variant, config, "cuda")).trace(*args)
            .lower(lowering_platforms=("cuda",)).as_text())
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("save_preactivation", [False, True])
def test_gpu_impl_returns_one_array_per_output(save_preactivation):
  """The cuda impl (traced here) returns H alone, or (H, Zg, Zu): as the op's contract
  and the interpreter's path do (the kernel's 1-tuple is unwrapped)."""
  p = _problem(1, 256, 256, 128, activation="silu", save_preactivation=save_preactivation)
  args = [jax.ShapeDtypeStruct(s, p.dtype) for s in (p.a_shape, p.b_shape, p.b_shape)]
  for variant in BACKEND.variants:
    out = jax.eval_shape(BACKEND.impl(p, variant, BACKEND.default_config(p, variant), "cuda"),
                         *args)
    want = jax.ShapeDtypeStruct(p.out_shape, p.out_dtype)
    assert out == ((want,) * 3 if save_preactivation else want), (variant, out)


def test_checks():
  p = _problem(1, 4096, 4096, 4096, activation="silu")
  with pytest.raises(ValueError, match="two fp32 accumulators"):
    BACKEND.check(p, "dual", PallasConfig(tile_m=256, tile_n=128, tile_k=64,
                                          max_concurrent_steps=2))
  with pytest.raises(ValueError, match="shared memory"):
    BACKEND.check(p, "dual", PallasConfig(tile_m=256, tile_n=64, tile_k=128,
                                          max_concurrent_steps=4))
  with pytest.raises(ValueError, match="unknown variant"):
    BACKEND.check(p, "warp_specialized", TINY)
  with pytest.raises(ValueError, match="unknown activation"):
    BACKEND.check(_problem(1, 64, 64, 64, activation="softplus"), "dual", TINY)


def test_default_configs_pass_their_checks():
  for p in (_problem(1, 4096, 4096, 4096, activation="silu"),
            _problem(1, 8192, 14336, 4096, activation="gelu", bias="shared",
                     save_preactivation=True),
            _problem(1, 128, 8192, 8192, activation="silu"),
            # skinny with fp32 epilogue slots: two 128-deep stages of the 128x128
            # candidate would need 256 KiB, so its tile_k is halved
            _problem(1, 128, 8192, 8192, BF16, F32, activation="silu",
                     save_preactivation=True),
            _problem(1, 64, 4096, 4096, F32, activation="gelu"),
            _problem(2, 1000, 1536, 712, activation="silu"),   # the GPU tier's
            _problem(2, 4095, 4097, 1000, F32, activation="relu")):
    for variant in BACKEND.variants:
      BACKEND.check(p, variant, BACKEND.default_config(p, variant))
    for variant, cfg in BACKEND.tuning_candidates(p):
      BACKEND.check(p, variant, cfg)
  cfg = BACKEND.default_config(_problem(1, 4096, 4096, 4096, activation="silu"), "dual")
  assert (cfg.tile_m, cfg.tile_n, cfg.max_concurrent_steps) == (256, 64, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["dual", "dual_clusters"])
@pytest.mark.parametrize("kw,layout,dtype", [
    (dict(activation="silu"), "NN", BF16),
    (dict(activation="gelu", bias="shared", save_preactivation=True), "NT", BF16),
    (dict(activation="gelu_exact", bias="batched"), "TN", F16),
    (dict(activation="relu", save_preactivation=True), "TT", F32),
])
def test_gpu_default_configs(variant, kw, layout, dtype):
  if jax.devices()[0].platform != "gpu":
    pytest.skip("needs a GPU")
  p = _problem(2, 1000, 1536, 712, dtype, layout=layout, **kw)
  run(p, variant, BACKEND.default_config(p, variant), platform="cuda")
