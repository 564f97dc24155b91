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

from gemm_testing import as_f64, assert_gemm_close, random_array, tolerance
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.pallas import PallasFusedMatmul
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.matmul.pallas import PallasConfig

BACKEND = PallasFusedMatmul()
pytestmark = pytest.mark.skipif(BACKEND.unavailable_reason() is not None,
                                reason=str(BACKEND.unavailable_reason()))

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
# The smallest tiles the two-consumer rungs take (the interpreter's time grows with tiles).
TINY = PallasConfig(tile_m=128, tile_n=64, tile_k=64, max_concurrent_steps=2, epi_tile_n=64)
TINY_CLUSTERS = dataclasses.replace(TINY, cluster_n=2)


def on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


def _problem(batch, m, n, k, dtype=BF16, out_dtype=None, *, layout="NN", **kw):
  return FusedMatmulProblem(batch, m, n, k, np.dtype(dtype), np.dtype(out_dtype or dtype), F32,
                            layout[0] == "T", layout[1] == "T", None, **kw)


def _f64(fn, name, z):
  with jax.enable_x64(True):
    return np.asarray(fn(name, jnp.asarray(z, jnp.float64)))


def _op(x, trans):
  return np.swapaxes(x, 1, 2) if trans else x


# The in-kernel derivatives' largest absolute error in fp32 against float64, on
# test_activation_formulas' 400001 points of [-12, 12]: gelu' 3.5e-6 at z = -4.87
# (0.5 (1 + t) + 0.5 z (1 + t)(1 - t) du with t -> -1: a few ulps of tanh near -1,
# times |z du| ~ 13), the others <= 7.3e-7. Absolute, not relative to g: where g'
# cancels towards 0 (gelu' ~ -3e-5 at z = -4.5) it is a large part of g.
GATE_DERIVATIVE_ABS_ERR = 4e-6


def reference(problem, a, b, extras, tol):
  """([outputs], [element-wise bounds]) in float64: |A| @ |B| for the product (x 1.2,
  the largest |act'|, through an activation), plus the added terms' magnitudes and
  the result's own (its rounding at the store). Bounds are compared as tol * bound."""
  a64, b64 = as_f64(a), as_f64(b)
  ex = [as_f64(x) for x in extras]
  if problem.gate in ("lhs", "rhs"):   # gated operand rounded to its dtype, as the contract says
    g = _f64(activations.derivative, problem.gate_activation, ex[0])
    if problem.gate == "lhs":
      a64 = as_f64(jnp.asarray(a64 * g, np.float32).astype(problem.dtype))
    else:
      b64 = as_f64(jnp.asarray(b64 * g, np.float32).astype(problem.dtype))
  acc = _op(a64, problem.trans_a) @ _op(b64, problem.trans_b)
  mag = np.abs(_op(a64, problem.trans_a)) @ np.abs(_op(b64, problem.trans_b))
  if problem.gate == "out":
    # out = round(g32 * acc32): the product's error, |g| * (|A| @ |B|) relative, the
    # store's rounding, relative to |out| (|g * acc| here, the same to within the
    # error itself), and the kernel's fp32 g, off by up to GATE_DERIVATIVE_ABS_ERR
    # absolutely, times |acc| <= |A| @ |B|. That last error does not scale with the
    # output dtype's tol, so it enters as itself (/ tol). H100 GPU tier, bf16, gelu',
    # z = -4.5: g32 = -3.139e-5 against -2.932e-5, |acc| = 7.55, |A| @ |B| = 41.1:
    # the output off by 1.5e-5 where tol * (|g| |A| @ |B| + |out|) is 1.43e-5.
    g = _f64(activations.derivative, problem.gate_activation, ex[0])
    return [g * acc], [(np.abs(g) + GATE_DERIVATIVE_ABS_ERR / tol) * mag + np.abs(g * acc)]
  if problem.gate:
    return [acc], [mag + np.abs(acc)]
  z, zmag = acc, mag
  if problem.bias:
    bias = ex.pop(0)
    bias = bias[None, None, :] if problem.bias == "shared" else bias[:, None, :]
    z, zmag = z + bias, zmag + np.abs(bias)
  y = _f64(activations.apply, problem.activation, z) if problem.activation else z
  ymag = 1.2 * zmag
  if problem.residual:
    res = ex.pop(0)
    y, ymag = y + res, ymag + np.abs(res)
  ymag = ymag + np.abs(y)
  return ([y, z], [ymag, zmag + np.abs(z)]) if problem.save_preactivation else ([y], [ymag])


def run(problem, variant="warp_specialized", config=TINY, *, seed=0, gate_dtype=None,
        platform="cpu"):
  rng = np.random.default_rng(seed)
  a = random_array(rng, problem.a_shape, problem.dtype)
  b = random_array(rng, problem.b_shape, problem.dtype)
  dtypes = ([gate_dtype or problem.out_dtype] if problem.gate
            else [problem.out_dtype] * len(problem.extra_shapes))
  extras = [random_array(rng, s, d) for s, d in zip(problem.extra_shapes, dtypes)]
  BACKEND.check(problem, variant, config)
  out = jax.jit(BACKEND.impl(problem, variant, config, platform))(a, b, *extras)
  outs = out if problem.num_outputs > 1 else (out,)
  assert len(outs) == problem.num_outputs
  tol = tolerance(problem.dtype, problem.out_dtype)
  refs, bounds = reference(problem, a, b, extras, tol)
  for name, o, r, bound in zip(("y", "z"), outs, refs, bounds):
    assert o.shape == problem.out_shape and o.dtype == problem.out_dtype
    assert_gemm_close(o, r, bound, tol, f"{problem.describe()} {variant} {name}")


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
    ref = _f64(theirs, name, z)
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
