"""ragged_dot on every registered kernel: lax.ragged_dot's contract, every transformation.

Each test taking `kernel` runs on every (backend, variant) registered for the
op (tests/conftest.py), the CPU run in Triton's and Mosaic GPU's interpreters,
against a float64 reference computed here from the group sizes (never through
lax.ragged_dot, whose own vmap fails where ours must not).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm
from gemm_testing import (as_f64, assert_gemm_close, ragged_bounds, random_array,
                          tolerance)

pytestmark = pytest.mark.op("ragged_dot")


# ----------------------------------------------------------------- references

def reference(lhs, rhs, group_sizes, *, trans_rhs=False):
  """(out, |lhs| @ |rhs| bound) in float64 of the ragged-M product."""
  a, w = as_f64(lhs), as_f64(rhs)
  if trans_rhs:
    w = np.swapaxes(w, -1, -2)
  out = np.zeros((a.shape[0], w.shape[-1]))
  bound = np.zeros_like(out)
  for g, (s, e) in enumerate(zip(*ragged_bounds(group_sizes, a.shape[0]))):
    out[s:e] = a[s:e] @ w[g]
    bound[s:e] = np.abs(a[s:e]) @ np.abs(w[g])
  return out, bound


def reference_contracting(lhs, rhs, group_sizes):
  """(out, bound) in float64 of the ragged-K product: out[g] = lhs[rows g]^T rhs[rows g]."""
  a, d = as_f64(lhs), as_f64(rhs)
  starts, ends = ragged_bounds(group_sizes, a.shape[0])
  out = np.stack([a[s:e].T @ d[s:e] for s, e in zip(starts, ends)])
  bound = np.stack([np.abs(a[s:e]).T @ np.abs(d[s:e]) for s, e in zip(starts, ends)])
  return out, bound


def dense(lhs, rhs, group_sizes):
  """The ragged-M product as a masked dense einsum: differentiable by jax in any order."""
  ends = jnp.cumsum(group_sizes)
  rows = jnp.arange(lhs.shape[0])[:, None]
  mask = ((rows >= ends - group_sizes) & (rows < ends)).astype(lhs.dtype)
  return jnp.einsum("mg,mk,gkn->mn", mask, lhs, rhs, precision=lax.Precision.HIGHEST)


def supported(kernel, *avals, fn=None, **kw) -> str | None:
  """None if `kernel` takes the call, else its NotImplementedError's reason."""
  fn = fn or jaxgemm.ragged_dot
  try:
    jax.eval_shape(lambda *a: fn(*a, **kw, **kernel.kw), *avals)
  except NotImplementedError as e:
    if kernel.is_xla:
      raise
    return str(e)
  return None


def skip_unless(kernel, *args, **kw):
  avals = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype) for x in args]
  reason = supported(kernel, *avals, **kw)
  if reason is not None:
    pytest.skip(f"{kernel} does not take this case: {reason}")


# ----------------------------------------------------------------- the forward

# (M, K, N, group sizes): empty groups, a group of one row, groups that cut
# tiles, rows past sum(group_sizes), a sum past M (clamped, as lax does).
FORWARD = [
    pytest.param((48, 32, 24, (16, 0, 1, 31)), id="empty-and-single-row"),
    pytest.param((70, 40, 36, (9, 30, 0, 20)), id="tail-rows-zero"),
    pytest.param((33, 16, 48, (20, 20)), id="sum-past-m"),
    pytest.param((64, 24, 16, (0, 0, 64)), id="one-group-holds-all"),
]
DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.cases(FORWARD)
@pytest.mark.slow_for_kernels(keep=1)   # Mosaic GPU's interpreter: ~6 s a case
def test_forward_matches_float64(kernel, case, dtype, rng):
  m, k, n, sizes = case
  lhs = random_array(rng, (m, k), dtype)
  rhs = random_array(rng, (len(sizes), k, n), dtype)
  group_sizes = jnp.asarray(sizes, jnp.int32)
  skip_unless(kernel, lhs, rhs, group_sizes)
  out = jax.jit(lambda *a: jaxgemm.ragged_dot(*a, **kernel.kw))(lhs, rhs, group_sizes)
  assert out.dtype == dtype and out.shape == (m, n)
  ref, bound = reference(lhs, rhs, sizes)
  assert_gemm_close(out, ref, bound, tolerance(dtype), f"{kernel} {case}")
  _, end = ragged_bounds(sizes, m)
  assert not np.asarray(out[end[-1]:], np.float32).any(), "rows past the groups are not zero"


