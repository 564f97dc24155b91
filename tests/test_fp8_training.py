"""The FP8 training path, `jaxgemm.matmul(x, w, fp8=recipe)`, on every scaled_matmul backend.

Each GEMM of the path (forward, dgrad, wgrad) is checked against the float64
product of its operands as the recipe quantizes them (`jaxgemm.quantize`, tested
in test_scaled_matmul.py, with the blocks the recipe names), at
test_scaled_matmul's tolerance: that checks the wiring (which operand, which
blocks, which transpose, which scale) exactly. Against the unquantized float64
product the error is the quantization's: e4m3 rounds to 3 mantissa bits (at
most 2**-4 relative per element, about 0.026 rms for normal data) and e5m2 to
2 (0.052 rms); two operands' errors add in quadrature, so the relative
Frobenius error of a product is about 0.037 (e4m3 x e4m3) and 0.058 (e5m2 x
e4m3): QUANT_TOL allows 1.5x that.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxgemm
from gemm_testing import as_f64
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe
from test_scaled_matmul import BF16, F32, check, dequantized, reference

BACKENDS = jaxgemm.backends("scaled_matmul")
RECIPES = ["tensor", "block",
           pytest.param(Fp8Recipe("tensor", grad_dtype="float8_e5m2", scale_dtype="float32"),
                        id="tensor-f32-scales")]
QUANT_TOL = {"float8_e4m3fn": 1.5 * 0.037, "float8_e5m2": 1.5 * 0.058}


def inputs(rng, m=48, k=256, n=192, dtype=BF16, lead=()):
  x = rng.standard_normal((*lead, m, k))
  w = rng.standard_normal((k, n)) / np.sqrt(k)
  dy = rng.standard_normal((*lead, m, n))
  return (jnp.asarray(x, dtype), jnp.asarray(w, dtype), jnp.asarray(dy, dtype))


def quantized(recipe, x, role):
  """The float64 dequantized values of x as the recipe quantizes the operand `role`."""
  dtype = recipe.grad_dtype if role.startswith("dy") else recipe.dtype
  q, s = jaxgemm.quantize(x, dtype, recipe.blocks(role), scale_dtype=recipe.scale_dtype)
  return dequantized(q, s.astype(F32), recipe.blocks(role))


def rel_err(out, ref):
  return np.linalg.norm(as_f64(out) - ref) / np.linalg.norm(ref)


def _recipe_backend_pairs():
  """Every (recipe, backend); on the CPU the Pallas kernel (25-30 s a recipe in Mosaic
  GPU's interpreter) checks the block recipe, the GPU tier every recipe."""
  pairs = []
  for recipe in RECIPES:
    recipe = recipe if isinstance(recipe, type(pytest.param(None))) else pytest.param(
        recipe, id=recipe)
    for backend in BACKENDS:
      slow = backend == "pallas" and recipe.id != "block"
      pairs.append(pytest.param(*recipe.values, backend, id=f"{recipe.id}-{backend}",
                                marks=[pytest.mark.slow] if slow else []))
  return pairs


@pytest.mark.parametrize("fp8,backend", _recipe_backend_pairs())
def test_forward_dgrad_wgrad_are_the_recipes_fp8_gemms(backend, fp8, rng):
  """y, dX and dW each equal the float64 GEMM of the recipe's quantized operands."""
  x, w, dy = inputs(rng)
  recipe = Fp8Recipe.named(fp8)
  f = jax.jit(lambda x, w: jaxgemm.matmul(x, w, fp8=fp8, backend=backend))
  y, vjp = jax.vjp(f, x, w)
  dx, dw = jax.jit(vjp)(dy)
  assert (y.dtype, dx.dtype, dw.dtype) == (BF16, BF16, BF16)
  x64, w64, dy64 = quantized(recipe, x, "x"), quantized(recipe, w, "w"), quantized(recipe, dy, "dy")
  xw64, dyw64 = quantized(recipe, x, "x_wgrad"), quantized(recipe, dy, "dy_wgrad")
  check(y, *reference(x64, w64), BF16, "forward")
  check(dx, *reference(dy64, w64.T), BF16, "dgrad")
  check(dw, *reference(xw64.T, dyw64), BF16, "wgrad")
  # And near the unquantized products, within the quantization's error.
  xf, wf, dyf = as_f64(x), as_f64(w), as_f64(dy)
  assert rel_err(y, xf @ wf) < QUANT_TOL[recipe.dtype]
  assert rel_err(dx, dyf @ wf.T) < QUANT_TOL[recipe.grad_dtype]
  assert rel_err(dw, xf.T @ dyf) < QUANT_TOL[recipe.grad_dtype]


@pytest.mark.parametrize("fp8", RECIPES)
def test_batched_x_and_1d_x_join_m(fp8, rng):
  """Leading dimensions of x join M (one quantization over all rows); a 1-D x is one row."""
  x, w, dy = inputs(rng, m=8, lead=(2, 3))
  y = jaxgemm.matmul(x, w, fp8=fp8, backend="xla")
  flat = jaxgemm.matmul(x.reshape(-1, x.shape[-1]), w, fp8=fp8, backend="xla")
  np.testing.assert_array_equal(y.reshape(flat.shape), flat)
  dx = jax.grad(lambda x: (jaxgemm.matmul(x, w, fp8=fp8).astype(F32) * dy).sum())(x)
  assert dx.shape == x.shape and dx.dtype == x.dtype
  v = jaxgemm.matmul(x[0, 0, 0], w, fp8=fp8, backend="xla")
  assert v.shape == (w.shape[1],)
  np.testing.assert_array_equal(v, jaxgemm.matmul(x[0, 0, :1], w, fp8=fp8, backend="xla")[0])


def assert_same_entry(got, want, what=""):
  """Bit for bit on the CPU. On the GPU a batched GEMM may run another kernel than its
  entries' (cuBLAS or ours, other accumulation orders): one bf16 rounding, norm-wise
  (vmap_probe.py, the fp8-fused-quant probe's run12-vmap at 26b6419, H100:
  elements up to 0.0156 apart,
  with either quantizer). A per-tensor scale shared across the entries puts the 1/64 entry 1.25% off
  (3x the bound), as the flattened batch quantizes it."""
  if jax.default_backend() == "cpu":
    np.testing.assert_array_equal(np.asarray(got, F32), np.asarray(want, F32), err_msg=what)
  else:
    assert rel_err(got, as_f64(want)) <= 2.0**-8, what


@pytest.mark.parametrize("fp8", RECIPES)
def test_vmap_quantizes_each_entry(fp8, rng):
  """vmap over x (or w) runs the function per entry: each entry its own scales (entries
  64x apart in magnitude, so that a shared scale would show)."""
  x, w, dy = inputs(rng, m=16, lead=(3,))
  x = x * jnp.asarray([1.0, 64.0, 1 / 64], BF16)[:, None, None]
  f = lambda x, w: jaxgemm.matmul(x, w, fp8=fp8, backend="xla")
  out = jax.vmap(f, in_axes=(0, None))(x, w)
  for i in range(3):
    assert_same_entry(out[i], f(x[i], w), f"entry {i}")
  ws = jnp.stack([w, 64 * w])
  out = jax.jit(jax.vmap(f, in_axes=(None, 0)))(x[0], ws)
  assert_same_entry(out[1], f(x[0], ws[1]), "vmap over w")
  g = jax.vmap(jax.grad(lambda w, x: f(x, w).astype(F32).sum()), in_axes=(None, 0))(w, x)
  assert_same_entry(g[2], jax.grad(lambda w: f(x[2], w).astype(F32).sum())(w), "grad")


@pytest.mark.parametrize("fp8", RECIPES)
def test_triton_quantizer_gives_the_same_step(fp8, rng):
  """quantize_backend="triton" (one cast-transpose kernel a tensor, Triton's interpreter
  on the CPU) gives the xla quantizer's y, dX and dW, under jit and vmap: bit for bit on
  the CPU (the same fp8 operands reach the same GEMMs). On the GPU, XLA's block-scaled
  quantize is not bit-equal to the kernel (the fp8-fused-quant probe's run8b at 21b052b; its
  diff_probe.py says which elements), so there the results agree to 2**-9 norm-wise,
  a bf16 rounding. (Ragged M, K, N: partial tiles.)"""
  pytest.importorskip("triton")
  x, w, dy = inputs(rng, m=70, k=200, n=136)
  backend = "xla" if jax.default_backend() == "cpu" else "auto"
  results = []
  for quantizer in ("xla", "triton"):
    recipe = dataclasses.replace(Fp8Recipe.named(fp8), quantize_backend=quantizer)
    f = jax.jit(lambda x, w, r=recipe: jaxgemm.matmul(x, w, fp8=r, backend=backend))
    y, vjp = jax.vjp(f, x, w)
    vmapped = jax.vmap(f, in_axes=(0, None))(x.reshape(2, 35, -1), w)
    results.append((y, *vjp(dy), vmapped))
  for got, want, what in zip(results[1], results[0], ("y", "dx", "dw", "vmap")):
    if jax.default_backend() == "cpu":
      np.testing.assert_array_equal(np.asarray(got, F32), np.asarray(want, F32), err_msg=what)
    else:
      assert rel_err(got, as_f64(want)) <= 2.0**-9, what


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), F32])
def test_input_dtypes_give_their_gradients(dtype, rng):
  x, w, dy = inputs(rng, dtype=dtype)
  y, vjp = jax.vjp(lambda x, w: jaxgemm.matmul(x, w, fp8="tensor", backend="xla"), x, w)
  dx, dw = vjp(dy)
  assert (y.dtype, dx.dtype, dw.dtype) == (dtype,) * 3
  y32 = jaxgemm.matmul(x, w, fp8="block", preferred_element_type=F32, backend="xla")
  assert y32.dtype == F32
  assert rel_err(y32, as_f64(x) @ as_f64(w)) < QUANT_TOL["float8_e4m3fn"]


