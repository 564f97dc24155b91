"""jaxgemm ops partition like lax.dot_general under jit: 8 host CPU devices, own process.

`tests/test_sharding.py::test_on_8_host_devices` runs this file in a process of its own
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before jax starts, and
the rest of the suite keeps one device). Directly:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/pytest tests/sharding_on_8_devices.py

The partitioning tests run `backend="xla"`: the kernel lowering is then lax.dot_general
on the local operands, which exercises the whole mechanism (rule, plan, partitioned
lowering, reductions) with no callback. The interpreted kernels cannot run in jit's
partitioned program: both interpreters run in `jax.pure_callback`, which crashed the
process (a segmentation fault) inside a custom_partitioning lowering on the CPU; a named
kernel backend there is now a NotImplementedError raised at lowering, and `auto` runs
XLA (tested below, with the shard_map over every mesh axis where they do run). What the
kernels would get is recorded instead: `jaxgemm.sharding.recording_local_problems` lists
the local problem each kernel lowering received, and the tests check it.
`tests/test_sharding.py` runs the real Triton kernel on a 1-device mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm import sharding
from gemm_testing import (assert_gemm_close, dot_general_reference, matmul_reference,
                          random_array, tolerance)

if jax.device_count() < 8:
  pytest.skip(f"needs 8 devices, has {jax.devices()}: run through tests/test_sharding.py "
              f"(it sets XLA_FLAGS=--xla_force_host_platform_device_count=8)",
              allow_module_level=True)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
F32 = np.float32
HIGHEST = lax.Precision.HIGHEST   # exact fp32 products: the float32 tolerance applies
TOL = tolerance(F32, precision=HIGHEST)
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

NN = (((1,), (0,)), ((), ()))
TN = (((0,), (0,)), ((), ()))
NT = (((1,), (1,)), ((), ()))
TT = (((0,), (1,)), ((), ()))
# Attention scores q k^T: batch (b, h) leading both, contracting the head dim.
SCORES = (((3,), (3,)), ((0, 1), (0, 1)))


def collectives(hlo: str) -> dict[str, int]:
  """How many of each collective the compiled HLO holds."""
  counts = {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in COLLECTIVES}
  return {c: n for c, n in counts.items() if n}


def auto_mesh(shape=(8,), names=("d",)):
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def explicit_mesh(shape=(8,), names=("d",)):
  return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(shape))


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request):
  """Both of XLA's partitioners: Shardy reads the einsum rule, GSPMD the inference callback."""
  before = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
  yield request.param
  jax.config.update("jax_use_shardy_partitioner", before)


def compile_sharded(fn, mesh, operands, specs, out_spec=None):
  """fn jitted on operands placed as `specs`: (compiled, placed operands, local problems)."""
  placed = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(operands, specs)]
  out_shardings = None if out_spec is None else NamedSharding(mesh, out_spec)
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(fn, out_shardings=out_shardings).lower(*placed).compile()
  return compiled, placed, [x.problem for x in seen]


def dims_of(problems):
  """(batch, m, n, k, layout) of each local problem, sorted."""
  return sorted((p.batch, p.m, p.n, p.k, p.layout) for p in problems)


def same_sharding(array, mesh, spec) -> bool:
  return array.sharding.is_equivalent_to(NamedSharding(mesh, spec), array.ndim)


def ours(dims=None):
  """jaxgemm's call, exact fp32 (dims None: matmul; else dot_general with `dims`)."""
  if dims is None:
    return lambda a, b: jaxgemm.matmul(a, b, precision=HIGHEST, backend="xla")
  return lambda a, b: jaxgemm.dot_general(a, b, dims, precision=HIGHEST, backend="xla")


def jaxs(dims=None):
  """The same call on jax's own dot."""
  if dims is None:
    return lambda a, b: jnp.matmul(a, b, precision=HIGHEST)
  return lambda a, b: lax.dot_general(a, b, dims, precision=HIGHEST)


def reference(dims, a, b):
  return matmul_reference(a, b) if dims is None else dot_general_reference(a, b, dims)


# ---------------------------------------------------------------- layouts

# id, dimension numbers (None: matmul), a shape, b shape, a spec, b spec, jit's
# out_shardings, expected collectives (jaxgemm, then jnp / lax on the same
# layout), the result's sharding, the local problem (batch, m, n, k, layout).
LAYOUTS = [
    ("batch", None, (8, 16, 32), (8, 32, 24), P("d"), P("d"), None,
     {}, {}, P("d"), (1, 16, 24, 32, "NN")),
    ("x@W, batch of x sharded (joins M)", None, (8, 16, 32), (32, 48), P("d"), P(), None,
     {}, {}, P("d"), (1, 16, 48, 32, "NN")),
    ("x@W, sequence of x sharded", None, (4, 16, 32), (32, 48), P(None, "d"), P(), None,
     {}, {}, P(None, "d"), (1, 8, 48, 32, "NN")),
    ("M (data parallel)", None, (64, 32), (32, 48), P("d"), P(), None,
     {}, {}, P("d"), (1, 8, 48, 32, "NN")),
    ("N (column parallel)", None, (64, 32), (32, 48), P(), P(None, "d"), None,
     {}, {}, P(None, "d"), (1, 64, 6, 32, "NN")),
    ("K (row parallel): all-reduce", None, (64, 32), (32, 48), P(None, "d"), P("d"), None,
     {"all-reduce": 1}, {"all-reduce": 1}, P(), (1, 64, 48, 4, "NN")),
    ("K, result M-sharded: reduce-scatter", None, (64, 32), (32, 48), P(None, "d"), P("d"),
     P("d"), {"reduce-scatter": 1}, {"all-reduce": 1}, P("d"), (1, 64, 48, 4, "NN")),
    ("K, result N-sharded: reduce-scatter", None, (64, 32), (32, 48), P(None, "d"), P("d"),
     P(None, "d"), {"reduce-scatter": 1}, {"all-reduce": 1}, P(None, "d"), (1, 64, 48, 4, "NN")),
    ("replicated operands, result M-sharded", None, (64, 32), (32, 48), P(), P(), P("d"),
     {}, {}, P("d"), (1, 8, 48, 32, "NN")),
    ("trans_a, M sharded", TN, (32, 64), (32, 48), P(None, "d"), P(), None,
     {}, {}, P("d"), (1, 8, 48, 32, "TN")),
    ("trans_b, N sharded", NT, (64, 32), (48, 32), P(), P("d"), None,
     {}, {}, P(None, "d"), (1, 64, 6, 32, "NT")),
    ("trans_a and trans_b, K sharded", TT, (32, 64), (48, 32), P("d"), P(None, "d"), None,
     {"all-reduce": 1}, {"all-reduce": 1}, P(), (1, 64, 48, 4, "TT")),
    ("attention scores, heads sharded", SCORES, (2, 8, 16, 8), (2, 8, 16, 8), P(None, "d"),
     P(None, "d"), None, {}, {}, P(None, "d"), (2, 16, 16, 8, "NT")),
]


@pytest.mark.parametrize("layout", [pytest.param(x, id=x[0]) for x in LAYOUTS])
def test_layout_partitions_without_gathering(layout, partitioner, rng):
  """Each layout against the float64 reference, with the collectives, result sharding
  and local problem expected, on both partitioners; jnp's collectives beside ours."""
  (_, dims, a_shape, b_shape, a_spec, b_spec, out_spec, want, want_jax, result_spec,
   local) = layout
  mesh = auto_mesh()
  a, b = random_array(rng, a_shape, F32), random_array(rng, b_shape, F32)
  compiled, placed, problems = compile_sharded(ours(dims), mesh, (a, b), (a_spec, b_spec),
                                               out_spec)
  out = compiled(*placed)
  ref, bound = reference(dims, a, b)
  assert_gemm_close(out, ref, bound, TOL, f"{layout[0]} ({partitioner})")
  assert collectives(compiled.as_text()) == want
  assert same_sharding(out, mesh, result_spec), out.sharding
  assert dims_of(problems) == [local]
  jax_compiled, _, _ = compile_sharded(jaxs(dims), mesh, (a, b), (a_spec, b_spec), out_spec)
  assert collectives(jax_compiled.as_text()) == want_jax


