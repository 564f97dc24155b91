"""`jaxgemm.accelerate(fn)`: a model written the ordinary way, its GEMMs on jaxgemm.

Each model is checked three ways: its results (and gradients) against float64 ones
computed from the same inputs, within the dtype's tolerance (`gemm_testing.tolerance`,
norm-wise: a chain of GEMMs and activations rounds at every step, so the per-element
|A| @ |B| bound of one GEMM does not apply); its program (`jax.make_jaxpr` of the
accelerated function, sub-programs included) holds jaxgemm's primitives and no
`dot_general` where jaxgemm's kernels take the dot; and `explain()` says what each GEMM
became and why. Most cases run backend="xla" (jaxgemm's primitives on XLA's dot: fast
on the CPU); one runs the Triton kernels (interpreted) at a tiny shape.
"""

from __future__ import annotations

import dataclasses
import doctest
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxgemm
from gemm_testing import as_f64, primitive_names, random_array, tolerance
from jaxgemm import gemm_rewrite
from jaxgemm.gemm_rewrite import LEFT, Gemm, Report, default_fp8_filter
from test_fp8_training import QUANT_TOL, rel_err

F32, BF16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)
MATMUL, RAGGED = "jaxgemm_matmul", "jaxgemm_ragged_dot"


def assert_close(out, ref, dtype, what=""):
  """Norm-wise against the float64 `ref`, at the dtype's GEMM tolerance."""
  out64 = as_f64(out)
  assert out64.shape == ref.shape, f"{what}: shape {out64.shape} != {ref.shape}"
  err = np.linalg.norm(out64 - ref) / np.linalg.norm(ref)
  assert err <= tolerance(dtype), f"{what}: ||out - ref|| / ||ref|| = {err:.3g}"


def in_f64(f, *args):
  """f on the arguments in float64 (integers kept), under x64."""
  with jax.enable_x64(True):
    args = jax.tree.map(lambda a: jnp.asarray(as_f64(a)) if jnp.issubdtype(
        jnp.asarray(a).dtype, jnp.floating) else a, args)
    return jax.tree.map(np.asarray, f(*args))


def program(f, *args, **kwargs) -> list[str]:
  """The primitives of f's program, sub-programs included."""
  return primitive_names(jax.make_jaxpr(f)(*args, **kwargs))


def mlp(params, x):
  """Three ways of writing a GEMM: `@`, einsum and jnp.dot."""
  h = jax.nn.relu(x @ params["w1"])
  h = jnp.tanh(jnp.einsum("...f,fd->...d", h, params["w2"]))
  return jnp.dot(h, params["w3"])


def mlp_params(rng, dtype, d=16, f=32):
  return {"w1": random_array(rng, (d, f), dtype) / np.sqrt(d),
          "w2": random_array(rng, (f, d), dtype) / np.sqrt(f),
          "w3": random_array(rng, (d, 8), dtype) / np.sqrt(d)}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_mlp_matches_and_runs_on_jaxgemm(dtype, rng):
  params, x = mlp_params(rng, dtype), random_array(rng, (2, 5, 16), dtype)
  fast = jaxgemm.accelerate(mlp, backend="xla", fuse=False)   # each GEMM on its own
  out = fast(params, x)
  assert out.dtype == mlp(params, x).dtype
  assert_close(out, in_f64(mlp, params, x), dtype)
  names = program(fast, params, x)
  assert names.count(MATMUL) == 3 and "dot_general" not in names
  # The rewrite leaves the rest of the program as it was.
  assert "dot_general" in program(mlp, params, x) and MATMUL not in program(mlp, params, x)


def loss(params, x):
  return jnp.sum(mlp(params, x) ** 2)