@pytest.mark.kernel_backends
def test_empty_groups_and_tail_rows_are_not_read(kernel, rng):
  """NaN weights of an empty group and NaN rows past the groups leave the result finite:
  nothing reads them (a kernel that multiplied them by zero would give NaN)."""
  m, k, n = 40, 32, 24
  lhs = random_array(rng, (m, k), jnp.float16).at[30:].set(jnp.nan)
  rhs = random_array(rng, (3, k, n), jnp.float16).at[1].set(jnp.nan)
  sizes = (12, 0, 18)
  skip_unless(kernel, lhs, rhs, jnp.asarray(sizes))
  out = jaxgemm.ragged_dot(lhs, rhs, jnp.asarray(sizes), **kernel.kw)
  assert np.isfinite(np.asarray(out, np.float32)).all()
  ref, bound = reference(lhs[:30], rhs.at[1].set(0), sizes)
  assert_gemm_close(out[:30], ref, bound, tolerance(jnp.float16), str(kernel))
  assert not np.asarray(out[30:], np.float32).any()


def test_xla_backend_spreads_an_empty_groups_nan_as_lax_does(rng):
  """The documented difference (`ragged_dot`'s docstring): backend="xla" is
  lax.ragged_dot, which may spread a NaN from an empty group's weights (on the CPU
  to every row); the kernels do not read them (the test above)."""
  lhs = random_array(rng, (40, 32), jnp.float32)
  rhs = random_array(rng, (3, 32, 24), jnp.float32).at[1].set(jnp.nan)
  sizes = jnp.asarray([12, 0, 18])
  ours = np.asarray(jaxgemm.ragged_dot(lhs, rhs, sizes, backend="xla"))
  theirs = np.asarray(lax.ragged_dot(lhs, rhs, sizes))
  np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
  if jax.default_backend() == "cpu":
    assert np.isnan(theirs).all()


@pytest.mark.parametrize("form", ["trans_rhs", "contracting"])
def test_ragged_dot_general_forms(kernel, form, rng):
  """The two forms the backward runs, called directly, with a leading batch dimension."""
  b, m, k, n, sizes = 2, 50, 24, 40, ((10, 0, 40), (3, 30, 7))
  dtype = jnp.float16
  group_sizes = jnp.asarray(sizes, jnp.int32)
  lhs = random_array(rng, (b, m, k), dtype)
  if form == "trans_rhs":
    rhs = random_array(rng, (b, 3, n, k), dtype)
    numbers = lax.RaggedDotDimensionNumbers((([2], [3]), ([0], [0])), [1], [1])
  else:
    rhs = random_array(rng, (b, m, n), dtype)
    numbers = lax.RaggedDotDimensionNumbers((([1], [1]), ([0], [0])), [1], [])
  fn = lambda l, r, g: jaxgemm.ragged_dot_general(l, r, g, numbers, **kernel.kw)
  avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (lhs, rhs, group_sizes)]
  reason = supported(kernel, *avals, fn=lambda l, r, g, **kw: jaxgemm.ragged_dot_general(
      l, r, g, numbers, **kw))
  if reason is not None:
    pytest.skip(f"{kernel} does not take {form}: {reason}")
  out = jax.jit(fn)(lhs, rhs, group_sizes)
  want = lax.ragged_dot_general(lhs, rhs, group_sizes, numbers)
  assert out.shape == want.shape and out.dtype == want.dtype
  for i in range(b):
    if form == "trans_rhs":
      ref, bound = reference(lhs[i], rhs[i], sizes[i], trans_rhs=True)
      got = out[i]
    else:
      ref, bound = reference_contracting(lhs[i], rhs[i], sizes[i])
      got = out[:, i]
    assert_gemm_close(got, ref, bound, tolerance(dtype), f"{kernel} {form} batch {i}")


# ----------------------------------------------------------------- transformations

def _f32_case(rng, m=40, k=16, n=24, sizes=(10, 0, 25)):
  lhs = random_array(rng, (m, k), jnp.float32)
  rhs = random_array(rng, (len(sizes), k, n), jnp.float32)
  return lhs, rhs, jnp.asarray(sizes, jnp.int32)


def _grad_tol(kernel):
  # fp32 operands run as TF32 on the kernels' tensor cores in the GPU tier; the
  # CPU interpreters and XLA:CPU are exact.
  return tolerance(jnp.float32, precision=None)