def test_two_mesh_axes_shard_k_and_scatter_over_both(rng):
  """K split over both axes of a 2-D mesh: one reduction over both, scattered where asked."""
  mesh = auto_mesh((2, 4), ("x", "y"))
  a, b = random_array(rng, (64, 32), F32), random_array(rng, (32, 48), F32)
  specs = (P(None, ("x", "y")), P(("x", "y")))
  for out_spec, want in ((None, {"all-reduce": 1}), (P(("x", "y")), {"reduce-scatter": 1})):
    compiled, placed, problems = compile_sharded(ours(), mesh, (a, b), specs, out_spec)
    out = compiled(*placed)
    assert_gemm_close(out, *matmul_reference(a, b), TOL, f"out {out_spec}")
    assert collectives(compiled.as_text()) == want
    assert dims_of(problems) == [(1, 64, 48, 4, "NN")]


@pytest.mark.parametrize("case", ["M=60", "K=36"])
def test_uneven_sizes_are_padded_and_exact(case, rng):
  """A size the devices do not divide: XLA pads it. Operands computed on the shards (here
  exp(x) - 1.5) leave junk in K's padding, which must not be summed (without masking it,
  K=36 was off by 1.0): the results match the float64 reference, and the collectives jnp's."""
  mesh = auto_mesh()
  m, k = (60, 32) if case == "M=60" else (64, 36)
  specs = (P("d", None), P()) if case == "M=60" else (P(None, "d"), P("d", None))
  a, b = random_array(rng, (m, k), F32), random_array(rng, (k, 48), F32)

  def on_shards(dot):
    def f(a, b):
      a, b = (lax.with_sharding_constraint(jnp.exp(x) - 1.5, NamedSharding(mesh, s))
              for x, s in zip((a, b), specs))
      return dot(a, b)
    return f

  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(on_shards(ours())).lower(a, b).compile()
  a64, b64 = np.exp(np.float64(a)) - 1.5, np.exp(np.float64(b)) - 1.5
  assert_gemm_close(compiled(a, b), a64 @ b64, np.abs(a64) @ np.abs(b64), TOL, case)
  jax_compiled = jax.jit(on_shards(jaxs())).lower(a, b).compile()
  assert collectives(compiled.as_text()) == collectives(jax_compiled.as_text())
  local = (1, 8, 48, 32, "NN") if case == "M=60" else (1, 64, 48, 5, "NN")   # ceil(size/8)
  assert dims_of(x.problem for x in seen) == [local]


# ---------------------------------------------------------------- grad, vmap

GRAD_LAYOUTS = [   # a spec, b spec (and the cotangent's), local (dA, dB) problems
    ("M", P("d", None), P(), P("d", None), [(1, 8, 32, 48, "NT"), (1, 32, 48, 8, "TN")]),
    ("N", P(), P(None, "d"), P(None, "d"), [(1, 32, 6, 64, "TN"), (1, 64, 32, 6, "NT")]),
    ("K", P(None, "d"), P("d", None), P(), [(1, 4, 48, 64, "TN"), (1, 64, 4, 48, "NT")]),
]


@pytest.mark.parametrize("layout", [pytest.param(x, id=x[0]) for x in GRAD_LAYOUTS])
def test_grad_partitions_like_jax(layout, rng):
  """The backward GEMMs are matmul_p too and partition by the same rule: dA and dB
  against float64, each on its local problem, with jnp's collectives (the psum of a
  data-parallel weight gradient)."""
  _, a_spec, b_spec, ct_spec, local = layout
  mesh = auto_mesh()
  a, b = random_array(rng, (64, 32), F32), random_array(rng, (32, 48), F32)
  ct = random_array(rng, (64, 48), F32)
  vjp = lambda dot: lambda a, b, ct: jax.vjp(dot, a, b)[1](ct)
  compiled, placed, problems = compile_sharded(vjp(ours()), mesh, (a, b, ct),
                                               (a_spec, b_spec, ct_spec))
  da, db = compiled(*placed)
  ct64 = np.float64(ct)
  a64, b64 = np.float64(a), np.float64(b)
  assert_gemm_close(da, ct64 @ b64.T, np.abs(ct64) @ np.abs(b64.T), TOL, "dA")
  assert_gemm_close(db, a64.T @ ct64, np.abs(a64.T) @ np.abs(ct64), TOL, "dB")
  assert dims_of(problems) == sorted(local)
  jax_compiled, _, _ = compile_sharded(vjp(jaxs()), mesh, (a, b, ct), (a_spec, b_spec, ct_spec))
  assert "all-gather" not in collectives(compiled.as_text())
  assert collectives(compiled.as_text()) == collectives(jax_compiled.as_text())


@pytest.mark.parametrize("mapped", ["a", "b", "both"])
def test_vmap_over_the_sharded_axis_stays_local(mapped, rng):
  """vmap adds the mapped axis as a dimension of its own (batch, M or N), so a sharded
  mapped axis stays split: no collective, local problems of one slice each."""
  mesh = auto_mesh()
  a = random_array(rng, (8, 16, 32) if mapped != "b" else (16, 32), F32)
  b = random_array(rng, (8, 32, 24) if mapped != "a" else (32, 24), F32)
  in_axes = {"a": (0, None), "b": (None, 0), "both": (0, 0)}[mapped]
  specs = [P("d") if axis == 0 else P() for axis in in_axes]
  compiled, placed, problems = compile_sharded(jax.vmap(ours(), in_axes), mesh, (a, b), specs)
  out = compiled(*placed)
  a64, b64 = np.float64(a), np.float64(b)
  assert_gemm_close(out, np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64)), TOL, mapped)
  assert collectives(compiled.as_text()) == {}
  assert same_sharding(out, mesh, P("d"))
  assert dims_of(problems) == [(1, 16, 24, 32, "NN")]


# ---------------------------------------------------------------- Explicit axes


def test_explicit_axes_carry_the_result_sharding_in_the_type(rng):
  """With Explicit axes the type holds the sharding, as jnp's does, for M-sharded and
  sequence-sharded operands (no reshape merges a sharded dimension into another)."""
  mesh = explicit_mesh()
  w = random_array(rng, (32, 48), F32)
  with jax.set_mesh(mesh):
    for shape, spec in (((64, 32), P("d", None)), ((4, 16, 32), P(None, "d", None))):
      x = jax.device_put(random_array(rng, shape, F32), spec)
      typed = jax.eval_shape(ours(), x, w)
      assert typed.sharding.spec == jax.eval_shape(jaxs(), x, w).sharding.spec
      assert typed.sharding.spec == P(*spec[:-1], None)
      out = jax.jit(ours())(x, w)
      assert_gemm_close(out, *matmul_reference(x, w), TOL, str(spec))


def test_explicit_k_sharded_needs_out_sharding_as_in_jnp(rng):
  """A sharded K leaves the result's sharding ambiguous: jnp raises, and so do we; with
  `out_sharding`, the type is it and the reduction a reduce-scatter."""
  mesh = explicit_mesh()
  with jax.set_mesh(mesh):
    a = jax.device_put(random_array(rng, (64, 32), F32), P(None, "d"))
    b = jax.device_put(random_array(rng, (32, 48), F32), P("d", None))
    with pytest.raises(Exception, match="ambiguous") as jax_error:   # ShardingTypeError
      jnp.matmul(a, b)
    for call in (jaxgemm.matmul, lambda a, b, **kw: jaxgemm.dot_general(a, b, NN, **kw)):
      with pytest.raises(type(jax_error.value), match="ambiguous"):
        call(a, b, backend="xla")
    for call in (lambda a, b, s: jaxgemm.matmul(a, b, precision=HIGHEST, out_sharding=s,
                                                backend="xla"),
                 lambda a, b, s: jaxgemm.dot_general(a, b, NN, precision=HIGHEST,
                                                     out_sharding=s, backend="xla")):
      for spec in (P("d", None), P(None, "d")):
        compiled = jax.jit(functools.partial(call, s=spec)).lower(a, b).compile()
        out = compiled(a, b)
        assert jax.typeof(out).sharding.spec == spec
        assert collectives(compiled.as_text()) == {"reduce-scatter": 1}
        assert_gemm_close(out, *matmul_reference(a, b), TOL, str(spec))


def test_explicit_out_sharding_without_a_concrete_mesh_in_jit(rng):
  """numpy operands and a typed out_sharding give custom_partitioning no mesh of its
  own: the context mesh names the callbacks' shardings."""
  a, b = random_array(rng, (64, 32), F32), random_array(rng, (32, 48), F32)
  with jax.set_mesh(explicit_mesh()):
    out = jax.jit(lambda a, b: jaxgemm.matmul(a, b, precision=HIGHEST, out_sharding=P("d"),
                                              backend="xla"))(np.asarray(a), np.asarray(b))
  assert out.sharding.spec == P("d", None)
  assert_gemm_close(out, *matmul_reference(a, b), TOL, "numpy operands")


