"""scaled_ragged_dot (the FP8 grouped GEMM) on every registered kernel.

References are float64 products of the dequantized operands, q * scale with the
scales expanded here by their block sizes (independently of the library), per
expert, over each expert's rows; rows in no group are zeros.

Tolerances (element-wise against |A| @ |B| of the dequantized operands, and
norm-wise, `gemm_testing.assert_gemm_close`): the output's one rounding
(OUT_STEP: the unit roundoff of out_dtype, relative to |ref| <= |A| @ |B|) plus the
accumulation's:

* the xla backend (XLA_ACC = 2**-14): the fp8 values widened to bf16 are exact and so
  are their products in fp32; recursive fp32 summation of K terms is off by at most
  K * 2**-24 of |A| @ |B| (rigorous, gamma_K), <= 2**-15 at the K <= 512 here, and
  the scales' two or three fp32 multiplies add 2**-22: 2**-14 bounds both;
* the kernels to come (ACC_TOL = 2**-10, scaled_matmul's): Hopper's FP8 tensor cores
  keep about 14 bits while accumulating, promoted to fp32 every 128 of K; the worst
  element read on an H100 by scaled_matmul's kernels was 7.4e-4 of |A| @ |B|
  (tests/test_scaled_matmul.py says where), so 2**-10 = 9.8e-4.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64, assert_gemm_close
from host_devices import run_on_8_host_devices
from jaxgemm import registry
from jaxgemm.ops.scaled_ragged_dot.api import RAGGED_K_NUMBERS as RAGGED_K

pytestmark = pytest.mark.op("scaled_ragged_dot")

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
E8M0 = np.dtype(jnp.float8_e8m0fnu)
BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
OUT_STEP = {BF16: 2.0**-8, F16: 2.0**-11, F32: 2.0**-24}
XLA_ACC, ACC_TOL = 2.0**-14, 2.0**-10
# quantize's block for each scale kind: lhs (M, K), and rhs (G, K, N) per expert.
LHS_BLOCK = {"tensor": None, "row_col": (1, None), "block": (1, 128)}
RHS_BLOCK = {"tensor": None, "row_col": (None, 1), "block": (128, 128)}
# An empty expert, experts of 1 to 7 rows, a large one, and rows past the sum (M = 40).
SIZES = (0, 3, 7, 1, 20)
M, K, N = 40, 300, 200   # none a multiple of 128: partial blocks along K and N


def tolerance(kernel, out_dtype) -> float:
  return OUT_STEP[np.dtype(out_dtype)] + (XLA_ACC if kernel.is_xla else ACC_TOL)


def expand(scale, shape, block):
  """The float64 scale of every element of an array of `shape` quantized with `block`
  (over its last two dimensions; a per-tensor scale is one for all)."""
  s = as_f64(scale)
  if block is None:
    return np.broadcast_to(s, shape)
  for axis, b in ((-2, block[0]), (-1, block[1])):
    size = shape[axis]
    s = np.take(np.repeat(s, size if b is None else b, axis=axis), np.arange(size), axis=axis)
  return np.broadcast_to(s, shape)


def operand(rng, shape, dtype, block, scale_dtype=F32):
  """(q, scale, dequantized float64): random data with rows and columns of different
  magnitudes (so the scales differ), quantized with `block`."""
  x = rng.standard_normal(shape)
  x = x * np.exp2(rng.integers(-3, 4, size=shape[:-1] + (1,)))
  x = x * np.exp2(rng.integers(-3, 4, size=shape[:-2] + (1, shape[-1])))
  q, s = jaxgemm.quantize(jnp.asarray(x, jnp.float32), dtype, block, scale_dtype=scale_dtype)
  return q, s, as_f64(q) * expand(s, q.shape, block)


def reference(a64, w64, sizes):
  """(out, |a| @ |w|) in float64: each expert's rows times its matrix, as lax.ragged_dot
  (sizes clamped to M), the other rows zero."""
  m = a64.shape[0]
  ends = np.minimum(np.cumsum(np.maximum(np.asarray(sizes), 0)), m)
  starts = np.concatenate([[0], ends[:-1]])
  out, bound = np.zeros((m, w64.shape[-1])), np.zeros((m, w64.shape[-1]))
  for g, (s, e) in enumerate(zip(starts, ends)):
    out[s:e], bound[s:e] = a64[s:e] @ w64[g], np.abs(a64[s:e]) @ np.abs(w64[g])
  return out, bound


def case_operands(rng, lhs_kind, rhs_kind, lhs_dtype=E4M3, rhs_dtype=E4M3, *, m=M, k=K, n=N,
                  groups=len(SIZES), scale_dtype=F32):
  x, sx, x64 = operand(rng, (m, k), lhs_dtype, LHS_BLOCK[lhs_kind], scale_dtype)
  w, sw, w64 = operand(rng, (groups, k, n), rhs_dtype, RHS_BLOCK[rhs_kind], scale_dtype)
  return (x, w, sx, sw), (x64, w64)


def check(out, ref, bound, out_dtype, kernel, what=""):
  assert out.dtype == out_dtype, (out.dtype, out_dtype)
  if not np.any(ref):   # every expert empty: exact zeros (no norm to be relative to)
    assert not np.any(as_f64(out)), what
    return
  assert_gemm_close(out, ref, bound, tolerance(kernel, out_dtype), what)


# ---------------------------------------------------------------- scale kinds and dtypes

KIND_PAIRS = [("tensor", "tensor"), ("row_col", "row_col"), ("block", "block"),
              ("tensor", "row_col"), ("row_col", "tensor"), ("tensor", "block"),
              ("block", "tensor"), ("row_col", "block")]
DTYPE_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]
CASES = (
    # each kind pairing, the fp8 pairings in turn
    [(ka, kb, *DTYPE_PAIRS[i % 3], BF16) for i, (ka, kb) in enumerate(KIND_PAIRS)]
    # a float32 result (the kind pairings above rotate the fp8 pairings already)
    + [("block", "block", E4M3, E5M2, F32)])


@pytest.mark.cases([pytest.param(c, id=f"{c[0]}-{c[1]}-{c[2].name}-{c[3].name}-{c[4].name}")
                    for c in CASES])
def test_scale_kinds_dtypes_and_out_dtypes(kernel, case, rng):
  """Every scale kind (and the valid mixes), fp8 pairing and out dtype, on M, K, N that
  are no multiples of 128, with an empty expert, experts of 1-7 rows and rows past the
  sum of the sizes."""
  ka, kb, da, db, out_dtype = case
  (x, w, sx, sw), (x64, w64) = case_operands(rng, ka, kb, da, db)
  out = jaxgemm.scaled_ragged_dot(x, w, jnp.array(SIZES), sx, sw, out_dtype=out_dtype,
                                  **kernel.kw)
  check(out, *reference(x64, w64, SIZES), out_dtype, kernel, str(case))
  assert not np.any(as_f64(out)[sum(SIZES):]), "rows past the sum of the sizes"


def test_power_of_two_scales(kernel, rng):
  """float8_e8m0fnu scales (quantize's scale_dtype), block kind."""
  (x, w, sx, sw), (x64, w64) = case_operands(rng, "block", "block", scale_dtype=E8M0)
  assert sx.dtype == sw.dtype == E8M0
  out = jaxgemm.scaled_ragged_dot(x, w, jnp.array(SIZES), sx, sw, out_dtype=F32, **kernel.kw)
  check(out, *reference(x64, w64, SIZES), F32, kernel)


def test_quantize_blocks_a_stack_of_experts_per_expert(rng):
  """quantize of a 3-D (G, K, N) array blocks its last two dimensions: G is a batch
  dimension, so each expert has its own 128x128 blocks, per-column scales, or (block
  None) one scale for the whole stack, the shapes scaled_ragged_dot takes."""
  w = jnp.asarray(rng.standard_normal((3, 300, 200)), jnp.float32).at[1].multiply(100.0)
  q, s = jaxgemm.quantize(w, block=(128, 128))
  assert s.shape == (3, 3, 2)
  assert float(s[1].min()) > 10 * float(s[0].max())   # expert 1's blocks alone are large
  assert jaxgemm.quantize(w, block=(None, 1))[1].shape == (3, 1, 200)
  assert jaxgemm.quantize(w)[1].shape == ()


# ---------------------------------------------------------------- routing, jit, vmap

ROUTINGS = [
    pytest.param((0, 0, 0, 0, 40), id="all-in-the-last"),
    pytest.param((1, 2, 3, 4, 5), id="1-5-rows"),
    pytest.param((7, 6, 0, 0, 1), id="sum-below-M"),
    pytest.param((30, 30, 5, 0, 0), id="sum-past-M"),   # clamped to M, as lax's
    pytest.param((0, 0, 0, 0, 0), id="all-empty"),
]


@pytest.mark.parametrize("kind", ["tensor", "block"])
def test_routings_under_jit_without_recompiling(kernel, kind, rng):
  """group_sizes is a device array: one compile serves every routing (empty experts,
  experts of a few rows, sizes past M clamped as lax.ragged_dot clamps them)."""
  (x, w, sx, sw), (x64, w64) = case_operands(rng, kind, kind)
  traces = []

  @jax.jit
  def fn(x, w, sizes, sx, sw):
    traces.append(1)
    return jaxgemm.scaled_ragged_dot(x, w, sizes, sx, sw, out_dtype=F32, **kernel.kw)

  for routing in ROUTINGS:
    sizes = routing.values[0]
    out = fn(x, w, jnp.asarray(sizes, jnp.int32), sx, sw)
    check(out, *reference(x64, w64, sizes), F32, kernel, routing.id)
  assert len(traces) == 1


@pytest.mark.parametrize("kind, mapped", [
    pytest.param("block", "all", id="block-all-mapped"),
    pytest.param("tensor", "all", id="tensor-scales-mapped"),
])
def test_vmap_over_a_leading_batch(kernel, kind, mapped, rng):
  """vmap folds the batch into the primitive's B: each entry its own routing; the
  experts (and their scales) shared or per entry; mapped per-tensor scales differ per
  entry (the rule turns them into per-row/column scales)."""
  batch, m, k, n = 3, 24, 200, 136
  sizes = np.array([[0, 5, 7, 2], [10, 0, 1, 13], [3, 3, 3, 3]], np.int32)
  xs = [operand(rng, (m, k), E4M3, LHS_BLOCK[kind]) for _ in range(batch)]
  per_entry = mapped == "all"
  ws = [operand(rng, (4, k, n), E5M2, RHS_BLOCK[kind]) for _ in range(batch if per_entry else 1)]
  stack = lambda parts, i: jnp.stack([p[i] for p in parts])
  x, sx = stack(xs, 0), stack(xs, 1)
  w, sw = (stack(ws, 0), stack(ws, 1)) if per_entry else ws[0][:2]
  if kind == "tensor" and not per_entry:
    sx = xs[0][1]   # one scale shared by the whole batch
  in_axes = (0, 0 if per_entry else None, 0, 0 if sx.ndim else None, 0 if per_entry else None)
  fn = jax.vmap(lambda *a: jaxgemm.scaled_ragged_dot(*a, out_dtype=F32, **kernel.kw), in_axes)
  out = jax.jit(fn)(x, w, jnp.asarray(sizes), sx, sw)
  assert out.shape == (batch, m, n)
  for i in range(batch):
    x64 = as_f64(x[i]) * expand(sx[i] if sx.ndim else sx, (m, k), LHS_BLOCK[kind])
    wi, swi = (w[i], sw[i]) if per_entry else (w, sw)
    w64 = as_f64(wi) * expand(swi, wi.shape, RHS_BLOCK[kind])
    check(out[i], *reference(x64, w64, sizes[i]), F32, kernel, f"entry {i}")


# ---------------------------------------------------------------- no derivative


def test_grad_raises_naming_the_training_path(rng):
  (x, w, sx, sw), _ = case_operands(rng, "block", "block", k=128, n=128)
  sizes = jnp.array(SIZES)
  loss = lambda sx: jaxgemm.scaled_ragged_dot(x, w, sizes, sx, sw, out_dtype=F32).sum()
  planned = r"`jaxgemm.ragged_dot\(x, w, group_sizes, fp8="
  with pytest.raises(NotImplementedError, match=planned):
    jax.grad(loss)(sx)
  with pytest.raises(NotImplementedError, match="has no derivative"):
    jax.jvp(lambda x: jaxgemm.scaled_ragged_dot(x, w, sizes, sx, sw), (x,), (x,))
  # A call whose operands are constants of the differentiated function is fine.
  grad = jax.grad(lambda s: loss(jax.lax.stop_gradient(sx)) * s)(2.0)
  assert np.isfinite(grad)


# ---------------------------------------------------------------- bad inputs


def _bad_calls():
  rng = np.random.default_rng(0)
  (x, w, sx, sw), _ = case_operands(rng, "block", "block", m=8, k=256, n=128, groups=2)
  _, _, sx_row, sw_col = case_operands(rng, "row_col", "row_col", m=8, k=256, n=128,
                                       groups=2)[0]
  sizes = jnp.array([3, 4], jnp.int32)
  call = lambda *a, **kw: jaxgemm.scaled_ragged_dot(*a, **kw)
  return [
      ("lhs-bf16", lambda: call(x.astype(jnp.bfloat16), w, sizes, sx, sw),
       TypeError, r"lhs must be fp8.*float8_e4m3fn.*lhs.dtype=bfloat16"),
      ("rhs-f32", lambda: call(x, w.astype(jnp.float32), sizes, sx, sw),
       TypeError, r"rhs must be fp8.*rhs.dtype=float32"),
      ("lhs-3d", lambda: call(x[None], w, sizes, sx, sw), TypeError, r"lhs must be 2-D"),
      ("rhs-2d", lambda: call(x, w[0], sizes, sx, sw), TypeError, r"rhs must be 3-D \(G, K, N\)"),
      ("k-differs", lambda: call(x[:, :128], w, sizes, sx[:, :1], sw), TypeError,
       r"contracting dimensions differ.*K=128.*K=256"),
      ("sizes-float", lambda: call(x, w, sizes.astype(jnp.float32), sx, sw), TypeError,
       r"group_sizes must have an integer dtype.*float32"),
      ("sizes-shape", lambda: call(x, w, jnp.array([1, 2, 3]), sx, sw), TypeError,
       r"group_sizes.shape=\(3,\) must be \(2,\)"),
      ("sizes-2d", lambda: call(x, w, sizes[None], sx, sw), TypeError,
       r"group_sizes.shape=\(1, 2\) must be \(2,\)"),
      ("out-int8", lambda: call(x, w, sizes, sx, sw, out_dtype=jnp.int8), TypeError,
       r"out_dtype must be one of \['bfloat16', 'float16', 'float32'\].*int8"),
      ("out-bogus", lambda: call(x, w, sizes, sx, sw, out_dtype="bogus"), TypeError,
       r"out_dtype must be one of"),
      ("lhs-scale-shape", lambda: call(x, w, sizes, sx[:, :1].T, sw), ValueError,
       r"lhs_scale has shape \(1, 8\); valid: \(\) per tensor; \(8, 1\) per row.*"
       r"\(8, 2\) 1x128 blocks"),
      ("rhs-scale-shape", lambda: call(x, w, sizes, sx, sw[0]), ValueError,
       r"rhs_scale has shape \(2, 1\); valid: \(\) per tensor; \(2, 1, 128\) per column.*"
       r"\(2, 2, 1\) 128x128 blocks"),
      ("rhs-scale-unbatched-blocks", lambda: call(x, w, sizes, sx, sw[:1]), ValueError,
       r"rhs_scale has shape \(1, 2, 1\)"),
      ("scale-dtype", lambda: call(x, w, sizes, sx.astype(jnp.bfloat16), sw), TypeError,
       r"lhs_scale must be one of \['float32', 'float8_e8m0fnu'\].*bfloat16"),
      ("column-with-blocks", lambda: call(x, w, sizes, sx, sw_col), ValueError,
       r"rhs_scale is per column.*lhs_scale has 1x128 blocks.*Valid with block lhs scales: rhs_scale \(\) or \(2, 2, 1\)"),
      ("backend", lambda: call(x, w, sizes, sx, sw, backend="bogus"), ValueError,
       r"bogus"),
  ]


@pytest.mark.parametrize("bad", [pytest.param(b, id=b[0]) for b in _bad_calls()])
def test_bad_inputs_name_the_argument(bad):
  _, call, error, match = bad
  with pytest.raises(error, match=match):
    call()


# ---------------------------------------------------------------- the ragged-K form
#
# The weight gradient, out[g] = A[rows g]^T @ B[rows g] with A (M, K), B (M, N): the
# contraction is the tokens, scaled per tensor or in blocks of 128 tokens ((128, 1) or
# (128, 128), quantize's), on the global 128-row grid. The same tolerances: the xla
# backend's fp32 sums run over the group's rows, at most M <= 512 here (so the
# gamma_M bound of XLA_ACC holds as for K above), promoted per 128-row block with the
# scales' two fp32 multiplies; the kernel's partial sums are fp32 as well.

# Groups across the 128-row blocks (rows 100-136 and 138-257 each straddle a block
# edge; rows 128-136 share a block with rows 100-127 of the same group and with group
# 3's one row), empty groups first, in the middle and last, and rows 258-299 in none.
RAGGED_K_SIZES = (0, 100, 37, 1, 0, 120, 0)
RK_M, RK_K, RK_N = 300, 136, 72   # K and N not multiples of 128 or of the tiles
RK_BLOCKS = {"tensor": None, "128x1": (128, 1), "128x128": (128, 128)}


def ragged_k_reference(a64, b64, sizes):
  """(out, |a|^T @ |b|) in float64, (G, K, N): each group's rows (sizes clamped to M)."""
  m = a64.shape[0]
  ends = np.minimum(np.cumsum(np.maximum(np.asarray(sizes), 0)), m)
  starts = np.concatenate([[0], ends[:-1]])
  shape = (len(sizes), a64.shape[1], b64.shape[1])
  out, bound = np.zeros(shape), np.zeros(shape)
  for g, (s, e) in enumerate(zip(starts, ends)):
    out[g], bound[g] = a64[s:e].T @ b64[s:e], np.abs(a64[s:e]).T @ np.abs(b64[s:e])
  return out, bound


def ragged_k_operands(rng, lhs_kind, rhs_kind, lhs_dtype=E4M3, rhs_dtype=E5M2, *, m=RK_M,
                      k=RK_K, n=RK_N, scale_dtype=F32):
  a, sa, a64 = operand(rng, (m, k), lhs_dtype, RK_BLOCKS[lhs_kind], scale_dtype)
  b, sb, b64 = operand(rng, (m, n), rhs_dtype, RK_BLOCKS[rhs_kind], scale_dtype)
  return (a, b, sa, sb), (a64, b64)


def ragged_k(a, b, sizes, sa, sb, **kw):
  return jaxgemm.scaled_ragged_dot(a, b, sizes, sa, sb, ragged_dot_dimension_numbers=RAGGED_K,
                                   **kw)

RK_CASES = [("128x1", "128x1", E4M3, E5M2, BF16), ("128x1", "128x128", E5M2, E4M3, BF16),
            ("128x128", "128x1", E4M3, E4M3, F16), ("128x128", "128x128", E4M3, E5M2, F32),
            ("tensor", "tensor", E4M3, E5M2, BF16), ("tensor", "128x1", E5M2, E5M2, F32),
            ("128x1", "tensor", E4M3, E4M3, BF16)]


@pytest.mark.cases([pytest.param(c, id=f"{c[0]}-{c[1]}-{c[2].name}-{c[3].name}-{c[4].name}")
                    for c in RK_CASES])
def test_ragged_k_scale_kinds_dtypes_and_out_dtypes(kernel, case, rng):
  """The ragged-K form against float64 of the dequantized operands: per-tensor and 128-token
  block scales (128x1 and 128x128, mixed), e4m3 x e5m2 pairings, each out dtype; groups
  straddling 128-row blocks, empty groups, rows in no group."""
  ka, kb, da, db, out_dtype = case
  (a, b, sa, sb), (a64, b64) = ragged_k_operands(rng, ka, kb, da, db)
  out = ragged_k(a, b, jnp.array(RAGGED_K_SIZES), sa, sb, out_dtype=out_dtype, **kernel.kw)
  assert out.shape == (len(RAGGED_K_SIZES), RK_K, RK_N)
  ref, bound = ragged_k_reference(a64, b64, RAGGED_K_SIZES)
  check(out, ref, bound, out_dtype, kernel, str(case))
  empty = np.array(RAGGED_K_SIZES) == 0
  assert not np.any(as_f64(out)[empty]), "an empty group's result is zeros"


def test_ragged_k_power_of_two_scales(kernel, rng):
  (a, b, sa, sb), (a64, b64) = ragged_k_operands(rng, "128x1", "128x128", scale_dtype=E8M0)
  assert sa.dtype == sb.dtype == E8M0
  out = ragged_k(a, b, jnp.array(RAGGED_K_SIZES), sa, sb, out_dtype=F32, **kernel.kw)
  check(out, *ragged_k_reference(a64, b64, RAGGED_K_SIZES), F32, kernel)


RK_ROUTINGS = [
    pytest.param((0, 0, 0, 0, 0, 0, 300), id="all-in-the-last"),
    pytest.param((127, 2, 127, 2, 1, 40, 1), id="each-block-edge"),
    pytest.param((5, 0, 0, 0, 0, 0, 0), id="sum-far-below-M"),
    pytest.param((200, 200, 5, 0, 0, 0, 0), id="sum-past-M"),   # clamped to M, as lax's
    pytest.param((0,) * 7, id="all-empty"),
]


@pytest.mark.parametrize("kind", ["tensor", "128x1"])
def test_ragged_k_routings_under_jit_without_recompiling(kernel, kind, rng):
  (a, b, sa, sb), (a64, b64) = ragged_k_operands(rng, kind, kind)
  traces = []

  @jax.jit
  def fn(a, b, sizes, sa, sb):
    traces.append(1)
    return ragged_k(a, b, sizes, sa, sb, out_dtype=F32, **kernel.kw)

  for routing in RK_ROUTINGS:
    sizes = routing.values[0]
    out = fn(a, b, jnp.asarray(sizes, jnp.int32), sa, sb)
    check(out, *ragged_k_reference(a64, b64, sizes), F32, kernel, routing.id)
  assert len(traces) == 1


@pytest.mark.parametrize("kind", ["128x1", "tensor"])
def test_ragged_k_vmap_over_a_leading_batch(kernel, kind, rng):
  """vmap folds the batch into the primitive's B, each entry its own routing and scales
  (mapped per-tensor scales become 128-token blocks in the rule)."""
  batch, m, k, n = 3, 160, 40, 24
  sizes = np.array([[0, 100, 50], [130, 0, 1], [3, 3, 3]], np.int32)
  parts = [ragged_k_operands(rng, kind, kind, m=m, k=k, n=n) for _ in range(batch)]
  stack = lambda i: jnp.stack([p[0][i] for p in parts])
  fn = jax.vmap(lambda *x: ragged_k(*x, out_dtype=F32, **kernel.kw))
  out = jax.jit(fn)(stack(0), stack(1), jnp.asarray(sizes), stack(2), stack(3))
  assert out.shape == (batch, 3, k, n)
  for i in range(batch):
    check(out[i], *ragged_k_reference(*parts[i][1], sizes[i]), F32, kernel, f"entry {i}")


def _ragged_k_bad_calls():
  rng = np.random.default_rng(0)
  (a, b, sa, sb), _ = ragged_k_operands(rng, "128x1", "128x128", m=200, k=136, n=72)
  sizes = jnp.array([100, 50], jnp.int32)
  numbers = jax.lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [])
  return [
      ("numbers", lambda: jaxgemm.scaled_ragged_dot(a, b, sizes, sa, sb,
                                                   ragged_dot_dimension_numbers=numbers),
       ValueError, r"ragged_dot_dimension_numbers=.* is not one of its forms.*RAGGED_K_NUMBERS"),
      ("numbers-tuple", lambda: jaxgemm.scaled_ragged_dot(
          a, b, sizes, sa, sb, ragged_dot_dimension_numbers=((([0], [0]), ([], [])), [0], [])),
       TypeError, r"ragged_dot_dimension_numbers must be None or a "
                  r"lax.RaggedDotDimensionNumbers.*got tuple"),
      ("lhs-bf16", lambda: ragged_k(a.astype(jnp.bfloat16), b, sizes, sa, sb), TypeError,
       r"lhs must be fp8.*lhs.dtype=bfloat16"),
      ("rhs-3d", lambda: ragged_k(a, b[None], sizes, sa, sb), TypeError,
       r"rhs must be 2-D \(M, N\) in the ragged-K form"),
      ("m-differs", lambda: ragged_k(a, b[:128], sizes, sa, sb[:1]), TypeError,
       r"contracting dimensions differ \(ragged-K\).*M=200.*M=128"),
      ("sizes-float", lambda: ragged_k(a, b, sizes.astype(jnp.float32), sa, sb), TypeError,
       r"group_sizes must have an integer dtype.*float32"),
      ("sizes-2d", lambda: ragged_k(a, b, sizes[None], sa, sb), TypeError,
       r"group_sizes.shape=\(1, 2\) must be \(G,\)"),
      ("out-int8", lambda: ragged_k(a, b, sizes, sa, sb, out_dtype=jnp.int8), TypeError,
       r"out_dtype must be one of"),
      ("lhs-scale-per-token", lambda: ragged_k(a, b, sizes, jnp.ones((200, 1)), sb),
       ValueError, r"lhs_scale has shape \(200, 1\); valid: \(\) per tensor; \(2, 136\) "
                   r"128x1 blocks.*\(2, 2\) 128x128 blocks"),
      ("rhs-scale-shape", lambda: ragged_k(a, b, sizes, sa, sb.T), ValueError,
       r"rhs_scale has shape \(1, 2\); valid: \(\) per tensor; \(2, 72\) 128x1.*"
       r"\(2, 1\) 128x128"),
      ("scale-dtype", lambda: ragged_k(a, b, sizes, sa.astype(jnp.bfloat16), sb), TypeError,
       r"lhs_scale must be one of \['float32', 'float8_e8m0fnu'\].*bfloat16"),
  ]