@pytest.mark.slow_for_kernels
def test_grad_wrt_lhs_and_rhs(kernel, rng):
  lhs, rhs, group_sizes = _f32_case(rng)
  skip_unless(kernel, lhs, rhs, group_sizes)
  cot = random_array(rng, (lhs.shape[0], rhs.shape[-1]), jnp.float32)
  loss = lambda l, r: (jaxgemm.ragged_dot(l, r, group_sizes, **kernel.kw) * cot).sum()
  d_lhs, d_rhs = jax.jit(jax.grad(loss, (0, 1)))(lhs, rhs)
  # d lhs = cot @ rhs[g]^T per group; d rhs[g] = lhs[rows g]^T cot[rows g].
  ref_l, bound_l = reference(cot, rhs, group_sizes, trans_rhs=True)
  ref_r, bound_r = reference_contracting(lhs, cot, group_sizes)
  assert_gemm_close(d_lhs, ref_l, bound_l, _grad_tol(kernel), f"{kernel} d lhs")
  assert_gemm_close(d_rhs, ref_r, bound_r, _grad_tol(kernel), f"{kernel} d rhs")
  assert not np.asarray(d_rhs[1]).any(), "an empty group's weights got a gradient"


@pytest.mark.slow_for_kernels
def test_jvp_and_second_order(kernel, rng):
  lhs, rhs, group_sizes = _f32_case(rng, m=24, k=8, n=8, sizes=(5, 0, 12))
  skip_unless(kernel, lhs, rhs, group_sizes)
  t_lhs, t_rhs = random_array(rng, lhs.shape, jnp.float32), random_array(rng, rhs.shape,
                                                                         jnp.float32)
  ours = lambda l, r: jaxgemm.ragged_dot(l, r, group_sizes, **kernel.kw)
  theirs = lambda l, r: dense(l, r, group_sizes)
  out, tangent = jax.jit(lambda *a: jax.jvp(ours, a[:2], a[2:]))(lhs, rhs, t_lhs, t_rhs)
  want_out, want_tangent = jax.jvp(theirs, (lhs, rhs), (t_lhs, t_rhs))
  tol = _grad_tol(kernel)
  np.testing.assert_allclose(out, want_out, rtol=tol, atol=tol * 10)
  np.testing.assert_allclose(tangent, want_tangent, rtol=tol, atol=tol * 10)
  # The Hessian of a quartic loss in rhs: grad of grad runs every mode twice.
  loss = lambda f: lambda r: (f(lhs, r) ** 2).sum()
  hess = jax.jit(jax.hessian(loss(ours)))(rhs)
  want = jax.hessian(loss(theirs))(rhs)
  np.testing.assert_allclose(hess, want, rtol=tol, atol=tol * float(np.abs(want).max()))


@pytest.mark.slow_for_kernels
def test_vmap_every_operand(kernel, rng):
  """vmap over lhs alone, over group sizes alone, and over all three."""
  lhs, rhs, group_sizes = _f32_case(rng, m=24, k=16, n=16, sizes=(7, 0, 9))
  skip_unless(kernel, lhs, rhs, group_sizes)
  ours = lambda l, r, g: jaxgemm.ragged_dot(l, r, g, **kernel.kw)
  lhs2 = jnp.stack([lhs, -2 * lhs])
  sizes2 = jnp.asarray([[7, 0, 9], [0, 24, 0]], jnp.int32)
  tol = _grad_tol(kernel)
  for axes, args in (((0, None, None), (lhs2, rhs, group_sizes)),
                     ((None, None, 0), (lhs, rhs, sizes2)),
                     ((0, 0, 0), (lhs2, jnp.stack([rhs, rhs[::-1]]), sizes2))):
    out = jax.jit(jax.vmap(ours, in_axes=axes))(*args)
    want = jax.vmap(dense, in_axes=axes)(*args)
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * 10, err_msg=f"{axes}")


@pytest.mark.slow_for_kernels
def test_group_sizes_change_without_recompiling(kernel, rng):
  """group_sizes is a device array under jit: new routing runs the same executable."""
  lhs, rhs, _ = _f32_case(rng, m=32, k=16, n=16, sizes=(1, 1, 1))
  skip_unless(kernel, lhs, rhs, jnp.zeros(3, jnp.int32))
  f = jax.jit(lambda l, r, g: jaxgemm.ragged_dot(l, r, g, **kernel.kw))
  for sizes in ((32, 0, 0), (3, 20, 9), (0, 0, 5)):
    out = f(lhs, rhs, jnp.asarray(sizes, jnp.int32))
    ref, bound = reference(lhs, rhs, sizes)
    assert_gemm_close(out, ref, bound, _grad_tol(kernel), f"{kernel} {sizes}")
  assert f._cache_size() == 1


# ----------------------------------------------------------------- the contract