def test_gradients_through_jaxgemm_and_of_the_traced_gradient(rng):
  """jax.grad(accelerate(f)) differentiates jaxgemm's primitives; accelerate(jax.grad(f))
  rewrites the gradient's own dots (x 2-D: every backward GEMM contracts one dimension)."""
  params, x = mlp_params(rng, F32), random_array(rng, (6, 16), F32)
  ref = in_f64(jax.grad(loss), params, x)
  outer = jax.grad(jaxgemm.accelerate(loss, backend="xla", fuse=False))
  inner = jaxgemm.accelerate(jax.grad(loss), backend="xla", fuse=False)
  for name, grad in (("grad(accelerate(f))", outer), ("accelerate(grad(f))", inner)):
    got = grad(params, x)
    for w in params:
      assert_close(got[w], ref[w], F32, f"{name} d{w}")
    names = program(grad, params, x)
    assert names.count(MATMUL) == 3 * 3 - 1 and "dot_general" not in names, name  # no dW1 @ x


def test_jit_vmap_and_closures_over_traced_arrays(rng):
  params, xs = mlp_params(rng, F32), random_array(rng, (3, 2, 5, 16), F32)
  fast = jaxgemm.accelerate(mlp, backend="xla")
  ref = in_f64(jax.vmap(mlp, in_axes=(None, 0)), params, xs)
  assert_close(jax.jit(fast)(params, xs[0]), ref[0], F32, "jit")
  assert_close(jax.vmap(fast, in_axes=(None, 0))(params, xs), ref, F32, "vmap")
  assert_close(jax.jit(jax.vmap(fast, in_axes=(None, 0)))(params, xs), ref, F32, "jit(vmap)")
  # fn closing over arrays of an outer jit: they are the program's constants, tracers.
  closure = jax.jit(lambda p, x: jaxgemm.accelerate(lambda x: mlp(p, x), backend="xla")(x))
  assert_close(closure(params, xs[1]), ref[1], F32, "closure")
  assert MATMUL in program(closure, params, xs[1])


def test_pytrees_and_kwargs_in_and_out(rng):
  params, x = mlp_params(rng, F32), random_array(rng, (4, 16), F32)
  traces = []

  def fn(params, x, *, scale, act="tanh", flip=False):
    traces.append(1)
    h = getattr(jnp, act)(x @ params["w1"])
    if flip:   # a Python flag: static, as it is to fn run as written
      h = -h
    return {"y": scale * (h @ params["w2"]), "h": (h, None)}

  fast = jaxgemm.accelerate(fn, backend="xla")
  assert inspect.signature(fast) == inspect.signature(fn) and fast.__name__ == "fn"
  got = fast(params, x, scale=2.0, act="sin")
  want = in_f64(lambda p, x: fn(p, x, scale=2.0, act="sin"), params, x)
  assert jax.tree.structure(got) == jax.tree.structure(fn(params, x, scale=2.0, act="sin"))
  assert_close(got["y"], want["y"], F32, "y")
  assert_close(got["h"][0], want["h"][0], F32, "h")
  # Traced once per input signature: the same call again is not retraced, another
  # static value is.
  n = len(traces)
  fast(params, x, scale=2.0, act="sin")
  assert len(traces) == n
  flipped = fast(params, random_array(rng, (4, 16), F32), scale=2, act="sin", flip=True)
  assert len(traces) == n + 1 and flipped["y"].dtype == F32
  flipped = fast(params, x, scale=2.0, act="sin", flip=True)
  assert_close(flipped["y"], -want["y"], F32, "flip")


def test_closed_over_arrays_are_read_at_every_call(rng):
  """A program with constants (here a weight read from a mutable holder, as an nnx
  Module's) is traced again at each call: never an earlier call's weights."""
  holder = {"w": random_array(rng, (16, 8), F32)}
  fast = jaxgemm.accelerate(lambda x: x @ holder["w"], backend="xla")
  x = random_array(rng, (4, 16), F32)
  fast.explain(x)
  for _ in range(2):
    holder["w"] = random_array(rng, (16, 8), F32)
    assert_close(fast(x), as_f64(x) @ as_f64(holder["w"]), F32)
  dw = jax.grad(lambda w: jaxgemm.accelerate(lambda x: x @ w, backend="xla")(x).sum())(
      holder["w"])
  assert_close(dw, np.broadcast_to(as_f64(x).sum(0)[:, None], (16, 8)), F32, "dw")


