"""Sharded MLPs decided by cost (issue 44, item 4): 8 host CPU devices, own process.

`tests/test_sharding.py::test_on_8_host_devices[cost]` runs this file in a process of its
own (8 devices need XLA_FLAGS before jax starts). Directly:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python -m pytest \
      tests/sharding_cost_on_8_devices.py

For each standard layout of a transformer's MLP, gelu(x @ W1) @ W2 (Megatron tensor
parallel, sequence parallel, FSDP with the weights split on K or on N, and data x model),
jaxgemm's program

* matches the float64 reference, element by element, within the dtype's GEMM tolerance
  times a bound carried through the chain (`mlp_reference`), on fresh random inputs;
* moves no more collective bytes than the same expression written with jnp under the
  same shardings (`jaxgemm.sharding.collective_bytes` of each compiled HLO).

Forward and backward too, for SP and TP. The programs run `backend="xla"` (float32) and
the default `auto` (bfloat16): on a CPU mesh no interpreted kernel can run inside the
partitioned program (sharding_on_8_devices.py says why), and `auto` runs XLA's dot there.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm import sharding
from gemm_testing import TOLERANCES, as_f64, assert_gemm_close, random_array, tolerance

if jax.device_count() < 8:
  pytest.skip(f"needs 8 devices, has {jax.devices()}: run through tests/test_sharding.py "
              f"(it sets XLA_FLAGS=--xla_force_host_platform_device_count=8)",
              allow_module_level=True)

F32, BF16 = np.float32, jnp.bfloat16
HIGHEST = lax.Precision.HIGHEST
# Tokens, d_model, d_ff: W1 and W2 are twice x's size, so a rule that gathers a weight
# where XLA gathers the activation moves more bytes than jnp's program.
TOKENS, D, FF = 64, 32, 128

# name: (mesh shape, mesh axes, x spec, W1 spec, W2 spec, the result's spec)
LAYOUTS = {
    # Megatron tensor parallel: x whole, W1 on columns, W2 on rows; one all-reduce.
    "megatron-tp": ((8,), ("model",), P(), P(None, "model"), P("model", None), P()),
    # Sequence parallel: x on tokens too, the result back on tokens (issue 44's layout).
    "sequence-parallel": ((8,), ("model",), P("model", None), P(None, "model"),
                          P("model", None), P("model", None)),
    # FSDP: tokens on "data", each weight stored split on its K (rows) ...
    "fsdp-k": ((8,), ("data",), P("data", None), P("data", None), P("data", None),
               P("data", None)),
    # ... or on its N (columns).
    "fsdp-n": ((8,), ("data",), P("data", None), P(None, "data"), P(None, "data"),
               P("data", None)),
    # data x model: tokens on "data", Megatron's W1 columns and W2 rows on "model".
    "2d-data-model": ((2, 4), ("data", "model"), P("data", None), P(None, "model"),
                      P("model", None), P("data", None)),
}


def _max_abs(f) -> float:
  grid = np.linspace(-12, 12, 240001)
  return float(np.max(np.abs(f(grid))))


def gelu(h):
  """jax.nn.gelu's default (the tanh approximation), in float64."""
  return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))


def gelu_slope(h):
  t = np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3))
  return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * h * h)


# The largest |gelu'| and |gelu''|: how far an error in h can move gelu(h) and gelu'(h).
SLOPE = _max_abs(gelu_slope)                                          # 1.13
CURVE = _max_abs(lambda h: (gelu_slope(h + 1e-5) - gelu_slope(h - 1e-5)) / 2e-5)   # 0.80