def test_integer_group_sizes_get_no_gradient():
  lhs, rhs = jnp.ones((6, 4)), jnp.ones((2, 4, 3))
  f = lambda g: jaxgemm.ragged_dot(lhs, rhs, g).sum()
  grads = jax.grad(f, allow_int=True)(jnp.asarray([2, 3]))
  assert grads.dtype == jax.dtypes.float0


@pytest.mark.parametrize("lhs_dtype,rhs_dtype,preferred", [
    (jnp.bfloat16, jnp.float32, None),
    (jnp.bfloat16, jnp.bfloat16, jnp.float32),
    (jnp.int32, jnp.int32, None),
])
def test_auto_matches_lax_dtypes(lhs_dtype, rhs_dtype, preferred, rng):
  lhs = random_array(rng, (12, 8), lhs_dtype)
  rhs = random_array(rng, (2, 8, 4), rhs_dtype)
  sizes = jnp.asarray([5, 4])
  out = jaxgemm.ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred)
  want = lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred)
  assert out.dtype == want.dtype
  np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(want, np.float64),
                             rtol=1e-2, atol=1e-2)


def test_named_backend_refuses_integers_with_the_reason():
  with pytest.raises(NotImplementedError, match="floating operands"):
    jaxgemm.ragged_dot(jnp.ones((4, 2), jnp.int32), jnp.ones((1, 2, 2), jnp.int32),
                       jnp.asarray([4]), backend="xla")


@pytest.mark.parametrize("call,error,match", [
    (lambda: jaxgemm.ragged_dot(jnp.ones((2, 6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([3, 3])),
     TypeError, r"lhs must be 2-D \(M, K\)"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((4, 3)), jnp.asarray([3, 3])),
     TypeError, r"rhs must be 3-D \(G, K, N\)"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 5, 3)), jnp.asarray([3, 3])),
     TypeError, r"contracting dimensions differ.*K=4.*K=5"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([3, 2, 1])),
     TypeError, r"group_sizes.shape=\(3,\) must be \(2,\)"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([3., 3.])),
     TypeError, r"group_sizes must have an integer dtype"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([[3, 3]])),
     TypeError, r"group_sizes must be 1-D"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([3, 3]),
                                backend="cublas"),
     ValueError, r"unknown backend='cublas'; valid backends: \['auto', 'xla'"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([3, 3]),
                                backend="xla", variant="grouped"),
     ValueError, r"unknown variant='grouped' for backend='xla'"),
    (lambda: jaxgemm.ragged_dot(jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.asarray([3, 3]),
                                backend="xla", config=jaxgemm.TritonConfig()),
     TypeError, r"takes config=XlaRaggedDotConfig"),
])
def test_bad_inputs_name_the_argument(call, error, match):
  with pytest.raises(error, match=match):
    call()


def test_other_dimension_numbers_go_to_lax_under_auto_only(rng):
  """A ragged batch dimension (lax's third mode) is not a kernel form."""
  lhs = random_array(rng, (2, 6, 4), jnp.float32)
  rhs = random_array(rng, (2, 4, 3), jnp.float32)
  numbers = lax.RaggedDotDimensionNumbers((([2], [1]), ([0], [0])), [0], [])
  sizes = jnp.asarray([1, 1])
  np.testing.assert_allclose(jaxgemm.ragged_dot_general(lhs, rhs, sizes, numbers),
                             lax.ragged_dot_general(lhs, rhs, sizes, numbers), rtol=1e-6)
  with pytest.raises(NotImplementedError, match="cannot run this ragged_dot: lhs must be"):
    jaxgemm.ragged_dot_general(lhs, rhs, sizes, numbers, backend="xla")


# ----------------------------------------------------------------- the schedule

