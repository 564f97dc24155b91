"""Collective matmuls (issue 46): rings of collective-permutes under the local GEMMs, on 8
host CPU devices, in a process of their own.

`tests/test_sharding.py::test_on_8_host_devices[rings]` runs this file (8 devices need
XLA_FLAGS before jax starts). Directly:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python -m pytest \
      tests/collective_matmul_on_8_devices.py

The layouts are the MLP's of `sharding_cost_on_8_devices.py` (whose float64 reference
and its error bound they reuse). With `overlap=True`:

* every move the plan makes over one mesh axis runs as a ring: the compiled program
  has collective-permutes and none of the all-gathers or reduce-scatters that the same
  program with `overlap=False` has;
* the results, forward and backward (jax.vjp under jit), match float64 within the
  dtype's GEMM tolerance, on fresh random inputs. A ring that put a chunk's rows in the
  wrong place, or summed a chunk twice, would be off by whole rows.

The programs run `backend="xla"` (XLA's dot per chunk): on a CPU mesh no interpreted
kernel can run inside the partitioned program (sharding_on_8_devices.py says why). The
GPU runs the same rings with the kernels (`bench/sharded.py`, rows `overlap`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from gemm_testing import TOLERANCES, assert_gemm_close, random_array, tolerance
from jaxgemm import sharding

if jax.device_count() < 8:
  pytest.skip(f"needs 8 devices, has {jax.devices()}: run through tests/test_sharding.py "
              f"(it sets XLA_FLAGS=--xla_force_host_platform_device_count=8)",
              allow_module_level=True)

import sharding_cost_on_8_devices as cost   # noqa: E402 (after the skip: it needs 8 devices)

F32, BF16 = np.float32, jnp.bfloat16
HIGHEST = lax.Precision.HIGHEST


def ours(dtype, overlap):
  precision = HIGHEST if dtype == F32 else None
  return lambda a, b: jaxgemm.matmul(a, b, precision=precision, backend="xla",
                                     overlap=overlap)


def _kinds(hlo: str) -> dict:
  return sharding.collective_totals(sharding.hlo_collectives(hlo))


def _training(matmul):
  def step(x, w1, w2, ct):
    y, vjp = jax.vjp(cost.mlp(matmul), x, w1, w2)
    return (y, *vjp(ct))
  return step


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_sequence_parallel_rings_replace_the_collectives_and_match_float64(dtype, rng):
  """Forward of the sequence-parallel MLP: x's rows go round the ring into W1's columns
  (all-gather + GEMM), and W2's row-parallel products are summed round it onto tokens
  (GEMM + reduce-scatter). The results match float64, and the program has permutes
  where overlap=False's has an all-gather and a reduce-scatter."""
  shape, names, x_spec, w1_spec, w2_spec, out_spec = cost.LAYOUTS["sequence-parallel"]
  mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,))
  x, w1, w2 = cost._operands(rng, dtype)
  specs = (x_spec, w1_spec, w2_spec)
  ring, placed = cost._compile(cost.mlp(ours(dtype, True)), mesh, (x, w1, w2), specs,
                               out_spec)
  plain, _ = cost._compile(cost.mlp(ours(dtype, False)), mesh, (x, w1, w2), specs, out_spec)
  assert set(_kinds(plain.as_text())) == {"all-gather", "reduce-scatter"}
  assert set(_kinds(ring.as_text())) == {"collective-permute"}
  out = ring(*placed)
  assert out.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 2), out.sharding
  ref, bound = cost.mlp_reference(x, w1, w2)
  assert_gemm_close(out, ref, bound, tolerance(dtype, precision=HIGHEST), "sequence-parallel")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_fsdp_weight_gathered_on_k_rings_partial_sums(dtype, rng):
  """FSDP: tokens and the weight's rows (K) both on "data"; the weight, smaller than the
  activation, is what moves. Its K chunks go round the ring, each meeting the same
  columns of x, and the partial products are summed in float32 on the device."""
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  x = random_array(rng, (512, 64), dtype)
  w = (random_array(rng, (64, 48), F32) / np.sqrt(64)).astype(dtype)
  placed = (jax.device_put(x, NamedSharding(mesh, P("data", None))),
            jax.device_put(w, NamedSharding(mesh, P("data", None))))

  def compiled(overlap):
    return jax.jit(ours(dtype, overlap)).lower(*placed).compile()
  assert set(_kinds(compiled(False).as_text())) == {"all-gather"}
  ring = compiled(True)
  assert set(_kinds(ring.as_text())) == {"collective-permute"}
  got = ring(*placed)
  assert got.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2), got.sharding
  x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
  assert_gemm_close(got, x64 @ w64, np.abs(x64) @ np.abs(w64),
                    tolerance(dtype, precision=HIGHEST), "fsdp-k")


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"], indirect=True)
def test_ring_gradients_match_float64(partitioner, rng):
  """The sequence-parallel MLP's y, dx, dW1, dW2 under jax.vjp: each backward GEMM's move
  is a ring of its own (dh = dy W2^T gathers dy's rows; dW1 = x^T dh and dW2 = a^T dy
  gather x and dy along the contracted tokens; dx reduce-scatters), and all four match
  float64."""
  shape, names, x_spec, w1_spec, w2_spec, out_spec = cost.LAYOUTS["sequence-parallel"]
  mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,))
  x, w1, w2, ct = cost._operands(rng, F32, with_ct=True)
  out_specs = (out_spec, x_spec, w1_spec, w2_spec)
  compiled, placed = cost._compile(_training(ours(F32, True)), mesh, (x, w1, w2, ct),
                                   (x_spec, w1_spec, w2_spec, out_spec), out_specs)
  kinds = _kinds(compiled.as_text())
  assert set(kinds) == {"collective-permute"}, kinds
  # Six GEMMs, each a ring of 8 devices: 7 permutes each.
  assert kinds["collective-permute"][0] == 6 * 7, kinds
  y, dx, dw1, dw2 = compiled(*placed)
  (ref_y, bound_y), grads = cost.mlp_reference(x, w1, w2, ct)
  tol = TOLERANCES["float32"]
  assert_gemm_close(y, ref_y, bound_y, tol, "y")
  for name, got in (("dx", dx), ("dW1", dw1), ("dW2", dw2)):
    assert_gemm_close(got, *grads[name], tol, name)