def mlp_reference(x, w1, w2, ct=None):
  """float64 (y, bound) of y = gelu(x @ W1) @ W2, and with a cotangent `ct` also
  {name: (gradient, bound)} of dx, dW1, dW2 of <y, ct>.

  Each bound is carried through the chain to first order, from what every GEMM may
  err by (`tol` times |A| @ |B|, the GEMM tests' element-wise criterion) and every
  elementwise op by (`tol` times its value): with u = tol,
    h = x W1:              |dh| <= u Bh,             Bh = |x| |W1|
    a = gelu(h):           |da| <= u Ea,             Ea = SLOPE Bh + |a|
    y = a W2:              |dy| <= u (|a| + Ea) |W2|
    g = ct W2^T:           |dg| <= u Bg,             Bg = |ct| |W2^T|
    dh = g gelu'(h):       |ddh| <= u Edh,           Edh = SLOPE Bg + CURVE |g| Bh + |dh|
    dW2 = a^T ct, dW1 = x^T dh, dx = dh W1^T: the GEMM's own bound plus the carried error.
  so `assert_gemm_close(out, ref, bound, tol)` holds for tol = the dtype's GEMM tolerance.
  """
  x, w1, w2 = (as_f64(t) for t in (x, w1, w2))
  h = x @ w1
  a = gelu(h)
  bh = np.abs(x) @ np.abs(w1)
  ea = SLOPE * bh + np.abs(a)
  forward = (a @ w2, (np.abs(a) + ea) @ np.abs(w2))
  if ct is None:
    return forward
  ct = as_f64(ct)
  g = ct @ w2.T
  dh = g * gelu_slope(h)
  edh = SLOPE * (np.abs(ct) @ np.abs(w2.T)) + CURVE * np.abs(g) * bh + np.abs(dh)
  grads = {"dx": (dh @ w1.T, (np.abs(dh) + edh) @ np.abs(w1.T)),
           "dW1": (x.T @ dh, np.abs(x.T) @ (np.abs(dh) + edh)),
           "dW2": (a.T @ ct, (np.abs(a) + ea).T @ np.abs(ct))}
  return forward, grads


def mlp(matmul):
  return lambda x, w1, w2: matmul(jax.nn.gelu(matmul(x, w1)), w2)


def ours(dtype):
  """jaxgemm's matmul: `backend="xla"` at exact float32, the user's default call (`auto`)
  for bfloat16."""
  if dtype == F32:
    return lambda a, b: jaxgemm.matmul(a, b, precision=HIGHEST, backend="xla")
  return jaxgemm.matmul


def jnps(dtype):
  return (lambda a, b: jnp.matmul(a, b, precision=HIGHEST)) if dtype == F32 else jnp.matmul


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request):
  """Both of XLA's partitioners: Shardy reads the einsum rule, GSPMD the inference
  callback; each asks `sharding.plan` with the global shapes."""
  before = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
  yield request.param
  jax.config.update("jax_use_shardy_partitioner", before)


def _operands(rng, dtype, with_ct=False):
  x = random_array(rng, (TOKENS, D), dtype)
  w1 = (random_array(rng, (D, FF), F32) / np.sqrt(D)).astype(dtype)
  w2 = (random_array(rng, (FF, D), F32) / np.sqrt(FF)).astype(dtype)
  return (x, w1, w2, random_array(rng, (TOKENS, D), dtype)) if with_ct else (x, w1, w2)


def _compile(fn, mesh, operands, specs, out_specs):
  placed = [jax.device_put(t, NamedSharding(mesh, s)) for t, s in zip(operands, specs)]
  out = jax.tree.map(lambda s: NamedSharding(mesh, s), out_specs)
  return jax.jit(fn, out_shardings=out).lower(*placed).compile(), placed


def _gathered_elements(hlo: str) -> list[int]:
  """The element count of each all-gather's result (the CPU may gather bf16 as f32)."""
  return [int(np.prod([int(d) for d in dims.split(",") if d]))
          for kind, typ in sharding.hlo_collectives(hlo) if kind == "all-gather"
          for dims in re.findall(r"\[([\d,]*)\]", typ)]


def _no_more_bytes_than_jnp(hlo: str, jnp_hlo: str, what: str):
  mine, theirs = sharding.collective_bytes(hlo), sharding.collective_bytes(jnp_hlo)
  assert mine <= theirs, (
      f"{what}: jaxgemm's program moves {mine} collective bytes, jnp's {theirs}:\n"
      f"  jaxgemm: {sharding.collective_totals(sharding.hlo_collectives(hlo))}\n"
      f"  jnp:     {sharding.collective_totals(sharding.hlo_collectives(jnp_hlo))}")
  return mine, theirs


# Every layout in both dtypes on Shardy (jax's partitioner), in float32 on GSPMD: the
# rule's decision depends on the dtype only through the bytes, which scale alike.
CASES = [pytest.param(layout, dtype, partitioner, id=f"{partitioner}-{layout}-{name}")
         for partitioner, dtypes in (("shardy", ((F32, "float32"), (BF16, "bfloat16"))),
                                     ("gspmd", ((F32, "float32"),)))
         for layout in LAYOUTS for dtype, name in dtypes]