def test_explicit_grad_and_per_example_grads(rng):
  """Data-parallel grad with Explicit axes (the weight gradient's K is sharded: the
  transposes pass the primal's sharding as out_sharding), and per-example gradients,
  vmap(grad) over the sharded batch (the batching rule inserts the mapped axis)."""
  mesh = explicit_mesh()
  x, w = random_array(rng, (8, 4, 32), F32), random_array(rng, (32, 48), F32)
  loss = lambda dot: lambda w, x: jnp.sum(dot(x, w) ** 2)
  with jax.set_mesh(mesh):
    xs, ws = jax.device_put(x, P("d")), jax.device_put(w, P())
    dw, dx = jax.jit(jax.grad(loss(ours()), argnums=(0, 1)))(ws, xs)
    ref_dw, ref_dx = jax.jit(jax.grad(loss(jaxs()), argnums=(0, 1)))(ws, xs)
    per_example = jax.jit(jax.vmap(jax.grad(loss(ours())), (None, 0)))(ws, xs)
    ref_per_example = jax.jit(jax.vmap(jax.grad(loss(jaxs())), (None, 0)))(ws, xs)
  for got, want in ((dw, ref_dw), (dx, ref_dx), (per_example, ref_per_example)):
    assert jax.typeof(got).sharding.spec == jax.typeof(want).sharding.spec
  x64, w64 = np.float64(x), np.float64(w)
  y64 = x64 @ w64   # d/dw sum(y^2) = x^T 2y, d/dx = 2y w^T
  bound = np.abs(x64) @ np.abs(w64)
  assert_gemm_close(dx, 2 * y64 @ w64.T, 2 * bound @ np.abs(w64.T), TOL, "dx")
  flat_x = x64.reshape(-1, 32)
  assert_gemm_close(dw, flat_x.T @ (2 * y64.reshape(-1, 48)),
                    np.abs(flat_x.T) @ (2 * bound.reshape(-1, 48)), TOL, "dw")
  assert_gemm_close(per_example, np.einsum("bmk,bmn->bkn", x64, 2 * y64),
                    np.einsum("bmk,bmn->bkn", np.abs(x64), 2 * bound), TOL, "per example")


# ---------------------------------------------------------------- shard_map


def test_shard_map_runs_local_shards_and_grad_checks_vma(rng):
  """Under shard_map every call is local (no partitioning); with check_vma=True the grad
  of the replicated weight is psum'd (pvary in bind, its transpose)."""
  mesh = auto_mesh()
  a, w = random_array(rng, (64, 32), F32), random_array(rng, (32, 48), F32)
  ct = random_array(rng, (64, 48), F32)
  f = jax.shard_map(ours(), mesh=mesh, in_specs=(P("d", None), P()), out_specs=P("d", None),
                    check_vma=True)
  loss = lambda a, w: jnp.vdot(f(a, w), ct)
  placed = jax.device_put(a, NamedSharding(mesh, P("d", None)))
  with sharding.recording_local_problems() as seen:
    da, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(placed, w)
  a64, w64, ct64 = np.float64(a), np.float64(w), np.float64(ct)
  assert_gemm_close(da, ct64 @ w64.T, np.abs(ct64) @ np.abs(w64.T), TOL, "dA")
  assert_gemm_close(dw, a64.T @ ct64, np.abs(a64.T) @ np.abs(ct64), TOL, "dW")
  # The loss is linear in the product, so only the backward GEMMs run, each per shard.
  assert dims_of(x.problem for x in seen) == [(1, 8, 32, 48, "NT"), (1, 32, 48, 8, "TN")]


def test_shard_map_manual_over_some_axes_is_correct(rng):
  """A shard_map manual over 'data' only: correct, and the kernel runs per 'data' shard.
  (There the auto axis 'model' is not partitioned: a known limit, README "Sharding".)"""
  mesh = auto_mesh((2, 4), ("data", "model"))
  a, w = random_array(rng, (64, 32), F32), random_array(rng, (32, 48), F32)
  body = lambda x, w: ours()(x, lax.with_sharding_constraint(
      w, NamedSharding(mesh, P(None, "model"))))
  f = jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"),
                    axis_names={"data"})
  compiled, placed, problems = compile_sharded(f, mesh, (a, w), (P("data"), P(None, "model")))
  assert_gemm_close(compiled(*placed), *matmul_reference(a, w), TOL, "partly manual")
  assert [p.m for p in problems] == [32]


# ---------------------------------------------------------------- interpreted kernels

E4M3 = jnp.float8_e4m3fn
# Every partitionable op, called on an M-sharded x (64, 128) and a weight w (128, 128).
INTERPRETED_CALLS = {
    "matmul": lambda x, w, **kw: jaxgemm.matmul(x, w, **kw),
    "dot_general": lambda x, w, **kw: jaxgemm.dot_general(x, w, NN, **kw),
    "fused_matmul": lambda x, w, **kw: jaxgemm.matmul(x, w, activation="relu", **kw),
    "glu": lambda x, w, **kw: jaxgemm.glu(x, w, w, **kw),
    "ragged_dot": lambda x, w, **kw: jaxgemm.ragged_dot(x, jnp.stack([w, w]),
                                                        jnp.array([24, 40]), **kw),
    "scaled_matmul": lambda x, w, **kw: jaxgemm.scaled_matmul(
        x.astype(E4M3), w.astype(E4M3), jnp.float32(1), jnp.float32(1), out_dtype=F32, **kw),
}


def _m_sharded_operands(mesh, rng):
  x = jax.device_put(random_array(rng, (64, 128), F32), NamedSharding(mesh, P("d", None)))
  return x, random_array(rng, (128, 128), F32)


@pytest.mark.parametrize("op", list(INTERPRETED_CALLS))
@pytest.mark.parametrize("backend", ["triton", "pallas"])
def test_interpreted_kernel_on_a_mesh_is_a_clear_error(op, backend, rng):
  """On the CPU the kernels run in their interpreter, a callback, which crashed the
  process (a segmentation fault) inside jit's partitioned program: a NotImplementedError
  naming the backend, the mesh and what works, raised when the program is lowered."""
  x, w = _m_sharded_operands(auto_mesh(), rng)
  fn = lambda x, w: INTERPRETED_CALLS[op](x, w, backend=backend)
  with pytest.raises(NotImplementedError) as e:
    jax.jit(fn).lower(x, w)
  msg = str(e.value)
  for part in (f"backend='{backend}'", "8 cpu devices", "mesh axes {'d': 8}",
               "backend='xla' or 'auto'", "one device", "shard_map", "GPU"):
    assert part in msg, (part, msg)


def test_interpreted_quantizer_on_a_mesh_is_a_clear_error(rng):
  """The Triton cast-transpose (no backend param: only a kernel) says so too."""
  from jaxgemm.ops.scaled_matmul.quantize import quantize_pair

  x, _ = _m_sharded_operands(auto_mesh(), rng)
  fn = lambda x: quantize_pair(x, E4M3, None, None, backend="triton")
  with pytest.raises(NotImplementedError, match=r"jaxgemm_cast_transpose with its kernel "
                                                r"cannot run on 8 cpu devices"):
    jax.jit(fn).lower(x)


def test_interpreted_kernel_in_a_partly_manual_shard_map_is_a_clear_error(rng):
  mesh = auto_mesh((2, 4), ("data", "model"))
  body = lambda x, w: jaxgemm.matmul(x, w, backend="triton")
  f = jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"),
                    axis_names={"data"})
  with pytest.raises(NotImplementedError, match=r"backend='triton' cannot run on 8 cpu "
                                                r"devices.*manual over \['data'\] only"):
    jax.jit(f).lower(random_array(rng, (64, 32), F32), random_array(rng, (32, 48), F32))