def test_dot_general_rings_and_the_default_keeps_xlas_collectives(rng):
  """`jaxgemm.dot_general(overlap=True)` rings like matmul; overlap=None (the default) runs
  XLA's all-gather (no ring has measured faster: jaxgemm.collective_matmul)."""
  mesh = jax.make_mesh((8,), ("tp",), axis_types=(AxisType.Auto,))
  x = random_array(rng, (64, 32), F32)
  w = random_array(rng, (32, 48), F32)
  placed = (jax.device_put(x, NamedSharding(mesh, P("tp", None))),
            jax.device_put(w, NamedSharding(mesh, P(None, "tp"))))
  dims = (((1,), (0,)), ((), ()))

  def compiled(overlap):
    fn = lambda a, b: jaxgemm.dot_general(a, b, dims, precision=HIGHEST, backend="xla",
                                          overlap=overlap)
    return jax.jit(fn).lower(*placed).compile()
  ring = compiled(True)
  assert set(_kinds(ring.as_text())) == {"collective-permute"}
  assert set(_kinds(compiled(None).as_text())) == {"all-gather"}
  got = ring(*placed)
  want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  assert_gemm_close(got, want, np.abs(x) @ np.abs(w), TOLERANCES["float32"], "dot_general")


@pytest.fixture
def partitioner(request):
  before = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
  yield request.param
  jax.config.update("jax_use_shardy_partitioner", before)


def test_fused_epilogue_and_glu_rings_match_float64(rng):
  """Issue 46: epilogues in the chunks. x on tokens meets column-sharded weights: with
  overlap=True, gelu(x @ W + b) + r (r column-sharded like the result, sliced to each
  chunk's rows) and silu(x @ Wg) * (x @ Wu) run one fused kernel per chunk of the ring,
  with only permutes in the program, forward and through jax.vjp, against float64."""
  mesh = jax.make_mesh((8,), ("tp",), axis_types=(AxisType.Auto,))
  x = random_array(rng, (64, 32), F32)
  w, wu = ((random_array(rng, (32, 128), F32) / np.sqrt(32)) for _ in range(2))
  b, r = random_array(rng, (128,), F32), random_array(rng, (64, 128), F32)
  specs = (P("tp", None), P(None, "tp"), P(None, "tp"), P("tp"), P(None, "tp"))
  placed = [jax.device_put(t, NamedSharding(mesh, s)) for t, s in zip((x, w, wu, b, r), specs)]
  epilogue = lambda x, w, wu, b, r: jaxgemm.matmul(x, w, bias=b, activation="gelu", residual=r,
                                                   precision=HIGHEST, backend="xla",
                                                   overlap=True)
  gated = lambda x, w, wu, b, r: jaxgemm.glu(x, w, wu, activation="silu", precision=HIGHEST,
                                             backend="xla", overlap=True)
  x64, w64, wu64, b64, r64 = (np.asarray(t, np.float64) for t in (x, w, wu, b, r))
  z = x64 @ w64 + b64
  gelu = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
  silu = (x64 @ w64) / (1 + np.exp(-(x64 @ w64)))
  tol = TOLERANCES["float32"]
  bound = 1.2 * (np.abs(x64) @ np.abs(w64) + np.abs(b64))
  for name, fn, want, bound in (
      ("epilogue", epilogue, gelu + r64, bound + np.abs(r64)),
      ("glu", gated, silu * (x64 @ wu64),
       1.2 * (np.abs(x64) @ np.abs(w64)) * (np.abs(x64) @ np.abs(wu64)) * 2)):
    compiled = jax.jit(fn).lower(*placed).compile()
    assert set(_kinds(compiled.as_text())) == {"collective-permute"}, (name, _kinds(
        compiled.as_text()))
    assert_gemm_close(compiled(*placed), want, bound, tol, name)
    # The backward's GEMMs ring too; its gradient matches the unsharded program's.
    grad = jax.jit(jax.grad(lambda x, w: fn(x, w, *placed[2:]).sum(), argnums=(0, 1)))
    plain = jax.grad(lambda x, w: fn(x, w, wu, b, r).sum(), argnums=(0, 1))
    for got, ref in zip(grad(*placed[:2]), plain(x, w)):
      np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-4)