def scanned(stack, x):
  """A scan over stacked layer weights, each layer checkpointed; then a cond."""
  @jax.checkpoint
  def layer(h, w):
    return jnp.tanh(h @ w)

  h, _ = lax.scan(lambda h, w: (layer(h, w), None), x, stack)
  return lax.cond(h.sum() > 0, lambda h: h @ stack[0], lambda h: h @ stack[1], h)


def layers(stack, x):
  """`scanned`, then a while loop."""
  h = scanned(stack, x)
  _, h = lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, jnp.sin(c[1] @ stack[0])),
                        (0, h))
  return h


def test_scan_checkpoint_cond_and_while_are_rewritten_inside(rng):
  stack, x = random_array(rng, (3, 16, 16), F32) / 4, random_array(rng, (4, 16), F32)
  fast = jaxgemm.accelerate(layers, backend="xla", fuse=False)
  assert_close(fast(stack, x), in_f64(layers, stack, x), F32)
  jaxpr = jax.make_jaxpr(fast)(stack, x)
  outer = [e.primitive.name for e in jaxpr.jaxpr.eqns]
  assert {"scan", "cond", "while"} <= set(outer)
  names = primitive_names(jaxpr)
  assert "dot_general" not in names and names.count(MATMUL) == 4
  assert jaxgemm.accelerate(layers).explain(stack, x)[0].where.startswith("scan (eqn")
  # The gradient through the checkpointed layers, the scan and the cond (their rules
  # differentiate the rewritten bodies; a while loop has no reverse-mode rule).
  f = lambda stack, x: jnp.sum(scanned(stack, x)[:, :4] ** 2)   # noqa: E731
  g = jax.grad(jaxgemm.accelerate(f, backend="xla", fuse=False))(stack, x)
  assert_close(g, in_f64(jax.grad(f), stack, x), F32, "d stack")


def test_constants_the_rewrite_makes_inside_a_checkpoint_become_its_inputs(rng, monkeypatch):
  """A checkpoint's sub-program is open (no constants): were jaxgemm's call to make an
  array constant, it becomes a leading input of the rebound checkpoint."""
  shift = np.arange(8, dtype=np.float32)

  def dot_general_plus_constant(lhs, rhs, dimension_numbers, **kwargs):
    return lax.dot_general(lhs, rhs, dimension_numbers) + jnp.asarray(shift)

  monkeypatch.setattr(gemm_rewrite.matmul_api, "dot_general",
                      dot_general_plus_constant)
  f = jax.checkpoint(lambda x, w: jnp.sin(x @ w), prevent_cse=False)
  x, w = random_array(rng, (4, 8), F32), random_array(rng, (8, 8), F32)
  fast = jaxgemm.accelerate(f, backend="xla")
  (remat,) = jax.make_jaxpr(fast)(x, w).jaxpr.eqns
  assert len(remat.invars) == 3 and remat.params["jaxpr"].constvars == []
  ref = lambda x, w: jnp.sin(x @ w + shift)   # noqa: E731
  assert_close(fast(x, w), in_f64(ref, x, w), F32)
  assert_close(jax.grad(lambda w: fast(x, w).sum())(w),
               in_f64(jax.grad(lambda w: ref(x, w).sum()), w), F32, "dw")


def test_flax_nnx_linear_and_einsum(rng):
  nnx = pytest.importorskip("flax.nnx")

  class Block(nnx.Module):
    def __init__(self, rngs):
      self.up = nnx.Linear(16, 32, rngs=rngs)
      self.down = nnx.Einsum("btf,fd->btd", (32, 16), (16,), rngs=rngs)

    def __call__(self, x):
      return self.down(jax.nn.gelu(self.up(x)))

  graphdef, state = nnx.split(Block(nnx.Rngs(int(rng.integers(1 << 30)))))
  fn = lambda state, x: nnx.merge(graphdef, state)(x)   # noqa: E731
  x = random_array(rng, (2, 5, 16), F32)
  fast = jaxgemm.accelerate(fn, backend="xla")
  assert_close(fast(state, x), in_f64(fn, state, x), F32)
  names = program(fast, state, x)
  assert names.count(MATMUL) == 2 and "dot_general" not in names
  report = fast.explain(state, x)
  assert [g.source.split(":")[0] for g in report] == ["linear.py", "linear.py"]

  # A Module itself, accelerated inside nnx.jit and nnx.grad.
  @nnx.jit
  def grads(model, x):
    return nnx.grad(lambda m: jnp.sum(jaxgemm.accelerate(m, backend="xla")(x) ** 2))(model)

  got = nnx.state(grads(nnx.merge(graphdef, state), x))
  ref = in_f64(jax.grad(lambda state, x: jnp.sum(fn(state, x) ** 2)), state, x)
  for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    assert_close(g, r, F32, "nnx.grad")
  names = program(lambda state, x: nnx.state(grads(nnx.merge(graphdef, state), x)), state, x)
  assert names.count(MATMUL) == 2 + 3 and "dot_general" not in names   # no dx of x