def test_auto_picks_no_interpreted_kernel_on_a_mesh(monkeypatch, rng):
  """backend="auto" where it would pick Triton's kernel (a structural win, patched in
  for the test): on one device it does, on the mesh it computes with XLA, correctly."""
  triton_backend = type(jaxgemm.registry.get_backend("triton", "matmul"))
  monkeypatch.setattr(triton_backend, "structural_win", lambda self, problem, kind: "test")
  x, w = _m_sharded_operands(auto_mesh(), rng)
  fn = lambda x, w: jaxgemm.matmul(x, w, precision=HIGHEST)
  one_device = jax.jit(fn).lower(np.asarray(x), w).compile().as_text()
  assert "callback" in one_device   # the interpreted Triton kernel
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(fn).lower(x, w).compile()
  assert "callback" not in compiled.as_text()
  assert jaxgemm.dispatch.choose(seen[0].problem, platform="cpu").backend == "triton"
  assert dims_of(p.problem for p in seen) == [(1, 8, 128, 128, "NN")]
  assert_gemm_close(compiled(x, w), *matmul_reference(x, w), TOL, "auto on the mesh")


def test_shard_map_over_every_axis_runs_the_interpreted_kernels(rng):
  """Inside a shard_map manual over every mesh axis each device runs its own call, and
  there the callbacks work: Triton's kernel runs (with the gradient's psum), Pallas's
  lowers and compiles (its interpreter is too slow to run 8 times here)."""
  mesh = auto_mesh()
  x, w = _m_sharded_operands(mesh, rng)
  sharded = lambda backend, **kw: jax.shard_map(
      lambda x, w: jaxgemm.matmul(x, w, backend=backend, **kw), mesh=mesh,
      in_specs=(P("d", None), P()), out_specs=P("d", None), check_vma=True)
  out = jax.jit(sharded("triton", precision=HIGHEST))(x, w)
  assert_gemm_close(out, *matmul_reference(x, w), TOL, "shard_map triton")
  dw = jax.jit(jax.grad(lambda w: sharded("triton", precision=HIGHEST)(x, w).sum()))(w)
  x64 = np.float64(x)
  assert_gemm_close(dw, x64.T @ np.ones((64, 128)), np.abs(x64.T) @ np.ones((64, 128)), TOL,
                    "shard_map triton dW")
  assert "callback" in jax.jit(sharded("pallas")).lower(x, w).compile().as_text()


# ---------------------------------------------------------------- a training step

D, HEADS, HEAD_DIM, FF, BATCH, SEQ = 32, 4, 8, 64, 4, 8
PARAM_SPECS = dict(wq=P(None, "model"), wk=P(None, "model"), wv=P(None, "model"),
                   wo=P("model", None), w1=P(None, "model"), w2=P("model", None))


def transformer_block(params, x, matmul, dot_general, row_parallel_out):
  """Attention and MLP, Megatron-style: q/k/v and the MLP's up projection column-parallel
  (N over 'model'), the output and down projections row-parallel (K over 'model': one
  all-reduce each), the attention per head (batch dims (b, h), heads over 'model')."""
  split = lambda t: t.reshape(BATCH, SEQ, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
  q, k, v = (split(matmul(x, params[name])) for name in ("wq", "wk", "wv"))
  scores = dot_general(q, k, SCORES) / np.sqrt(HEAD_DIM)
  probs = jax.nn.softmax(scores, axis=-1)
  heads = dot_general(probs, v, (((3,), (2,)), ((0, 1), (0, 1))))
  heads = heads.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HEADS * HEAD_DIM)
  x = x + matmul(heads, params["wo"], out_sharding=row_parallel_out)
  hidden = jax.nn.gelu(matmul(x, params["w1"]))
  return x + matmul(hidden, params["w2"], out_sharding=row_parallel_out)