@pytest.mark.parametrize("bad", [pytest.param(b, id=b[0]) for b in _ragged_k_bad_calls()])
def test_ragged_k_bad_inputs_name_the_argument(bad):
  _, call, error, match = bad
  with pytest.raises(error, match=match):
    call()


def test_ragged_k_problem_is_found_in_a_program(rng):
  (a, b, sa, sb), _ = ragged_k_operands(rng, "128x1", "128x128")
  found = jaxgemm.problems_in(lambda *x: ragged_k(*x), a, b, jnp.array(RAGGED_K_SIZES), sa, sb)
  assert [(p.op, p.mode, p.scale_kind, p.groups, p.m, p.k, p.n) for p in found] == [
      ("scaled_ragged_dot", "ragged-K", "block", 7, RK_M, RK_K, RK_N)]
  problem = found[0]
  assert problem.out_shape == (1, 7, RK_K, RK_N)
  assert (problem.lhs_scale_shape, problem.rhs_scale_shape) == ((1, 3, RK_K), (1, 3, RK_N))
  op = registry.get_op("scaled_ragged_dot")
  operands = op.example_operands(problem, jax.random.key(0))
  out = op.call(problem, *operands, backend="xla", variant=None, config=None)
  assert out.shape == problem.out_shape and np.all(np.isfinite(as_f64(out)))


