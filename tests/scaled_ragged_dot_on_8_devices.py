"""scaled_ragged_dot partitions on 8 host CPU devices: tokens local, experts expert-parallel.

`tests/test_scaled_ragged_dot.py::test_partitions_on_8_host_devices` runs this file in
a process of its own (as tests/test_sharding.py runs sharding_on_8_devices.py). Directly:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python -m pytest \
      tests/scaled_ragged_dot_on_8_devices.py

`backend="xla"` (no interpreted kernel runs in a partitioned CPU program); the local
problems each kernel lowering received are recorded and checked. The result is checked
against float64 of the dequantized operands, as the one-device tests are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm import sharding
from gemm_testing import as_f64, assert_gemm_close
from test_scaled_ragged_dot import (XLA_ACC, OUT_STEP, RAGGED_K, case_operands,
                                    ragged_k_operands, ragged_k_reference, reference)

if jax.device_count() < 8:
  pytest.skip(f"needs 8 devices, has {jax.devices()}: run through "
              f"tests/test_scaled_ragged_dot.py (it sets "
              f"XLA_FLAGS=--xla_force_host_platform_device_count=8)", allow_module_level=True)

F32 = np.dtype(np.float32)
TOL = OUT_STEP[F32] + XLA_ACC
# 8 experts, one empty, 5 of the 64 rows routed to none; K and N two 128-blocks each.
SIZES = np.array([9, 4, 1, 0, 7, 20, 3, 15], np.int32)
M, K, N, G = 64, 256, 256, len(SIZES)


def _mesh(shape, names):
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


@pytest.fixture
def partitioner(request):
  """One of XLA's partitioners (the case's): Shardy reads the einsum rule, GSPMD the
  inference callback."""
  before = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
  yield request.param
  jax.config.update("jax_use_shardy_partitioner", before)


def float_gathers(hlo: str) -> list[str]:
  """The all-gathers of floating arrays; the group bounds' few int32 may move."""
  import re   # noqa: PLC0415
  return re.findall(r"= (?:f64|f32|bf16|f16|f8\w*)\[[^\]]*\][^=]*? all-gather(?:-start)?\(",
                    hlo)


# (lhs spec, rhs spec, mesh): tokens (M) sharded, experts (G) sharded (expert
# parallelism), both on a 2x4 mesh, and each expert's N split (tensor parallel).
LAYOUTS = {
    "tokens": (P("d", None), P(None, None, None), ((8,), ("d",))),
    "experts": (P(None, None), P("d", None, None), ((8,), ("d",))),
    "tokens-and-experts": (P("x", None), P("y", None, None), ((2, 4), ("x", "y"))),
    "experts-and-columns": (P(None, None), P("x", None, "y"), ((2, 4), ("x", "y"))),
    # K split (32 per device, inside one 128-block): partial sums, one all-reduce
    "k": (P(None, "d"), P(None, "d", None), ((8,), ("d",))),
}


def _scale_specs(kind, lhs_spec, rhs_spec):
  """The scales sharded with their operands: per row with lhs's M, per column with rhs's G
  and N; block scales with their operand's M or G (their block factors stay whole)."""
  m, (g, _, n) = lhs_spec[0], rhs_spec   # a split K: block scales sliced per device
  return {"tensor": (P(), P()), "row_col": (P(m, None), P(g, None, n)),
          "block": (P(m, None), P(g, None, None))}[kind]


# Block scales (the ones sliced per device) on every layout; the other kinds where
# their scales are sharded most ways; GSPMD on the layouts that reduce. (Each case
# compiles an 8-device program: about 1 s.)
CASES = ([("shardy", "block", layout) for layout in LAYOUTS]
         + [("shardy", "row_col", "experts-and-columns"), ("shardy", "tensor", "experts"),
            ("gspmd", "row_col", "tokens-and-experts")])


@pytest.mark.parametrize("partitioner, kind, layout",
                         [pytest.param(*c, id="-".join(c)) for c in CASES],
                         indirect=["partitioner"])
