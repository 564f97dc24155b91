"""The Pallas Mosaic GPU fused epilogues of `fused_matmul`, called through the backend's `impl`.

CPU: the persistent kernel with its epilogue switches runs in the Mosaic GPU
interpreter (slow: a few small problems, ~6 s each) chosen so that together
they cover every activation, bias none/shared/batched, residual,
save_preactivation, the three gates, all four layouts, batch 2, ragged M, N,
K (C stored exact and padded), bf16/fp16/fp32 (TF32) operands, fp32 results,
both variants, against float64 references built with `jaxgemm.ops.activations`.
Plus the epilogue's formulas alone against jax.nn (fast), the sm_90a lowering
of each switch (layout inference runs on the CPU), and the backend's checks.
GPU tier (`gpu`): larger problems on the GPU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from epilogue_testing import act64, grad64, run_impl
from jaxgemm import registry
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.pallas import PallasFusedMatmul
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.matmul.pallas import PallasConfig

BACKEND = PallasFusedMatmul()
pytestmark = pytest.mark.skipif(registry.why_unavailable(BACKEND) is not None,
                                reason=str(registry.why_unavailable(BACKEND)))

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
# The smallest tiles the two-consumer rungs take (the interpreter's time grows with tiles).
TINY = PallasConfig(tile_m=128, tile_n=64, tile_k=64, max_concurrent_steps=2, epi_tile_n=64)
TINY_CLUSTERS = dataclasses.replace(TINY, cluster_n=2)


def on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


def _problem(batch, m, n, k, dtype=BF16, out_dtype=None, *, layout="NN", **kw):
  return FusedMatmulProblem(batch, m, n, k, np.dtype(dtype), np.dtype(out_dtype or dtype), F32,
                            layout[0] == "T", layout[1] == "T", None, **kw)


def run(problem, variant="warp_specialized", config=TINY, *, seed=0, gate_dtype=None,
        platform="cpu"):
  run_impl(BACKEND, problem, variant, config, platform=platform, seed=seed,
           gate_dtype=gate_dtype)


# ------------------------------------------------------------ the formulas

@pytest.mark.parametrize("name", activations.ACTIVATIONS)
def test_activation_formulas(name):
  """The in-kernel formulas (fp32, what Mosaic GPU lowers) against jax.nn in float64,
  z on 400001 points of [-12, 12]: within a few fp32 roundings of jax.nn's own fp32."""
  from jaxgemm.kernels.pallas import epilogue  # noqa: PLC0415
  z = np.linspace(-12, 12, 400001).astype(np.float32)
  for ours, theirs in ((epilogue.activation, activations.apply),
                       (epilogue.derivative, activations.derivative)):
    got = np.asarray(jax.jit(lambda x: ours(name, x))(jnp.asarray(z)), np.float64)
    ref = act64(name, z) if theirs is activations.apply else grad64(name, z)
    jax_f32 = np.asarray(theirs(name, jnp.asarray(z)), np.float64)
    err, jax_err = np.abs(got - ref).max(), np.abs(jax_f32 - ref).max()
    # gelu_exact's erf is XLA's fp32 rational form: 1.2e-6 (see epilogue's docstring).
    assert err <= max(4 * jax_err, 2e-6), (name, ours.__name__, err, jax_err)


def test_unknown_activation_is_refused_by_name():
  from jaxgemm.kernels.pallas.epilogue import Epilogue  # noqa: PLC0415
  with pytest.raises(NotImplementedError, match="'softplus'"):
    Epilogue(activation="softplus")


# ------------------------------------------------------------ the kernels
# Each case one interpreter run; together they cover the switches (see the docstring).

CASES = [
    # ragged M, N, K: N = 136 is no multiple of 64, so C and Z are stored exact
    pytest.param(_problem(1, 200, 136, 72, activation="gelu", bias="shared", residual=True,
                          save_preactivation=True), "warp_specialized", id="gelu-bias-res-Z"),
    pytest.param(_problem(2, 136, 128, 64, F16, layout="TN", activation="gelu_exact",
                          bias="batched", save_preactivation=True),
                 "warp_specialized", id="gelu_exact-bias[b]-Z-TN-fp16-batch2"),
    pytest.param(_problem(1, 128, 64, 128, BF16, F32, layout="NT", activation="silu",
                          residual=True), "warp_specialized", id="silu-res-NT-f32out"),
    pytest.param(_problem(1, 128, 128, 64, layout="TT", activation="sigmoid", bias="shared"),
                 "clusters", id="sigmoid-bias-TT-clusters"),
    pytest.param(_problem(1, 136, 64, 64, F32, activation="relu", bias="shared", residual=True),
                 "warp_specialized", id="relu-bias-res-tf32"),
    pytest.param(_problem(2, 128, 64, 64, activation="tanh", bias="batched"),
                 "clusters", id="tanh-bias[b]-batch2-clusters"),
]


@pytest.mark.parametrize("problem,variant", CASES)
def test_epilogue(problem, variant):
  run(problem, variant, TINY_CLUSTERS if variant == "clusters" else TINY)


GATES = [
    pytest.param(_problem(1, 200, 72, 64, layout="NT", gate="out", gate_activation="gelu"),
                 None, id="out-gelu-NT-ragged"),
    pytest.param(_problem(2, 128, 64, 64, F16, layout="TN", gate="out",
                          gate_activation="gelu_exact"), F32, id="out-gelu_exact-TN-Zf32"),
    pytest.param(_problem(1, 128, 64, 72, layout="TT", gate="lhs", gate_activation="tanh"),
                 None, id="lhs-tanh-TT"),
    pytest.param(_problem(1, 128, 64, 64, layout="NT", gate="rhs", gate_activation="silu"),
                 None, id="rhs-silu-NT"),
]