def test_epilogue_runs_after_the_fp8_gemm(rng):
  """bias, activation and residual apply to the FP8 GEMM's result (and differentiate)."""
  x, w, dy = inputs(rng)
  b = jnp.asarray(rng.standard_normal(w.shape[1]), BF16)
  y = jaxgemm.matmul(x, w, fp8="block", bias=b, activation="gelu", residual=dy, backend="xla")
  plain = jaxgemm.matmul(x, w, fp8="block", backend="xla")
  np.testing.assert_array_equal(y, jax.nn.gelu(plain + b) + dy)
  gb = jax.grad(lambda b: jaxgemm.matmul(x, w, fp8="block", bias=b, activation="relu")
                .astype(F32).sum())(b)
  assert gb.shape == b.shape and bool(jnp.all(jnp.isfinite(gb)))


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf])
def test_one_nan_spreads_as_far_as_its_scale(bad):
  """Fp8Recipe's documented NaN/Inf semantics (XLA's GEMMs: the scales decide it): per
  tensor a single bad value of x or w makes the whole output NaN; with blocks, the
  outputs its block feeds (x's 1x128 block: its row; w's 128x128 block: its columns)."""
  x, w = jnp.ones((32, 256), BF16), jnp.ones((256, 384), BF16)
  nan_at = lambda x, w, fp8: np.isnan(np.asarray(
      jaxgemm.matmul(x, w, fp8=fp8, backend="xla"), F32))
  for bad_x, bad_w in ((x.at[3, 200].set(bad), w), (x, w.at[10, 300].set(bad))):
    assert nan_at(bad_x, bad_w, "tensor").all()
  rows, cols = np.nonzero(nan_at(x.at[3, 200].set(bad), w, "block"))
  assert set(rows) == {3} and len(cols) == 384
  rows, cols = np.nonzero(nan_at(x, w.at[10, 300].set(bad), "block"))
  assert len(set(rows)) == 32 and set(cols) == set(range(256, 384))