def test_tokens_local_and_experts_parallel(partitioner, kind, layout):
  """Each layout against float64 of the dequantized operands; no operand gathered; the
  experts' (or K's) axis summed with one all-reduce; each device's local problem holds its own
  rows and experts."""
  lhs_spec, rhs_spec, (shape, names) = LAYOUTS[layout]
  mesh = _mesh(shape, names)
  rng = np.random.default_rng(0)
  (x, w, sx, sw), (x64, w64) = case_operands(rng, kind, kind, jnp.float8_e4m3fn,
                                             jnp.float8_e5m2, m=M, k=K, n=N, groups=G)
  specs = (lhs_spec, rhs_spec, P(rhs_spec[0]), *_scale_specs(kind, lhs_spec, rhs_spec))
  placed = [jax.device_put(a, NamedSharding(mesh, s))
            for a, s in zip((x, w, jnp.asarray(SIZES), sx, sw), specs)]
  fn = lambda x, w, sizes, sx, sw: jaxgemm.scaled_ragged_dot(x, w, sizes, sx, sw,
                                                            out_dtype=F32, backend="xla")
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(fn).lower(*placed).compile()
  out = compiled(*placed)
  assert_gemm_close(out, *reference(x64, w64, SIZES), TOL, f"{layout} {kind}")
  assert not np.any(as_f64(out)[SIZES.sum():])
  hlo = compiled.as_text()
  assert not float_gathers(hlo), float_gathers(hlo)
  reduces = rhs_spec[0] is not None or rhs_spec[1] is not None
  assert ("all-reduce" in hlo or "reduce-scatter" in hlo) == reduces
  local = [r.problem for r in seen if r.problem.op == "scaled_ragged_dot"]
  size = dict(zip(names, shape))
  shards = lambda axis: 1 if axis is None else size[axis]
  assert local and all(
      (p.m, p.groups, p.k, p.n, p.scale_kind) == (M // shards(lhs_spec[0]),
                                                   G // shards(rhs_spec[0]),
                                                   K // shards(rhs_spec[1]),
                                                   N // shards(rhs_spec[2]), kind)
      for p in local), local


@pytest.mark.parametrize("fp8", ["tensor", "block"])
@pytest.mark.parametrize("layout", ["tokens", "experts"])
def test_the_fp8_training_path_partitions(layout, fp8):
  """`jaxgemm.ragged_dot(fp8=)` sharded, its loss and gradients as on one device (per tensor,
  the amax reduced over every shard): tokens stay local, the experts' weights are not
  gathered (expert parallelism), and no bf16 or fp8 operand is gathered at all."""
  lhs_spec, rhs_spec, (shape, names) = LAYOUTS[layout]
  mesh = _mesh(shape, names)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((G, K, N)) / np.sqrt(K), jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal((M, N)), jnp.bfloat16)

  def loss(x, w, sizes, dy):
    y = jaxgemm.ragged_dot(x, w, sizes, fp8=fp8, backend="xla")
    return (y.astype(F32) * dy.astype(F32)).sum()
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  want = step(x, w, jnp.asarray(SIZES), dy)
  placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in
            zip((x, w, jnp.asarray(SIZES), dy), (lhs_spec, rhs_spec, P(rhs_spec[0]), lhs_spec))]
  compiled = step.lower(*placed).compile()
  got = compiled(*placed)
  for g, v, what in zip(jax.tree.leaves(got), jax.tree.leaves(want), ("loss", "dx", "dw")):
    # the shards' partial sums add in another order: bf16's rounding, norm-wise
    err = np.linalg.norm(as_f64(g) - as_f64(v)) / np.linalg.norm(as_f64(v))
    assert err <= 2.0**-8, (what, err)
  assert not float_gathers(compiled.as_text()), float_gathers(compiled.as_text())


# The ragged-K form (lhs (M, K), rhs (M, N), scales of 128 tokens): (lhs spec, rhs spec,
# the sizes' spec, mesh, M). Tokens sharded into 48 rows a device (devices 2 and 5 hold
# rows across a 128-row block's edge: each device's rows placed on the global grid) and
# into 128 (whole blocks);
# experts sharded (each device its own groups' blocks of the result); K and N split.
RAGGED_K_LAYOUTS = {
    "tokens-in-blocks": (P("d", None), P("d", None), P(None), ((8,), ("d",)), 384),
    "tokens-whole-blocks": (P("d", None), P("d", None), P(None), ((8,), ("d",)), 1024),
    "experts": (P(None, None), P(None, None), P("d"), ((8,), ("d",)), 64),
    "k-and-n": (P(None, "x"), P(None, "y"), P(None), ((2, 4), ("x", "y")), 64),
}


# Block scales on every layout; per tensor (scales not sharded) on one.
RAGGED_K_CASES = [(layout, "block") for layout in RAGGED_K_LAYOUTS] + [
    ("tokens-in-blocks", "tensor")]


@pytest.mark.parametrize("layout, kind", [pytest.param(*c, id="-".join(c))
                                          for c in RAGGED_K_CASES])
def test_the_ragged_k_form_partitions(layout, kind):
  """Each layout against float64 of the dequantized operands, with no operand gathered;
  the groups straddle 128-row blocks where M > 64 (the sizes scaled, then moved off the
  block edges)."""
  lhs_spec, rhs_spec, sizes_spec, (shape, names), m = RAGGED_K_LAYOUTS[layout]
  sizes = SIZES * (m // M) + np.array([5, -5, 3, 0, -3, 1, 0, -1]) * (m > M)
  mesh = _mesh(shape, names)
  block = "128x1" if kind == "block" else "tensor"
  (a, b, sa, sb), (a64, b64) = ragged_k_operands(np.random.default_rng(2), block, block,
                                                 m=m, k=K, n=N)
  scale_specs = ((P(None, lhs_spec[1]), P(None, rhs_spec[1])) if kind == "block"
                 else (P(), P()))
  placed = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(
      (a, b, jnp.asarray(sizes, jnp.int32), sa, sb),
      (lhs_spec, rhs_spec, sizes_spec, *scale_specs))]
  fn = lambda *x: jaxgemm.scaled_ragged_dot(*x, out_dtype=F32, backend="xla",
                                            ragged_dot_dimension_numbers=RAGGED_K)
  compiled = jax.jit(fn).lower(*placed).compile()
  out = compiled(*placed)
  assert_gemm_close(out, *ragged_k_reference(a64, b64, sizes), TOL, f"{layout} {kind}")
  assert not float_gathers(compiled.as_text()), float_gathers(compiled.as_text())