# ---------------------------------------------------------------- the op's record


def test_the_op_is_registered_and_found_in_a_program(rng):
  assert "scaled_ragged_dot" in registry.ops()
  assert jaxgemm.backends("scaled_ragged_dot")[0] == "xla"
  (x, w, sx, sw), _ = case_operands(rng, "block", "block")
  found = jaxgemm.problems_in(
      lambda *a: jaxgemm.scaled_ragged_dot(*a), x, w, jnp.array(SIZES), sx, sw)
  assert [(p.op, p.scale_kind, p.groups, p.m, p.k, p.n) for p in found] == [
      ("scaled_ragged_dot", "block", 5, M, K, N)]
  op = registry.get_op("scaled_ragged_dot")
  operands = op.example_operands(found[0], jax.random.key(0))
  out = op.call(found[0], *operands, backend="xla", variant=None, config=None)
  assert out.shape == found[0].out_shape and np.all(np.isfinite(as_f64(out)))


# ---------------------------------------------------------------- 8 devices

EIGHT_DEVICE_TESTS = pathlib.Path(__file__).with_name("scaled_ragged_dot_on_8_devices.py")


def test_partitions_on_8_host_devices():
  """tests/scaled_ragged_dot_on_8_devices.py, in its own process with 8 host CPU devices
  (XLA_FLAGS is read once, when jax starts), as tests/test_sharding.py runs its files."""
  run_on_8_host_devices(EIGHT_DEVICE_TESTS, timeout_s=300)