def test_recipes():
  assert Fp8Recipe.named("tensor") == Fp8Recipe("tensor", grad_dtype=jnp.float8_e5m2,
                                                scale_dtype=jnp.float8_e8m0fnu)
  assert Fp8Recipe.named("block").grad_dtype == "float8_e4m3fn"
  recipe = Fp8Recipe("block", dtype=jnp.float8_e5m2)
  assert recipe.dtype == "float8_e5m2" and hash(recipe) == hash(dataclasses.replace(recipe))
  assert Fp8Recipe.named(recipe) is recipe


def test_auto_quantizer_is_the_kernel_on_a_gpu(monkeypatch):
  """"auto" takes the Triton cast-transpose on a GPU (it partitions with its operand:
  tests/sharding_on_8_devices.py) and XLA's quantizer on the CPU, where the kernel
  would run in Triton's interpreter."""
  recipe = Fp8Recipe.named("tensor")
  assert recipe.quantize_backend == "auto" == Fp8Recipe.named("block").quantize_backend
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert recipe._quantizer() == "xla"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert recipe._quantizer() == "triton" == Fp8Recipe.named("block")._quantizer()
  assert dataclasses.replace(recipe, quantize_backend="xla")._quantizer() == "xla"


def test_out_sharding_is_the_results_and_the_gradients_keep_their_primals(rng):
  """out_sharding as jnp.matmul takes it, in matmul(..., fp8=) and scaled_matmul (here a
  1-device Explicit mesh; 8 devices: tests/sharding_on_8_devices.py): the result's
  type, the same values, gradients typed as their primals; and jax's own error for a
  PartitionSpec with no mesh set."""
  x, w, _ = inputs(rng, m=16)
  f = lambda x, w, **kw: jaxgemm.matmul(x, w, fp8="block", backend="xla", **kw)
  (x8, sx), (w8, sw) = jaxgemm.quantize(x), jaxgemm.quantize(w)
  scaled = lambda **kw: jaxgemm.scaled_matmul(x8, w8, sx, sw, backend="xla", **kw)
  want = f(x, w)
  with jax.set_mesh(jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))):
    xs = jax.device_put(x, P("d", None))
    y = jax.jit(lambda x, w: f(x, w, out_sharding=P(None, "d")))(xs, w)
    dx, dw = jax.grad(lambda x, w: f(x, w, out_sharding=P(None, "d")).astype(F32).sum(),
                      (0, 1))(xs, w)
    assert jax.typeof(scaled(out_sharding=P(None, "d"))).sharding.spec == P(None, "d")
  assert jax.typeof(y).sharding.spec == P(None, "d")
  assert (jax.typeof(dx).sharding.spec, jax.typeof(dw).sharding.spec) == (P("d", None),
                                                                          P(None, None))
  np.testing.assert_array_equal(np.asarray(y, F32), np.asarray(want, F32))
  for call in (lambda: f(x, w, out_sharding=P("d", None)),
               lambda: scaled(out_sharding=P("d", None))):
    with pytest.raises(ValueError, match="set_mesh"):   # jnp.matmul's error
      call()