@pytest.mark.parametrize("layout, dtype, partitioner", CASES, indirect=["partitioner"])
def test_mlp_layout_matches_float64_and_moves_no_more_than_jnp(layout, dtype, partitioner, rng):
  """The forward of each layout: correct, and no more collective bytes than jnp's."""
  shape, names, x_spec, w1_spec, w2_spec, out_spec = LAYOUTS[layout]
  mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
  x, w1, w2 = _operands(rng, dtype)
  specs = (x_spec, w1_spec, w2_spec)
  compiled, placed = _compile(mlp(ours(dtype)), mesh, (x, w1, w2), specs, out_spec)
  out = compiled(*placed)
  assert out.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 2), out.sharding
  ref, bound = mlp_reference(x, w1, w2)
  assert_gemm_close(out, ref, bound, tolerance(dtype, precision=HIGHEST), layout)
  jnp_compiled, _ = _compile(mlp(jnps(dtype)), mesh, (x, w1, w2), specs, out_spec)
  _no_more_bytes_than_jnp(compiled.as_text(), jnp_compiled.as_text(), layout)
  if layout == "sequence-parallel":
    # Issue 44: never gather a weight larger than the activation it meets.
    assert max(_gathered_elements(compiled.as_text())) <= x.size, (
        _gathered_elements(compiled.as_text()))


@pytest.mark.parametrize("layout", ["sequence-parallel", "megatron-tp"])
def test_mlp_forward_and_backward_match_float64_and_move_no_more_than_jnp(layout,
                                                                          partitioner, rng):
  """y, dx, dW1 and dW2 of <y, ct> (jax.vjp), each gradient stored as its primal is:
  correct to float64 within the float32 tolerance, and no more collective bytes than jnp's
  program of the same training step."""
  shape, names, x_spec, w1_spec, w2_spec, out_spec = LAYOUTS[layout]
  mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
  x, w1, w2, ct = _operands(rng, F32, with_ct=True)
  specs = (x_spec, w1_spec, w2_spec, out_spec)

  def training(matmul):
    def step(x, w1, w2, ct):
      y, vjp = jax.vjp(mlp(matmul), x, w1, w2)
      return (y, *vjp(ct))
    return step
  out_specs = (out_spec, x_spec, w1_spec, w2_spec)
  compiled, placed = _compile(training(ours(F32)), mesh, (x, w1, w2, ct), specs, out_specs)
  y, dx, dw1, dw2 = compiled(*placed)
  (ref_y, bound_y), grads = mlp_reference(x, w1, w2, ct)
  tol = TOLERANCES["float32"]
  assert_gemm_close(y, ref_y, bound_y, tol, f"{layout} y")
  for name, got in (("dx", dx), ("dW1", dw1), ("dW2", dw2)):
    assert_gemm_close(got, *grads[name], tol, f"{layout} {name}")
  jnp_compiled, _ = _compile(training(jnps(F32)), mesh, (x, w1, w2, ct), specs, out_specs)
  _no_more_bytes_than_jnp(compiled.as_text(), jnp_compiled.as_text(), f"{layout} fwd+bwd")


@pytest.mark.parametrize("layout", ["sequence-parallel", "fsdp-n", "2d-data-model"])
def test_accelerated_jnp_mlp_matches_float64_and_moves_no_more_than_jnp(layout, rng):
  """Issue 47: `jaxgemm.accelerate` of the MLP written with jnp (no jaxgemm call inside)
  partitions like jnp's program: its dots became jaxgemm's primitive, its result matches
  float64, and its program moves no more collective bytes."""
  shape, names, x_spec, w1_spec, w2_spec, out_spec = LAYOUTS[layout]
  mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
  x, w1, w2 = _operands(rng, F32)
  specs = (x_spec, w1_spec, w2_spec)
  plain = mlp(jnps(F32))
  fast = jaxgemm.accelerate(plain, backend="xla")
  assert "jaxgemm_matmul" in str(jax.make_jaxpr(fast)(x, w1, w2))
  compiled, placed = _compile(fast, mesh, (x, w1, w2), specs, out_spec)
  ref, bound = mlp_reference(x, w1, w2)
  assert_gemm_close(compiled(*placed), ref, bound, tolerance(F32, precision=HIGHEST), layout)
  jnp_compiled, _ = _compile(plain, mesh, (x, w1, w2), specs, out_spec)
  _no_more_bytes_than_jnp(compiled.as_text(), jnp_compiled.as_text(), f"accelerate {layout}")