def moe(x, w, group_sizes):
  return lax.ragged_dot(jax.nn.silu(x), w, group_sizes)


def test_ragged_dot_moe_layer(rng):
  x, w = random_array(rng, (24, 16), F32), random_array(rng, (3, 16, 8), F32)
  gs = jnp.array([5, 0, 15], jnp.int32)   # an empty expert, and 4 rows in none
  fast = jaxgemm.accelerate(moe, backend="xla")
  assert_close(fast(x, w, gs), in_f64(moe, x, w, gs), F32)
  assert RAGGED in program(fast, x, w, gs) and "ragged_dot_general" not in program(fast, x, w, gs)
  f = lambda x, w: jnp.sum(moe(x, w, gs) ** 2)   # noqa: E731
  ref = in_f64(jax.grad(f, argnums=(0, 1)), x, w)
  for name, grad in (("grad(accelerate(f))", jax.grad(jaxgemm.accelerate(f, backend="xla"),
                                                      argnums=(0, 1))),
                     ("accelerate(grad(f))", jaxgemm.accelerate(jax.grad(f, argnums=(0, 1)),
                                                                backend="xla"))):
    got = grad(x, w)
    assert_close(got[0], ref[0], F32, f"{name} dx")
    assert_close(got[1], ref[1], F32, f"{name} dw")
    assert "ragged_dot_general" not in program(grad, x, w), name


def odd(x, a, i):
  """Dots jaxgemm's kernels do not take: a middle contracting dim, integer operands."""
  middle = lax.dot_general(x, a, (((1,), (0,)), ((), ())))     # x (4, 8, 5) contracting 8
  return middle, i @ i


@pytest.mark.parametrize("backend", ["auto", "xla"])
def test_dots_jaxgemm_cannot_take_stay_and_say_why(backend, rng):
  x, a = random_array(rng, (4, 8, 5), F32), random_array(rng, (8, 3), F32)
  i = random_array(rng, (4, 4), np.int32)
  fast = jaxgemm.accelerate(odd, backend=backend)
  middle, ints = fast(x, a, i)
  assert_close(middle, in_f64(odd, x, a, i)[0], F32)
  np.testing.assert_array_equal(ints, np.asarray(i) @ np.asarray(i))
  assert program(fast, x, a, i).count("dot_general") == 2
  report = fast.explain(x, a, i)
  assert [g.became for g in report] == [LEFT, LEFT]
  assert "lhs contracting dimension(s) (1,) are not first or last" in report[0].why
  assert "floating operands" in report[1].why and "int32" in report[1].why


def test_custom_derivative_and_shard_map_bodies_are_left_with_the_reason(rng):
  @jax.custom_jvp
  def f(x, w):
    return x @ w
  f.defjvp(lambda p, t: (f(*p), t[0] @ p[1] + p[0] @ t[1]))
  mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  per_device = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("x"), P()),
                             out_specs=P("x"))
  x, w = random_array(rng, (4, 8), F32), random_array(rng, (8, 8), F32)
  fast = jaxgemm.accelerate(lambda x, w: per_device(f(x, w), w) @ w, backend="xla")
  custom, sharded, outside = fast.explain(x, w)
  assert custom.became == LEFT and "inside custom_jvp_call" in custom.why
  assert sharded.became == LEFT and "inside shard_map" in sharded.why
  assert outside.became == "jaxgemm.dot_general (backend='xla')"
  assert_close(fast(x, w), in_f64(lambda x, w: x @ w @ w @ w, x, w), F32)