@pytest.mark.parametrize("trial", range(12))   # ~1 s each: a compile per shape
def test_row_tiles_cover_every_row_once(trial, rng):
  """Each row is in exactly one slot, of its own group (or of the zero pseudo-group G),
  a slot at most block_m rows, for every alignment of the tiles; also for a device's
  share of a sharded call."""
  from jaxgemm import ragged_schedule as schedule
  m, groups = int(rng.integers(1, 300)), int(rng.integers(1, 9))
  block_m, batch = int(rng.choice([16, 64, 128])), int(rng.integers(1, 3))
  sizes = rng.integers(0, m, size=(batch, groups)) * (rng.random((batch, groups)) < 0.7)
  if trial % 3 == 0:
    sizes = rng.multinomial(m, np.ones(groups) / groups, size=batch)
  bounds = schedule.group_bounds(jnp.asarray(sizes, jnp.int32), m)
  if trial % 2:   # groups [g0, g0 + count) within rows [r0, r0 + m)
    g0 = int(rng.integers(0, groups))
    count, r0 = int(rng.integers(1, groups - g0 + 1)), int(rng.integers(0, m))
    wide = schedule.group_bounds(jnp.asarray(sizes, jnp.int32), m + r0 + 50)
    bounds, groups = schedule.local_bounds(wide, g0, count, r0, m), count
  align = int(rng.choice([1, 8, block_m]))
  table = np.asarray(schedule.row_tiles(bounds, m, block_m, align))
  assert table.shape == (batch, 3, schedule.num_slots(m, groups, block_m, align))
  for b in range(batch):
    want = np.full(m, groups)
    for g in range(groups):
      want[bounds[b, 0, g]:bounds[b, 1, g]] = g
    owner = np.full(m, -1)
    for group, start, end in table[b].T:
      if start < end:
        assert end - start <= block_m, (start, end)
        if align == block_m:   # a fixed grid of tiles: a slot stays within one
          assert (start // block_m) == (end - 1) // block_m, (start, end)
        assert (owner[start:end] == -1).all(), "a row in two slots"
        owner[start:end] = group
    np.testing.assert_array_equal(owner, want)
    for g in range(groups):   # a group of r rows runs ceil((r + its offset) / block_m) tiles
      start, end = int(bounds[b, 0, g]), int(bounds[b, 1, g])
      mine = table[b][:, (table[b, 0] == g) & (table[b, 1] < table[b, 2])]
      assert mine.shape[1] == (-(-(end - start + start % align) // block_m) if end > start else 0)


def test_row_tiles_ignore_empty_groups_padded_at_the_end():
  """A device's share of an unevenly sharded G ends with (0, 0) groups: the rows past the
  real groups are still the zero range's alone, and no row is in two slots."""
  from jaxgemm import ragged_schedule as schedule
  bounds = jnp.asarray([[[0, 5, 0], [5, 12, 0]]], jnp.int32)   # groups [0,5), [5,12), pad
  table = np.asarray(schedule.row_tiles(bounds, 16, 8))[0]
  owner = np.full(16, -1)
  for group, start, end in table.T:
    if start < end:
      assert (owner[start:end] == -1).all(), f"rows {start}:{end} in two slots"
      owner[start:end] = group
  np.testing.assert_array_equal(owner, [0] * 5 + [1] * 7 + [3] * 4)


# ----------------------------------------------------------------- auto

@pytest.mark.parametrize("kind,ragged_contracting,m,want", [
    ("NVIDIA H200", False, 16384, "triton"),     # forward and dgrad: Triton led
    ("NVIDIA H200", True, 16384, "pallas"),      # weight gradient: Pallas led
    ("NVIDIA H100 80GB HBM3", True, 16384, "pallas"),
    ("NVIDIA H200", False, 128, "xla"),          # decode: 1.00x, no claim
    ("NVIDIA A100-SXM4-80GB", False, 16384, "xla"),   # not measured there
])
def test_auto_takes_the_backend_measured_faster_per_mode(kind, ragged_contracting, m, want,
                                                         monkeypatch):
  """With no tuning record, `auto` follows the H200 moe run: Triton for ragged-M,
  Pallas for ragged-K, XLA below the measured sizes and off Hopper."""
  from jaxgemm import dispatch
  from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem
  monkeypatch.setattr(dispatch, "device_kind", lambda platform=None: kind)
  problem = RaggedDotProblem(1, 8, m, 4096, 14336, np.dtype(jnp.bfloat16),
                             np.dtype(jnp.bfloat16), np.dtype(np.float32),
                             ragged_contracting=ragged_contracting)
  assert dispatch.choose(problem, "auto").backend == want


def test_autotune_finds_and_stores_ragged_dot_problems(tmp_path):
  """The tuner works on any registered op: ragged_dot's forward and both backward forms
  are found, and a tuned record is stored under the op's name."""
  lhs, rhs = jnp.ones((48, 32), jnp.float16), jnp.ones((3, 32, 16), jnp.float16)
  sizes = jnp.asarray([10, 0, 30])
  fn = lambda l, r: jaxgemm.ragged_dot(l, r, sizes)
  modes = [p.mode + ("T" if p.trans_rhs else "") for p in jaxgemm.problems_in(fn, lhs, rhs)]
  assert modes == ["ragged-M", "ragged-K", "ragged-MT"]
  cache = tmp_path / "tuned.json"
  report = jaxgemm.autotune(fn, lhs, rhs, backends=["triton"], backward=False, iters=2,
                            cache_path=cache, time_budget_s=60, log=None)
  assert len(report.tuned) == 1 and '"ragged_dot|cpu|triton/grouped|' in cache.read_text()