@pytest.mark.parametrize("problem,gate_dtype", GATES)
def test_gate(problem, gate_dtype):
  run(problem, gate_dtype=gate_dtype)


# ------------------------------------------------------------ sm_90a lowering

@pytest.mark.parametrize("kw,layout,dtype", [
    (dict(activation="gelu_exact", bias="batched", residual=True, save_preactivation=True),
     "NN", BF16),
    (dict(activation="silu", bias="shared"), "TT", F16),
    (dict(activation="relu", residual=True), "NN", F32),
    (dict(gate="out", gate_activation="sigmoid"), "NT", BF16),
    (dict(activation="tanh", bias="shared", residual=True, save_preactivation=True), "NN", BF16),
])
def test_lowers_for_the_gpu(kw, layout, dtype):
  """Each switch lowers to Mosaic GPU for sm_90a without a GPU (layout inference runs
  here: an op without a warpgroup rule, as erf was, fails in CI). The last case has an
  odd N: C stored exact."""
  n = 4097 if kw.get("save_preactivation") and kw.get("activation") == "tanh" else 512
  p = _problem(2, 512, n, 512, dtype, layout=layout, **kw)
  for variant in BACKEND.variants:
    config = BACKEND.default_config(p, variant)
    BACKEND.check(p, variant, config)
    args = [jax.ShapeDtypeStruct(s, p.dtype) for s in (p.a_shape, p.b_shape, *p.extra_shapes)]
    text = (jax.jit(BACKEND.impl(p, variant, config, "cuda")).trace(*args)
            .lower(lowering_platforms=("cuda",)).as_text())
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("kw", [dict(activation="gelu", bias="shared"),
                                dict(activation="silu", save_preactivation=True),
                                dict(gate="out", gate_activation="gelu")])
def test_gpu_impl_returns_one_array_per_output(kw):
  """The cuda impl (traced here) returns Y alone, or (Y, Z): as the op's contract and
  the interpreter's path do (the kernel's 1-tuple is unwrapped)."""
  p = _problem(1, 256, 256, 128, **kw)
  args = [jax.ShapeDtypeStruct(s, p.dtype) for s in (p.a_shape, p.b_shape, *p.extra_shapes)]
  want = jax.ShapeDtypeStruct(p.out_shape, p.out_dtype)
  for variant in BACKEND.variants:
    out = jax.eval_shape(BACKEND.impl(p, variant, BACKEND.default_config(p, variant), "cuda"),
                         *args)
    assert out == ((want,) * 2 if p.num_outputs > 1 else want), (variant, out)


# ------------------------------------------------------------ checks

def test_checks():
  p = _problem(1, 4096, 4096, 4096, activation="gelu", bias="shared", residual=True)
  with pytest.raises(NotImplementedError, match="stream_k"):
    BACKEND.check(p, "stream_k", BACKEND.default_config(p, "clusters"))
  with pytest.raises(ValueError, match="unknown variant"):
    BACKEND.check(p, "nope", TINY)
  with pytest.raises(ValueError, match="shared memory"):
    BACKEND.check(p, "warp_specialized",
                  PallasConfig(tile_m=256, tile_n=128, tile_k=64, max_concurrent_steps=4))
  with pytest.raises(ValueError, match="unknown activation"):
    BACKEND.check(_problem(1, 64, 64, 64, activation="softplus"), "warp_specialized", TINY)
  with pytest.raises(ValueError, match="tile_m=64 must be >= 128"):
    BACKEND.check(p, "warp_specialized", dataclasses.replace(TINY, tile_m=64))


def test_default_configs_pass_their_checks():
  for p in (_problem(1, 4096, 4096, 4096, activation="gelu", bias="shared", residual=True),
            _problem(1, 8192, 14336, 4096, gate="out", gate_activation="silu"),
            _problem(1, 128, 8192, 8192, activation="silu", save_preactivation=True),
            _problem(2, 4095, 4097, 1000, F32, activation="relu", residual=True),
            _problem(1, 4096, 4096, 4096, BF16, F32, residual=True)):
    for variant in BACKEND.variants:
      BACKEND.check(p, variant, BACKEND.default_config(p, variant))
    for variant, cfg in BACKEND.tuning_candidates(p):
      BACKEND.check(p, variant, cfg)
  # The residual's slots keep the 4-stage ring with 32-wide pieces.
  cfg = BACKEND.default_config(_problem(1, 4096, 4096, 4096, residual=True), "clusters")
  assert (cfg.max_concurrent_steps, cfg.epi_tile_n) == (4, 32)


# ------------------------------------------------------------ GPU tier

@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["warp_specialized", "clusters"])
@pytest.mark.parametrize("kw,layout,dtype", [
    (dict(activation="gelu", bias="shared"), "NN", BF16),
    (dict(activation="gelu_exact", bias="batched", residual=True, save_preactivation=True),
     "TN", BF16),
    (dict(activation="silu", residual=True), "NT", F16),
    (dict(activation="tanh", bias="shared", save_preactivation=True), "TT", F32),
    (dict(gate="out", gate_activation="gelu"), "NN", BF16),
    (dict(gate="lhs", gate_activation="relu"), "NT", BF16),
    (dict(gate="rhs", gate_activation="sigmoid"), "TN", BF16),
])
def test_gpu_default_configs(variant, kw, layout, dtype):
  if not on_gpu():
    pytest.skip("needs a GPU")
  p = _problem(2, 1000, 1536, 712, dtype, layout=layout, **kw)
  run(p, variant, BACKEND.default_config(p, variant), platform="cuda")