@pytest.mark.parametrize("call,error,match", [
    (lambda x, w: jaxgemm.matmul(x, w, fp8="rows"), ValueError, "fp8='rows' must be"),
    (lambda x, w: Fp8Recipe("rows"), ValueError, "scaling='rows' must be one of"),
    (lambda x, w: Fp8Recipe(dtype=jnp.bfloat16), TypeError, "dtype=.* must be one of"),
    (lambda x, w: Fp8Recipe(scale_dtype=jnp.bfloat16), TypeError,
     "scale_dtype=.* must be one of"),
    (lambda x, w: Fp8Recipe(quantize_backend="pallas"), ValueError,
     "quantize_backend='pallas' must be one of"),
    (lambda x, w: jaxgemm.matmul(x, w[None], fp8="block"), ValueError, "2-D weight b"),
    (lambda x, w: jaxgemm.matmul(x[:, :7], w, fp8="block"), ValueError, r"a \(\.\.\., K\)"),
    (lambda x, w: jaxgemm.matmul(x.astype(jnp.float8_e4m3fn), w, fp8="block"), TypeError,
     "a.dtype=float8_e4m3fn"),
    (lambda x, w: jaxgemm.matmul(x.astype(jnp.int8), w, fp8="block"), TypeError, "a.dtype=int8"),
    (lambda x, w: jaxgemm.matmul(x, w, fp8="block", variant="blocked"), ValueError,
     "takes no variant"),
    (lambda x, w: jaxgemm.matmul(x, w, fp8="block", precision="highest"), ValueError,
     "takes no precision"),
    (lambda x, w: jaxgemm.matmul(x, w, fp8=Fp8Recipe(backend="xla"), backend="triton"),
     ValueError, "name the backend once"),
    (lambda x, w: jaxgemm.matmul(x, w, fp8="block", preferred_element_type=jnp.int32),
     TypeError, "preferred_element_type"),
    (lambda x, w: jaxgemm.matmul(x, w, fp8="block", bias=jnp.zeros(3, BF16)), ValueError,
     "bias must have shape"),
])
def test_bad_arguments_are_named(call, error, match, rng):
  x, w, _ = inputs(rng, m=4)
  with pytest.raises(error, match=match):
    call(x, w)