def sgd_step(params, x, target, matmul, dot_general, row_parallel_out):
  loss_fn = lambda p: jnp.mean((transformer_block(p, x, matmul, dot_general,
                                                  row_parallel_out) - target) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(params)
  return loss, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


JAXGEMM_DOTS = (
    lambda a, b, out_sharding=None: jaxgemm.matmul(a, b, out_sharding=out_sharding,
                                                   backend="xla"),
    lambda a, b, dims: jaxgemm.dot_general(a, b, dims, backend="xla"))
JAX_DOTS = (lambda a, b, out_sharding=None: jnp.matmul(a, b, out_sharding=out_sharding),
            lambda a, b, dims: lax.dot_general(a, b, dims))


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=str)
def test_2d_mesh_training_step_matches_xla(axis_type, rng):
  """Three SGD steps of a tensor-parallel transformer block on a (data 2, model 4) mesh,
  on jaxgemm and on XLA's dot: the same losses and parameters, the same collectives, and
  every kernel lowered for its local problem (tokens / 2, heads or hidden / 4)."""
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
  # With Explicit axes a row-parallel (K-sharded) projection names its result's sharding.
  row_parallel_out = P("data", None, None) if axis_type == AxisType.Explicit else None
  shapes = dict(wq=(D, HEADS * HEAD_DIM), wk=(D, HEADS * HEAD_DIM), wv=(D, HEADS * HEAD_DIM),
                wo=(HEADS * HEAD_DIM, D), w1=(D, FF), w2=(FF, D))
  params = {n: random_array(rng, s, F32) / np.sqrt(s[0]) for n, s in shapes.items()}
  x, target = (random_array(rng, (BATCH, SEQ, D), F32) for _ in range(2))
  results = {}
  with jax.set_mesh(mesh):
    params = {n: jax.device_put(p, NamedSharding(mesh, PARAM_SPECS[n])) for n, p in params.items()}
    x, target = (jax.device_put(t, NamedSharding(mesh, P("data"))) for t in (x, target))
    for name, (matmul, dot_general) in (("jaxgemm", JAXGEMM_DOTS), ("xla", JAX_DOTS)):
      step = jax.jit(functools.partial(sgd_step, matmul=matmul, dot_general=dot_general,
                                       row_parallel_out=row_parallel_out))
      with sharding.recording_local_problems() as seen:
        compiled = step.lower(params, x, target).compile()
      p, losses = params, []
      for _ in range(3):
        loss, p = compiled(p, x, target)
        losses.append(float(loss))
      results[name] = losses, p, collectives(compiled.as_text()), [s.problem for s in seen]
  (losses, final, counts, problems), (ref_losses, ref_final, ref_counts, _) = (
      results["jaxgemm"], results["xla"])
  np.testing.assert_allclose(losses, ref_losses, rtol=TOL)
  assert losses[2] < losses[0]   # it trains
  for n in final:
    err = np.linalg.norm(np.float64(final[n]) - np.float64(ref_final[n]))
    assert err <= TOL * np.linalg.norm(np.float64(ref_final[n])), n
    assert final[n].sharding.is_equivalent_to(ref_final[n].sharding, 2), n
  assert counts == ref_counts and "all-gather" not in counts
  tokens = BATCH * SEQ // 2
  forward = {(1, tokens, HEADS * HEAD_DIM // 4, D, "NN"),       # q, k, v: N split
             (1, tokens, D, HEADS * HEAD_DIM // 4, "NN"),       # output projection: K split
             (1, tokens, FF // 4, D, "NN"), (1, tokens, D, FF // 4, "NN"),   # MLP
             (BATCH // 2 * HEADS // 4, SEQ, SEQ, HEAD_DIM, "NT"),   # scores, per head
             (BATCH // 2 * HEADS // 4, SEQ, HEAD_DIM, SEQ, "NN")}   # probs @ v
  assert forward <= set(dims_of(problems))
  full = {(1, BATCH * SEQ, HEADS * HEAD_DIM, D), (1, BATCH * SEQ, FF, D)}
  assert not full & {p[:4] for p in dims_of(problems)}, "a kernel got an unsharded problem"


# ---------------------------------------------------------------- the README


def test_readme_sharding_example_runs_as_written():
  """README.md's "Sharding" example, as written, and the communication it claims."""
  readme = (REPO_ROOT / "README.md").read_text()
  section = readme.split("\n## Sharding\n", 1)[1].split("\n## ", 1)[0]
  (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
  namespace = {}
  exec(compile(block, "README.md (Sharding)", "exec"), namespace)  # noqa: S102
  with jax.set_mesh(namespace["mesh"]):
    compiled = namespace["mlp"].lower(namespace["x"]).compile()
  assert collectives(compiled.as_text()) == {"all-reduce": 1}


# ---------------------------------------------------------------- ragged_dot

def _gathered_sizes(hlo: str) -> list[int]:
  """The element counts of every all-gather's result."""
  return [math.prod(int(d) for d in dims.split(",") if d) for dims in re.findall(
      r"= \w+\[([\d,]*)\][^=]*? all-gather(?:-start)?\(", hlo)]


def float_gathers(hlo: str) -> list[str]:
  """The all-gathers of floating arrays (operands); the group bounds' few int32 may move."""
  return re.findall(r"= (?:f64|f32|bf16|f16)\[[^\]]*\][^=]*? all-gather(?:-start)?\(", hlo)


def _ragged_case(rng, m=64, k=16, n=24, groups=8):
  lhs = random_array(rng, (m, k), F32)
  rhs = random_array(rng, (groups, k, n), F32)
  sizes = np.asarray(rng.multinomial(m - 5, np.ones(groups) / groups), np.int32)
  sizes[3] = 0    # an empty expert, and 5 rows routed to none
  return lhs, rhs, jnp.asarray(sizes)


def _ragged_reference(lhs, rhs, sizes):
  ends = np.cumsum(np.asarray(sizes)); starts = ends - np.asarray(sizes)
  a, w = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
  out = np.zeros((a.shape[0], w.shape[-1])); bound = np.zeros_like(out)
  for g, (s, e) in enumerate(zip(starts, ends)):
    out[s:e], bound[s:e] = a[s:e] @ w[g], np.abs(a[s:e]) @ np.abs(w[g])
  return out, bound


@pytest.mark.parametrize("lhs_spec,rhs_spec,reduces", [
    pytest.param(P("d", None), P(None, None, None), False, id="tokens"),
    pytest.param(P(None, None), P("d", None, None), True, id="experts"),
    pytest.param(P("x", None), P("y", None, None), True, id="tokens-and-experts"),
])
def test_ragged_dot_partitions_tokens_and_experts(partitioner, lhs_spec, rhs_spec, reduces, rng):
  """Tokens sharded stay local; experts sharded (expert parallelism) compute each
  device's own groups and sum over the expert axis; the weights are never gathered,
  and the gradient partitions by the same rule."""
  mesh = auto_mesh((2, 4), ("x", "y")) if "x" in str(lhs_spec) else auto_mesh()
  lhs, rhs, sizes = _ragged_case(rng)
  put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
  lhs_s, rhs_s = put(lhs, lhs_spec), put(rhs, rhs_spec)
  fn = lambda l, w: jaxgemm.ragged_dot(l, w, sizes, precision=HIGHEST, backend="xla")
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(fn).lower(lhs_s, rhs_s).compile()
  out = compiled(lhs_s, rhs_s)
  ref, bound = _ragged_reference(lhs, rhs, sizes)
  assert_gemm_close(out, ref, bound, TOL, "ragged_dot sharded")
  hlo = compiled.as_text()
  found = collectives(hlo)
  assert not float_gathers(hlo), float_gathers(hlo)
  assert ("all-reduce" in found or "reduce-scatter" in found) == reduces, found
  local = [r.problem for r in seen if r.problem.op == "ragged_dot"]
  w_shards = 8 if rhs_spec == P("d", None, None) else 4 if "y" in str(rhs_spec) else 1
  assert local and all(p.groups == 8 // w_shards for p in local), local
  grad = jax.jit(jax.grad(lambda l, w: (fn(l, w) ** 2).sum(), (0, 1)))(lhs_s, rhs_s)
  want = jax.grad(lambda l, w: (jnp.asarray(_ragged_reference_jnp(l, w, sizes)) ** 2).sum(),
                  (0, 1))(lhs, rhs)
  for g, w in zip(grad, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-3)


def _ragged_reference_jnp(lhs, rhs, sizes):
  ends = jnp.cumsum(sizes)
  rows = jnp.arange(lhs.shape[0])[:, None]
  mask = ((rows >= ends - sizes) & (rows < ends)).astype(lhs.dtype)
  return jnp.einsum("mg,mk,gkn->mn", mask, lhs, rhs, precision=HIGHEST)


def test_ragged_dot_weight_gradient_sharded_over_tokens(partitioner, rng):
  """The ragged-K form (an expert's weight gradient) with tokens sharded: each device
  sums its own rows, one all-reduce."""
  mesh = auto_mesh()
  lhs, _, sizes = _ragged_case(rng)
  dy = random_array(rng, (lhs.shape[0], 24), F32)
  numbers = lax.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])
  put = lambda x: jax.device_put(x, NamedSharding(mesh, P("d", None)))
  fn = jax.jit(lambda l, d: jaxgemm.ragged_dot_general(l, d, sizes, numbers, precision=HIGHEST,
                                                       backend="xla"))
  compiled = fn.lower(put(lhs), put(dy)).compile()
  out = compiled(put(lhs), put(dy))
  ends = np.cumsum(np.asarray(sizes)); starts = ends - np.asarray(sizes)
  a, d = np.asarray(lhs, np.float64), np.asarray(dy, np.float64)
  ref = np.stack([a[s:e].T @ d[s:e] for s, e in zip(starts, ends)])
  bound = np.stack([np.abs(a[s:e]).T @ np.abs(d[s:e]) for s, e in zip(starts, ends)])
  assert_gemm_close(out, ref, bound, TOL, "ragged-K sharded over tokens")
  hlo = compiled.as_text()
  assert not float_gathers(hlo) and "all-reduce" in collectives(hlo), collectives(hlo)


# ---------------------------------------------------------------- fused epilogues


def _mlp_reference(x, w, bias, residual, wg=None):
  """float64 silu(x @ w + bias) + residual, or the SwiGLU silu(x @ wg + bias) * (x @ w)."""
  x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
  if wg is None:
    z = x64 @ w64 + np.asarray(bias, np.float64)
    return z / (1 + np.exp(-z)) + np.asarray(residual, np.float64)
  z = x64 @ np.asarray(wg, np.float64) + np.asarray(bias, np.float64)
  return z / (1 + np.exp(-z)) * (x64 @ w64)


@pytest.mark.parametrize("x_spec,w_spec", [
    pytest.param(P("x", None), P(None, None), id="data-parallel"),
    pytest.param(P(None, None), P(None, "y"), id="tensor-parallel-columns"),
    pytest.param(P("x", None), P(None, "y"), id="data-and-tensor"),
    pytest.param(P(None, "y"), P("y", None), id="k-sharded-is-gathered"),
])
def test_fused_epilogue_and_glu_partition_without_gathering(partitioner, x_spec, w_spec, rng):
  """Rows (data) and columns (tensor parallel, with the bias and residual along) stay
  local with no collective; a sharded K cannot go through the activation, so the
  rule keeps K whole (the partitioner gathers it) and the result is still exact."""
  mesh = auto_mesh((2, 4), ("x", "y"))
  x, w = random_array(rng, (32, 16), F32), random_array(rng, (16, 24), F32)
  wg, bias = random_array(rng, (16, 24), F32), random_array(rng, (24,), F32)
  residual = random_array(rng, (32, 24), F32)
  n_spec = P(w_spec[1])
  out_spec = P(x_spec[0], w_spec[1])
  specs = (x_spec, w_spec, w_spec, n_spec, out_spec)
  placed = [jax.device_put(a, NamedSharding(mesh, s))
            for a, s in zip((x, w, wg, bias, residual), specs)]
  fused = lambda x, w, wg, b, r: jaxgemm.matmul(x, w, bias=b, activation="silu", residual=r,
                                                precision=HIGHEST, backend="xla")
  glu = lambda x, w, wg, b, r: jaxgemm.glu(x, wg, w, bias_gate=b, precision=HIGHEST,
                                           backend="xla")
  for name, fn, ref in (("fused", fused, _mlp_reference(x, w, bias, residual)),
                        ("glu", glu, _mlp_reference(x, w, bias, None, wg))):
    compiled = jax.jit(fn).lower(*placed).compile()
    out = compiled(*placed)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=name)
    found = collectives(compiled.as_text())
    if x_spec == P(None, "y"):
      assert "all-reduce" not in found, (name, found)   # K gathered, never summed partially
    else:
      assert not found, (name, found)
  # The gradient partitions by the same rules (gated backward GEMMs included).
  loss = lambda *a: (fused(*a) ** 2).sum()
  grads = jax.jit(jax.grad(loss, (0, 1, 3, 4)))(*placed)
  want = jax.grad(lambda x, w, b, r: ((jax.nn.silu(jnp.matmul(x, w, precision=HIGHEST) + b) + r)
                                      ** 2).sum(), (0, 1, 2, 3))(x, w, bias, residual)
  for g, wnt in zip(grads, want):
    np.testing.assert_allclose(g, wnt, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- FP8 scaled GEMMs


def _scaled_operands(kind, m=64, k=512, n=256, seed=0):
  """fp8 x (m, k), w (k, n) and their scales for `kind` (jaxgemm.quantize's shapes)."""
  r = np.random.default_rng(seed)
  blocks = {"tensor": (None, None), "row_col": ((1, None), (None, 1)),
            "block": ((1, 128), (128, 128))}[kind]
  x, sx = jaxgemm.quantize(jnp.asarray(r.standard_normal((m, k)), F32), block=blocks[0])
  w, sw = jaxgemm.quantize(jnp.asarray(r.standard_normal((k, n)), F32), jnp.float8_e5m2,
                           block=blocks[1])
  return x, w, sx, sw


@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
@pytest.mark.parametrize("x_spec,w_spec", [
    pytest.param(P("x", None), P(None, None), id="data-parallel"),
    pytest.param(P(None, None), P(None, "y"), id="tensor-parallel-columns"),
    pytest.param(P("x", None), P(None, "y"), id="data-and-tensor"),
    pytest.param(P(None, "y"), P("y", None), id="k-sharded"),
])
def test_scaled_matmul_partitions_with_its_scales(partitioner, kind, x_spec, w_spec):
  """Rows and columns stay local with their scales (row/column scales sharded alike,
  block scales whole, each device slicing its own blocks: N = 256 over 4 is 64 columns,
  inside one 128-wide block); a sharded K (512 over 4: one block per device) is summed
  with one all-reduce, with no gather of an operand."""
  mesh = auto_mesh((2, 4), ("x", "y"))
  x, w, sx, sw = _scaled_operands(kind)
  m_axis, k_axis, n_axis = x_spec[0], x_spec[1], w_spec[1]
  scale_specs = {"tensor": (P(), P()), "row_col": (P(m_axis, None), P(None, n_axis)),
                 "block": (P(m_axis, None), P(None, None))}[kind]
  placed = [jax.device_put(a, NamedSharding(mesh, s))
            for a, s in zip((x, w, sx, sw), (x_spec, w_spec, *scale_specs))]
  fn = lambda *a: jaxgemm.scaled_matmul(*a, out_dtype=F32, backend="xla")
  want = np.asarray(fn(x, w, sx, sw))
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(fn).lower(*placed).compile()
  out = compiled(*placed)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  local = [p.problem for p in seen if p.op == "jaxgemm_scaled_matmul"]
  assert local, seen
  shards = lambda axis: {None: 1, "x": 2, "y": 4}[axis]
  assert (local[0].m, local[0].k, local[0].n) == (64 // shards(m_axis), 512 // shards(k_axis),
                                                  256 // shards(n_axis)), local[0]
  found = collectives(compiled.as_text())
  if k_axis is None:
    assert not found, found
  else:
    assert "all-reduce" in found and not float_gathers(compiled.as_text()), found


def test_scaled_matmul_block_scales_refuse_a_k_split_off_the_blocks(partitioner):
  """K = 320 over 4 devices is 80 per device: neither whole blocks nor inside one, so
  each device's K range would need parts of two scale blocks: a clear error (raised in
  the partitioner's callback, which XLA reports as a JaxRuntimeError carrying it)."""
  mesh = auto_mesh((2, 4), ("x", "y"))
  x, w, sx, sw = _scaled_operands("block", k=320)
  placed = [jax.device_put(a, NamedSharding(mesh, s))
            for a, s in zip((x, w, sx, sw), (P(None, "y"), P("y", None), P(), P()))]
  fn = lambda *a: jaxgemm.scaled_matmul(*a, out_dtype=F32, backend="xla")
  with pytest.raises((ValueError, jax.errors.JaxRuntimeError),
                     match=r"K is sharded .* into 80 per device.*multiples of 128"):
    jax.jit(fn).lower(*placed).compile()


@pytest.mark.parametrize("fp8", ["tensor", "block"])
def test_fp8_training_path_shards_its_three_gemms(partitioner, fp8):
  """matmul(x, w, fp8=...) under data x tensor parallelism (rows over "x", columns over
  "y"): the forward, dgrad and wgrad GEMMs each run on local operands (M/2 rows, N/4
  columns: the wgrad sums its row-sharded contraction), and the loss and gradients
  equal the unsharded run's (the quantization's amaxes reduce over the whole array)."""
  mesh = auto_mesh((2, 4), ("x", "y"))
  r = np.random.default_rng(1)
  m, k, n = 512, 256, 512
  x = jnp.asarray(r.standard_normal((m, k)), jnp.bfloat16)
  w = jnp.asarray(r.standard_normal((k, n)) / 16, jnp.bfloat16)
  loss = lambda x, w: (jaxgemm.matmul(x, w, fp8=fp8, backend="xla").astype(F32) ** 2).sum()
  step = jax.value_and_grad(loss, (0, 1))
  want_loss, want_grads = jax.jit(step)(x, w)
  placed = (jax.device_put(x, NamedSharding(mesh, P("x", None))),
            jax.device_put(w, NamedSharding(mesh, P(None, "y"))))
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(step).lower(*placed).compile()
  got_loss, got_grads = compiled(*placed)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  # dgrad's contraction (N) is sharded: its bf16 partial sums add across "y", a few
  # bf16 roundings (2**-8 each) of the partials, norm-wise.
  for g, wnt in zip(got_grads, want_grads):
    g, wnt = np.asarray(g, F32), np.asarray(wnt, F32)
    assert np.linalg.norm(g - wnt) / np.linalg.norm(wnt) < 2.0**-7
  local = sorted({(p.problem.m, p.problem.k, p.problem.n) for p in seen
                  if p.op == "jaxgemm_scaled_matmul"})
  # forward (M/2, K, N/4); dgrad dY W^T (M/2, N/4 summed over "y", K); wgrad (K, M/2, N/4)
  assert local == sorted({(m // 2, k, n // 4), (m // 2, n // 4, k), (k, m // 2, n // 4)}), local


@pytest.fixture
def quantizer_as_xla(monkeypatch):
  """The cast-transpose kernel replaced by XLA's math on the local shard (the Triton
  interpreter cannot run inside a partitioned lowering here: the module docstring), so
  the partitioning around it is what runs. Per tensor the given scale is used, as the
  kernel uses it, and never recomputed from the shard; in blocks, the shard's own.
  With no interpreter left to call back, the mesh check that refuses one is off."""
  module = importlib.import_module("jaxgemm.ops.scaled_matmul.cast_transpose")
  quantize_module = importlib.import_module("jaxgemm.ops.scaled_matmul.quantize")
  monkeypatch.setattr(sharding, "INTERPRETED_PLATFORM", None)

  def xla_kernel(x, scale, *, dtype, scale_dtype, modes, platform):
    del platform
    if modes == ("tensor", "tensor"):
      inv = 1 / scale.astype(scale_dtype).astype(F32)
      q = quantize_module._clip(x.astype(F32) * inv, float(jnp.finfo(dtype).max)).astype(dtype)
      return q, q.T
    block = {"row": (1, 128), "tile": (128, 128)}
    return quantize_module._pair_xla(x, dtype, block[modes[0]], block[modes[1]], scale_dtype)
  monkeypatch.setattr(module, "_kernel", xla_kernel)


@pytest.mark.parametrize("spec", [P("x", None), P(None, "y"), P("x", "y"), P(("x", "y"), None)],
                         ids=str)
def test_triton_quantizer_per_tensor_quantizes_each_shard_in_place(partitioner, spec,
                                                                   quantizer_as_xla):
  """quantize_pair(..., backend="triton") per tensor: the amax is one all-reduce, each
  device casts and transposes its own block (q keeps x's sharding, q^T the transposed
  one), and nothing is gathered; the values equal the unsharded XLA quantizer's."""
  from jaxgemm.ops.scaled_matmul.quantize import quantize_pair
  mesh = auto_mesh((2, 4), ("x", "y"))
  x = jnp.asarray(np.random.default_rng(2).standard_normal((64, 96)) * 3, jnp.bfloat16)
  pair = lambda x, backend: quantize_pair(x, jnp.float8_e4m3fn, None, None,
                                          scale_dtype=jnp.float8_e8m0fnu, backend=backend)
  want = jax.jit(lambda x: pair(x, "xla"))(x)
  placed = jax.device_put(x, NamedSharding(mesh, spec))
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(lambda x: pair(x, "triton")).lower(placed).compile()
  got = compiled(placed)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g, F32), np.asarray(w, F32))
  (local,) = {p.shapes for p in seen if p.op == "jaxgemm_cast_transpose"}
  shards = lambda entry: math.prod({"x": 2, "y": 4}[a] for a in sharding.axes_of(entry))
  assert local == ((64 // shards(spec[0]), 96 // shards(spec[1])), ()), local
  assert got[0].sharding.is_equivalent_to(NamedSharding(mesh, spec), 2), got[0].sharding
  assert got[2].sharding.is_equivalent_to(NamedSharding(mesh, P(spec[1], spec[0])), 2)
  found = collectives(compiled.as_text())
  assert set(found) == {"all-reduce"}, found   # the amax


@pytest.mark.parametrize("modes", [("row", "row"), ("tile", "tile"), ("row", "tile")], ids=str)
@pytest.mark.parametrize("shape, spec, kernel_shape", [
    pytest.param((512, 1024), P("x", "y"), (256, 256), id="whole-blocks-each"),
    pytest.param((512, 1000), P("x", "y"), (256, 1000), id="columns-not-whole-blocks"),
    pytest.param((255, 512), P("x", None), (255, 512), id="rows-padded"),
    pytest.param((384, 768), P(None, ("x", "y")), (384, 768), id="columns-over-both-axes"),
])
def test_triton_quantizer_in_blocks_quantizes_whole_blocks_in_place(
    partitioner, modes, shape, spec, kernel_shape, quantizer_as_xla):
  """Block scales: a device whose rows and columns are whole 128-blocks quantizes its
  own block of x (only the scales' block dimensions are gathered: 1/128 of x or less);
  a dimension that is not (1000 columns over 4, 255 rows padded over 2, 768 over 8) is
  gathered for the kernel, as XLA's partitioner did for the bare call, and the results
  sliced back. Bit-equal to the unsharded XLA quantizer, q and q^T sharded like x."""
  from jaxgemm.ops.scaled_matmul.quantize import quantize_pair
  mesh = auto_mesh((2, 4), ("x", "y"))
  x = jnp.asarray(np.random.default_rng(4).standard_normal(shape) * 3, jnp.bfloat16)
  blocks = {"row": (1, 128), "tile": (128, 128)}
  pair = lambda x, backend: quantize_pair(x, jnp.float8_e4m3fn, blocks[modes[0]],
                                          blocks[modes[1]], backend=backend)
  want = jax.jit(lambda x: pair(x, "xla"))(x)
  # A padded dimension comes from the program (device_put takes even shards only).
  source = jnp.pad(x, [(0, -n % 8) for n in shape])
  placed = jax.device_put(source, NamedSharding(mesh, spec))
  cut = lambda x: lax.with_sharding_constraint(x[:shape[0], :shape[1]], NamedSharding(mesh, spec))
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(lambda x: pair(cut(x), "triton")).lower(placed).compile()
  got = compiled(placed)
  for g, w in zip(got, want):
    assert g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g, F32), np.asarray(w, F32))
  (local,) = {p.shapes[0] for p in seen if p.op == "jaxgemm_cast_transpose"}
  assert local == kernel_shape, local
  if shape[0] % 8 == 0:   # a jax.Array's shards are even: a padded result comes back whole
    assert got[0].sharding.is_equivalent_to(NamedSharding(mesh, spec), 2), got[0].sharding
    assert got[2].sharding.is_equivalent_to(NamedSharding(mesh, P(spec[1], spec[0])), 2)
  if kernel_shape == (shape[0] // 2, shape[1] // 4):   # in place: only scale blocks move
    sizes = _gathered_sizes(compiled.as_text())
    assert sizes and max(sizes) * 128 <= x.size, sizes


@pytest.mark.parametrize("scaling", ["tensor", "block"])
def test_fp8_training_with_the_triton_quantizer_gathers_no_operand(partitioner, scaling,
                                                                   quantizer_as_xla):
  """The FP8 step with the Triton quantizer, data x tensor parallel (M 512 over 2, N 512
  over 4: whole 128-blocks on every device): no operand is gathered (per tensor nothing
  at all; in blocks only the scales' block dimensions), and the loss and gradients
  equal XLA's quantizer's, sharded the same way."""
  mesh = auto_mesh((2, 4), ("x", "y"))
  r = np.random.default_rng(3)
  x = jnp.asarray(r.standard_normal((512, 256)), jnp.bfloat16)
  w = jnp.asarray(r.standard_normal((256, 512)) / 16, jnp.bfloat16)
  placed = (jax.device_put(x, NamedSharding(mesh, P("x", None))),
            jax.device_put(w, NamedSharding(mesh, P(None, "y"))))

  def step(quantize_backend):
    recipe = dataclasses.replace(jaxgemm.Fp8Recipe.named(scaling),
                                 quantize_backend=quantize_backend)
    loss = lambda x, w: (jaxgemm.matmul(x, w, fp8=recipe, backend="xla").astype(F32) ** 2).sum()
    return jax.jit(jax.value_and_grad(loss, (0, 1))).lower(*placed).compile()
  compiled = step("triton")
  sizes = _gathered_sizes(compiled.as_text())
  assert (not sizes) if scaling == "tensor" else max(sizes) * 128 <= x.size, sizes
  got, want = compiled(*placed), step("xla")(*placed)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g, F32), np.asarray(w, F32))


@pytest.mark.parametrize("scaling", ["tensor", "block"])
@pytest.mark.parametrize("quantizer", ["xla", "triton"])
@pytest.mark.parametrize("x_spec, w_spec, out_spec, out_dtype", [
    pytest.param(P("x", None), P(None, "y"), None, jnp.bfloat16, id="w-on-n"),
    # The forward sums its devices' partial products in its result dtype: float32 here,
    # so that the loss is the unsharded one's to the same tolerance.
    pytest.param(P("x", "y"), P("y", None), P("x", None), F32, id="w-on-k"),
    # x (batch, seq, K) sharded on its sequence: the GEMMs' rows put it first.
    pytest.param(P(None, "x", None), P(None, "y"), None, jnp.bfloat16, id="x-on-seq"),
])
def test_fp8_training_on_explicit_axes(scaling, quantizer, x_spec, w_spec, out_spec, out_dtype,
                                       quantizer_as_xla):
  """The FP8 step on an Explicit (2, 4) mesh, rows (or a 3-D x's sequence) over "x", W's
  N (column parallel) or K (row parallel, x's K too) over "y": the loss and gradients
  equal the unsharded
  step's (the Auto-axes test's tolerances: a sharded contraction sums bf16 partials),
  each gradient typed with its primal's sharding. Where K is sharded the forward needs
  `out_sharding`; without it jax's ShardingTypeError, as jnp.matmul's."""
  mesh = explicit_mesh((2, 4), ("x", "y"))
  r = np.random.default_rng(5)
  x = jnp.asarray(r.standard_normal((256, 512)), jnp.bfloat16)   # 128-blocks per device
  if len(x_spec) == 3:
    x = x.reshape(2, 128, 512)
  w = jnp.asarray(r.standard_normal((512, 512)) / 16, jnp.bfloat16)
  recipe = dataclasses.replace(jaxgemm.Fp8Recipe.named(scaling), quantize_backend=quantizer)

  def step(out_sharding):
    loss = lambda x, w: (jaxgemm.matmul(x, w, fp8=recipe, preferred_element_type=out_dtype,
                                        backend="xla", out_sharding=out_sharding
                                        ).astype(F32) ** 2).sum()
    return jax.jit(jax.value_and_grad(loss, (0, 1)))
  want_loss, want_grads = step(None)(x, w)
  with jax.set_mesh(mesh):
    xs, ws = jax.device_put(x, x_spec), jax.device_put(w, w_spec)
    if x.ndim == 3 and scaling == "block":   # 128-row blocks of the wgrad span devices
      with pytest.raises(ValueError, match=r"shard x's leading dimension instead.*'tensor'"):
        step(None)(xs, ws)
      return
    if out_spec is not None:
      with pytest.raises(Exception, match="ambiguous") as jax_error:   # ShardingTypeError
        jnp.matmul(xs, ws)
      with pytest.raises(type(jax_error.value), match="ambiguous"):
        step(None)(xs, ws)
    got_loss, got_grads = step(out_spec)(xs, ws)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  for g, wnt, spec in zip(got_grads, want_grads, (x_spec, w_spec)):
    assert jax.typeof(g).sharding.spec == spec
    g, wnt = np.asarray(g, F32), np.asarray(wnt, F32)
    assert np.linalg.norm(g - wnt) / np.linalg.norm(wnt) < 2.0**-7


def test_fp8_per_example_grads_on_explicit_axes():
  """vmap(grad) over a batch sharded on an Explicit axis: scaled_matmul_p's batching
  rule puts the mapped axis into the backward GEMMs' out_sharding, and the per-example
  gradients equal the unsharded ones (dX to the tolerance above: N is sharded)."""
  mesh = explicit_mesh((2, 4), ("x", "y"))
  r = np.random.default_rng(6)
  x = jnp.asarray(r.standard_normal((2, 128, 512)), jnp.bfloat16)
  w = jnp.asarray(r.standard_normal((512, 512)) / 16, jnp.bfloat16)
  loss = lambda w, x: (jaxgemm.matmul(x, w, fp8="block", backend="xla").astype(F32) ** 2).sum()
  per_example = jax.jit(jax.vmap(jax.grad(loss, (0, 1)), (None, 0)))
  want = per_example(w, x)
  with jax.set_mesh(mesh):
    got = per_example(jax.device_put(w, P(None, "y")), jax.device_put(x, P("x")))
  for g, wnt, spec in zip(got, want, (P("x", None, "y"), P("x", None, None))):
    assert jax.typeof(g).sharding.spec == spec
    g, wnt = np.asarray(g, F32), np.asarray(wnt, F32)
    assert np.linalg.norm(g - wnt) / np.linalg.norm(wnt) < 2.0**-7


@pytest.mark.parametrize("modes", [("tensor", "tensor"), ("row", "tile")], ids=str)
def test_triton_quantizer_types_carry_its_rules_shardings(modes):
  """cast_transpose_p's result types (Explicit axes) are the shardings its rule gives
  the results: q x's, q^T the transpose, a row scale's rows x's rows', block
  dimensions whole; a per-tensor scale replicated."""
  from jaxgemm.ops.scaled_matmul.quantize import quantize_pair
  blocks = {"tensor": None, "row": (1, 128), "tile": (128, 128)}
  with jax.set_mesh(explicit_mesh((2, 4), ("x", "y"))):
    x = jax.device_put(jnp.zeros((256, 512), jnp.bfloat16), P("x", "y"))
    types = jax.eval_shape(lambda x: quantize_pair(x, jnp.float8_e4m3fn, blocks[modes[0]],
                                                   blocks[modes[1]], backend="triton"), x)
  want = {("tensor", "tensor"): [P("x", "y"), P(), P("y", "x"), P()],
          ("row", "tile"): [P("x", "y"), P("x", None), P("y", "x"), P(None, None)]}[modes]
  assert [t.sharding.spec for t in types] == want


# ---------------------------------------------------------------- the benchmark's suite


def test_sharded_benchmark_suite_runs_its_layouts_and_step():
  """`python -m bench --suite sharded` at its CPU sizes (bench/sharded.py): every layout and
  the (data 4, model 2) training step agree with XLA's program on the same mesh, no
  jaxgemm program gathers, the collectives it reads are XLA's (where jaxgemm reduce-scatters
  a K-split result that XLA all-reduces, fewer bytes), and each kernel got its shard."""
  from jaxgemm.bench import runner, sharded as S
  from jaxgemm.timing import Timer

  rows = []
  ctx = runner.Context(platform="cpu", device_kind="cpu", timer=Timer("cpu"), iters=2,
                       dtype_name="bf16", provenance={"platform": "cpu"}, emit=rows.append,
                       log=lambda s: None, run_id="cpu-test")
  S.run_sharded_suite(ctx, ["xla", "auto"])
  # Each backend's default call (XLA's reference: its one row per problem), and every row.
  default = {"xla": "(default)", "auto": "default"}
  every = {(r["problem"], r["backend"], r["variant"]): r for r in rows}
  by = {(r["problem"], r["backend"]): r for r in rows
        if r["variant"] == default.get(r["backend"], r["variant"])}
  names = [lay.name for lay in S.layouts("cpu")] + [S.STEP_NAME]
  assert sorted({r["problem"] for r in rows}) == sorted(names + S.mlp_names("cpu"))
  # The Megatron-SP MLP (issue 44): x is gathered, not W1, so jaxgemm's program moves no
  # more bytes than jnp's; forward and backward agree with XLA's. Issue 46: with
  # overlap=True every GEMM's move is a ring of collective-permutes, still agreeing; the
  # floor (the local GEMMs alone) moves nothing.
  for name in S.mlp_names("cpu"):
    ref = by[name, runner.REF]
    for backend in ("xla", "auto"):
      r = by[name, backend]
      assert r["status"] == "ok" and r["time_ms_median"] > 0, (name, backend, r.get("error"))
      assert r["collective_mb"] <= ref["collective_mb"], (name, r["collectives"],
                                                          ref["collectives"])
      ring = every[name, backend, "overlap=True"]
      assert ring["status"] == "ok", (name, backend, ring.get("error"))
      assert ring["collectives"].startswith("collective-permute") and ";" not in \
          ring["collectives"], ring["collectives"]
    assert every[name, "xla", S.FLOOR]["collectives"] == "none"
    assert (name, "xla", "windowed-einsum") not in every   # XLA's GPU flags: GPU rows only
  for name in names:
    ref = by[name, runner.REF]
    assert ref["status"] == "ok" and ref["time_ms_median"] > 0, ref
    for backend in ("xla", "auto"):
      r = by[name, backend]
      assert r["status"] == "ok", (name, backend, r.get("error"))
      assert "all-gather" not in r["collectives"], (name, backend, r["collectives"])
      if name == "sharded.row.K-scatter":
        assert r["collectives"].startswith("reduce-scatter 1 op") and not r["same_collectives"]
        assert r["collective_mb"] < ref["collective_mb"]
      else:
        assert r["same_collectives"] == 1, (name, backend, r["collectives"], ref["collectives"])
  assert by["sharded.row.K", "xla"]["collectives"].startswith("all-reduce 1 op")
  assert by["sharded.data.M", "xla"]["local_problems"] == "1x(8x32 @ 32x48) NN bfloat16->bfloat16"
  assert by["sharded.column.N", "xla"]["local_problems"] == "1x(64x32 @ 32x6) NN bfloat16->bfloat16"
  assert by["sharded.experts.B", "xla"]["local_problems"] == "1x(16x32 @ 32x48) NN bfloat16->bfloat16"
  step = by[S.STEP_NAME, "auto"]
  assert step["agree"] == 1 and step["loss_last"] < step["loss_first"], step
  assert "all-reduce" in step["collectives"] and step["mesh"] == "data=4 x model=2"


def test_collectives_are_read_by_kind_and_bytes():
  """The sharded suite's HLO reading: async starts and tuples count, done ops and fusions
  named like collectives do not, layouts are ignored."""
  from jaxgemm.bench import sharded as S

  hlo = "\n".join([
      "%ar = (f32[16,32]{1,0}, f32[]) all-reduce-start(%a, %b), channel_id=1",
      "%ard = (f32[16,32]{1,0}, f32[]) all-reduce-done(%ar)",
      "%rs = bf16[8,32]{1,0} reduce-scatter(%c), dimensions={0}",
      "%ag = bf16[64,32]{0,1} all-gather(%d), dimensions={0}",
      "%f = f32[4]{0} fusion(%all-reduce.1), kind=kLoop"])
  found = S.collectives(hlo)
  assert S.collective_totals(found) == {"all-gather": (1, 4096), "all-reduce": (1, 2052),
                                        "reduce-scatter": (1, 512)}
  assert S.describe_collectives(S.collectives("")) == "none"


def test_sharded_suite_times_calls_back_to_back():
  """The sharded suite's clock launches a block of calls, waits once, and gives each the
  mean; `chunk` splits a block as Timer.time's does."""
  from jaxgemm.bench import sharded as S

  calls = []
  f = lambda x: calls.append(1) or x + 1
  times = S.PipelinedWallTimer().time(f, (jnp.ones(4),), 5, chunk=2)
  assert len(calls) == 5 and len(times) == 5
  assert times[0] == times[1] and times[2] == times[3] and all(t > 0 for t in times)