def test_triton_kernels(rng):
  """The Triton kernels (interpreted on the CPU), forward and gradient, at a tiny shape."""
  params, x = mlp_params(rng, F32, d=16, f=16), random_array(rng, (16, 16), F32)
  fast = jaxgemm.accelerate(loss, backend="triton")
  jaxpr = jax.make_jaxpr(jax.grad(fast))(params, x)
  backends = {e.params["backend"] for e in jaxpr.eqns if e.primitive.name == MATMUL}
  assert backends == {"triton"}
  got, ref = jax.jit(jax.grad(fast))(params, x), in_f64(jax.grad(loss), params, x)
  assert_close(got["w1"], ref["w1"], F32, "dw1")


def two_linear(x, w_big, w_small):
  return (x @ w_big) @ w_small


def test_fp8_routes_what_gains_and_the_filter_decides(rng):
  s = jax.ShapeDtypeStruct
  # 4096 x 512 x 512 = 2**30 multiply-adds, K and N multiples of 128: FP8 by default;
  # 512 x 64 not (N = 64).
  big = (s((4096, 512), BF16), s((512, 512), BF16), s((512, 64), BF16))
  report = jaxgemm.accelerate(two_linear, fp8="block").explain(*big)
  assert report[0].became == "jaxgemm.matmul fp8=block (backend='auto')" and report[0].fp8
  assert report[1].became == "jaxgemm.dot_general (backend='auto')"
  assert "default fp8_filter" in report[1].why and "N=64" in report[1].why

  # Small GEMMs stay bf16 by default; a filter forces one in.
  x, w = random_array(rng, (48, 256), BF16), random_array(rng, (256, 256), BF16) / 16
  w_small = random_array(rng, (256, 128), BF16) / 16
  default = jaxgemm.accelerate(two_linear, fp8="block", backend="xla")
  assert not any(g.fp8 for g in default.explain(x, w, w_small))
  assert "jaxgemm_scaled_matmul" not in program(default, x, w, w_small)
  seen = []
  forced = jaxgemm.accelerate(lambda x, w: x @ w, fp8="block", backend="xla",
                              fp8_filter=lambda g: seen.append(g) or True)
  (gemm,) = forced.explain(x, w)
  assert gemm.fp8 and seen[0].became == "jaxgemm.dot_general (backend='xla')"
  assert "jaxgemm_scaled_matmul" in program(forced, x, w)
  y = jax.jit(forced)(x, w)
  assert y.dtype == BF16
  assert rel_err(y, as_f64(x) @ as_f64(w)) < QUANT_TOL["float8_e4m3fn"]


def test_fp8_grouped_gemm(rng):
  x, w = random_array(rng, (48, 256), BF16), random_array(rng, (2, 256, 128), BF16) / 16
  gs = jnp.array([20, 28], jnp.int32)
  fast = jaxgemm.accelerate(lambda x, w, gs: lax.ragged_dot(x, w, gs), fp8="tensor",
                            backend="xla", fp8_filter=lambda g: True)
  (gemm,) = fast.explain(x, w, gs)
  assert gemm.became == "jaxgemm.ragged_dot fp8=tensor (backend='xla')" and gemm.groups == 2
  y = jax.jit(fast)(x, w, gs)
  ref = np.concatenate([as_f64(x[:20]) @ as_f64(w[0]), as_f64(x[20:]) @ as_f64(w[1])])
  assert rel_err(y, ref) < QUANT_TOL["float8_e4m3fn"]
  assert "jaxgemm_scaled_ragged_dot" in program(fast, x, w, gs)


def test_explain_report(rng):
  params, x = mlp_params(rng, F32), random_array(rng, (2, 5, 16), F32)
  report = jaxgemm.accelerate(mlp).explain(params, x)
  assert isinstance(report, Report) and len(report) == 3
  first = report[0]
  assert isinstance(first, Gemm)
  assert (first.where, first.primitive) == ("eqn 0", "dot_general")
  assert first.source.startswith("test_accelerate.py:") and "(mlp)" in first.source
  assert (first.lhs_shape, first.rhs_shape, first.out_shape) == ((2, 5, 16), (16, 32), (2, 5, 32))
  assert (first.lhs_dtype, first.out_dtype) == ("float32", "float32")
  assert (first.batch, first.m, first.n, first.k) == (1, 10, 32, 16)
  # fuse=True (the default): relu(x @ w1) is one fused op.
  assert first.became == "jaxgemm.matmul(activation='relu') (backend='auto')"
  assert first.why == ""
  with pytest.raises(dataclasses.FrozenInstanceError):
    first.became = "x"   # frozen
  text = str(report)
  assert "3 GEMM(s) found, 3 on jaxgemm, 0 left on XLA" in text
  assert "fuse=True" in text and "jaxgemm.matmul(activation='tanh')" in text
  assert "float32[2,5,16] x float32[16,32] -> float32[2,5,32]" in text
  unfused = str(jaxgemm.accelerate(mlp, fuse=False).explain(params, x))
  assert "fuse=False" in unfused and "activation=" not in unfused
  # Abstract arguments do.
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, x))
  assert jaxgemm.accelerate(mlp).explain(*abstract) == report


def test_default_fp8_filter():
  g = Gemm("eqn 0", None, "dot_general", (4096, 512), (512, 512), (4096, 512), "bfloat16",
           "bfloat16", "bfloat16", batch=1, m=4096, n=512, k=512)
  assert default_fp8_filter(g)
  assert not default_fp8_filter(dataclasses.replace(g, m=2048))   # 2**29
  assert not default_fp8_filter(dataclasses.replace(g, n=520, m=8192))
  assert not default_fp8_filter(dataclasses.replace(g, lhs_dtype="int8"))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(fn=3), TypeError, "fn must be callable"),
    (dict(backend="nope"), ValueError, "backend='nope'"),
    (dict(backend=None), TypeError, "backend"),
    (dict(fp8="e4m3"), ValueError, "fp8='e4m3'"),
    (dict(fp8_filter=lambda g: True), ValueError, "fp8_filter= .* pass fp8="),
    (dict(fp8="block", fp8_filter=3), TypeError, "fp8_filter must be a function"),
    (dict(fp8=jaxgemm.Fp8Recipe(backend="triton"), backend="xla"), ValueError,
     "backend='xla' and fp8's backend='triton' differ"),
    (dict(fuse="yes"), TypeError, "fuse must be True or False"),
])
def test_bad_arguments(kwargs, error, match):
  fn = kwargs.pop("fn", mlp)
  with pytest.raises(error, match=match):
    jaxgemm.accelerate(fn, **kwargs)


def test_docstring_examples():
  result = doctest.testmod(gemm_rewrite)
  assert result.attempted >= 5 and result.failed == 0


# ---------------------------------------------------------------- fuse=True

ACTIVATIONS_AS_WRITTEN = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu,
                          "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh}


def _epilogue_operands(rng, dtype, rows=(2, 6), d=16, n=24):
  x = random_array(rng, (*rows, d), dtype)
  w = (random_array(rng, (d, n), F32) / np.sqrt(d)).astype(dtype)
  b = random_array(rng, (n,), dtype)
  r = random_array(rng, (*rows, n), dtype)
  return x, w, b, r


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS_AS_WRITTEN))
def test_epilogue_written_with_jnp_becomes_one_fused_op(activation, rng):
  """act(x @ w + b) + r, written with jnp: one `jaxgemm_fused_matmul` (no dot_general,
  no separate add), matching float64 (bound: the GEMM's, through the activation's slope
  of at most 1.13, plus the residual), with its gradient through the fused op's VJP."""
  act = ACTIVATIONS_AS_WRITTEN[activation]
  f = lambda x, w, b, r: act(x @ w + b) + r
  x, w, b, r = _epilogue_operands(rng, F32)
  fast = jaxgemm.accelerate(f, backend="xla")
  names = program(fast, x, w, b, r)
  assert names.count("jaxgemm_fused_matmul") == 1 and "dot_general" not in names, names
  (entry,) = fast.explain(x, w, b, r)
  assert entry.became == (f"jaxgemm.matmul(bias, activation={activation!r}, residual) "
                          f"(backend='xla')")
  x64, w64, b64, r64 = (as_f64(t) for t in (x, w, b, r))
  act64 = {"gelu": lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))),
           "relu": lambda z: np.maximum(z, 0), "silu": lambda z: z / (1 + np.exp(-z)),
           "sigmoid": lambda z: 1 / (1 + np.exp(-z)), "tanh": np.tanh}[activation]
  want = act64(x64 @ w64 + b64) + r64
  bound = 1.13 * (np.abs(x64) @ np.abs(w64) + np.abs(b64)) + np.abs(r64)
  tol = tolerance(F32)
  assert np.all(np.abs(np.asarray(fast(x, w, b, r), np.float64) - want) <= tol * bound)
  g_fast = jax.grad(lambda w: fast(x, w, b, r).sum())(w)
  g_want = jax.grad(lambda w: f(x, w, b, r).sum())(w)
  assert rel_err(g_fast, g_want) < 10 * tol


def test_glu_written_with_jnp_becomes_one_glu(rng):
  """silu(x @ wg + bg) * (x @ wu + bu), the same x: one `jaxgemm_glu`; without biases too."""
  x, wg, bg, _ = _epilogue_operands(rng, F32)
  _, wu, bu, _ = _epilogue_operands(rng, F32)
  for f, biases in ((lambda x: jax.nn.silu(x @ wg + bg) * (x @ wu + bu), ", biases"),
                    (lambda x: (x @ wu) * jax.nn.silu(x @ wg), "")):
    fast = jaxgemm.accelerate(f, backend="xla")
    names = program(fast, x)
    assert names.count("jaxgemm_glu") == 1 and "dot_general" not in names, names
    assert {g.became for g in fast.explain(x)} == {
        f"jaxgemm.glu(activation='silu'{biases}) (backend='xla')"}
    assert rel_err(fast(x), f(x)) < 10 * tolerance(F32)


def test_values_read_elsewhere_are_not_fused_away(rng):
  """h = x @ w + b read twice: the bias is fused (h is the fused op's result), the
  activation is not; in accelerate(grad(f)) the backward reads the pre-activation, so
  the forward's activation stays as written, and the gradient matches."""
  x, w, b, _ = _epilogue_operands(rng, F32)

  def f(x, w, b):
    h = x @ w + b
    return jax.nn.gelu(h) + h

  fast = jaxgemm.accelerate(f, backend="xla")
  assert [g.became for g in fast.explain(x, w, b)] == ["jaxgemm.matmul(bias) (backend='xla')"]
  assert rel_err(fast(x, w, b), f(x, w, b)) < 10 * tolerance(F32)
  loss = lambda w: jnp.sum(jax.nn.gelu(x @ w + b))
  inner = jaxgemm.accelerate(jax.grad(loss), backend="xla")
  assert rel_err(inner(w), jax.grad(loss)(w)) < 10 * tolerance(F32)


def test_fp8_takes_the_epilogue_along(rng):
  """With fp8=, a fused epilogue runs jaxgemm.matmul(fp8=, bias=, activation=)."""
  x = random_array(rng, (256, 256), BF16)
  w = (random_array(rng, (256, 256), F32) / 16).astype(BF16)
  b = random_array(rng, (256,), BF16)
  f = lambda x, w, b: jax.nn.relu(x @ w + b)
  fast = jaxgemm.accelerate(f, backend="xla", fp8="block", fp8_filter=lambda g: True)
  (entry,) = fast.explain(x, w, b)
  assert entry.became == "jaxgemm.matmul(bias, activation='relu') fp8=block (backend='xla')"
  assert rel_err(fast(x, w, b), f(x, w, b)) < QUANT_TOL["float8_e4m3fn"]
