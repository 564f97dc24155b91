"""Every variant on the GPU, on moderately sized ragged and aligned problems.

Marked `gpu`: skipped cleanly (see conftest.py) where jax.devices()[0] is not
a GPU. Run them with `pytest -m gpu tests/` on a machine with one. Results are
compared with a float64 NumPy reference; no timing is asserted here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm
from gemm_testing import (as_f64, assert_gemm_close, kernel_supports, random_array,
                          tolerance, dot_general_reference)

pytestmark = [pytest.mark.gpu, pytest.mark.op("matmul")]

F32, BF16, F16 = np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16)
HIGHEST = lax.Precision.HIGHEST

# (lhs shape, rhs shape, dimension numbers, dtype, precision)
NN = (((1,), (0,)), ((), ()))
PROBLEMS = [
    pytest.param(((1000, 1000), (1000, 1000), NN, BF16, None), id="1000^3-bf16"),
    pytest.param(((1000, 1000), (1000, 1000), NN, F32, None), id="1000^3-f32-tf32"),
    pytest.param(((1000, 1000), (1000, 1000), NN, F32, HIGHEST), id="1000^3-f32-highest"),
    pytest.param(((4096, 512), (512, 4096), NN, BF16, None), id="4096x512x4096-bf16"),
    pytest.param(((2048, 1024), (1024, 2048), NN, F16, None), id="2048x1024x2048-f16"),
    pytest.param(((4095, 333), (333, 517), NN, BF16, None), id="ragged-4095x333x517-bf16"),
    pytest.param(((4, 520, 1000), (4, 776, 520), (((1,), (2,)), ((0,), (0,))), BF16, None),
                 id="batched-TT-4x1000x520x776-bf16"),
    pytest.param(((1024, 1000), (1024, 768), (((0,), (0,)), ((), ())), BF16, None),
                 id="TN-1000x1024x768-bf16"),
    # An output of one tile, and one of three tiles across N: a 2-CTA cluster
    # then has a CTA without a tile (B^T wholly out of its box went wrong once).
    pytest.param(((33, 40), (24, 40), (((1,), (1,)), ((), ())), BF16, None),
                 id="NT-one-tile-33x40x24-bf16"),
    pytest.param(((200, 300), (260, 200), (((0,), (1,)), ((), ())), F16, None),
                 id="TT-odd-tiles-300x200x260-f16"),
]


@functools.lru_cache(maxsize=None)
def _problem_data(lhs_shape, rhs_shape, dims, dtype):
  """Inputs and float64 reference of a problem, shared by all variants."""
  rng = np.random.default_rng(abs(hash((lhs_shape, rhs_shape, dims, str(dtype)))) % 2**32)
  lhs = random_array(rng, lhs_shape, dtype)
  rhs = random_array(rng, rhs_shape, dtype)
  ref, bound = dot_general_reference(lhs, rhs, dims)
  return lhs, rhs, ref, bound


@pytest.mark.cases(PROBLEMS)
def test_gpu_forward(kernel, case):
  lhs_shape, rhs_shape, dims, dtype, precision = case
  fn = lambda l, r, **kw: jaxgemm.dot_general(l, r, dims, **kw)
  reason = kernel_supports(kernel, jax.ShapeDtypeStruct(lhs_shape, dtype),
                           jax.ShapeDtypeStruct(rhs_shape, dtype), fn=fn, precision=precision)
  if reason is not None:
    pytest.skip(f"{kernel}: {reason}")
  lhs, rhs, ref, bound = _problem_data(lhs_shape, rhs_shape, dims, dtype)
  f = jax.jit(lambda l, r: fn(l, r, precision=precision, **kernel.kw))
  out = f(lhs, rhs)
  assert out.dtype == dtype and out.shape == ref.shape
  assert_gemm_close(out, ref, bound, tolerance(dtype, dtype, precision), f"{kernel} on GPU")


def _random_property_cases():
  """Random problems as the `random` suite draws them (its generator, other seeds):
  six of any size up to 4096 and three large ones (sizes in [2048, 4096]), with
  their dtype and transposes. Sizes are capped so the float64 reference
  stays a few seconds."""
  from jaxgemm.bench.problems import DTYPES, random_problems  # noqa: PLC0415
  drawn = (random_problems("gpu-any", 4242, 6, max_size=4096)
           + random_problems("gpu-large", 4243, 3, max_size=4096, min_size=2048))
  cases = []
  for bp in drawn:
    dtype = np.dtype(DTYPES[bp.dtype][0] if bp.dtype != "bf16" else jnp.bfloat16)
    dims = bp.dimension_numbers()
    cases.append(pytest.param((bp.a_shape(), bp.b_shape(), dims, dtype, None),
                              id=f"{bp.suite}-{bp.name}"))
  return cases


@pytest.mark.cases(_random_property_cases())
def test_gpu_random_problems(kernel, case):
  """Every backend and variant on problems no one picked, large ones included:
  each config the library chooses for them must compile, fit and be right."""
  test_gpu_forward(kernel, case)


@pytest.mark.parametrize("dtype,precision", [(BF16, None), (F32, None), (F32, HIGHEST)],
                         ids=["bf16", "f32", "f32-highest"])
def test_gpu_gradients(kernel, dtype, precision):
  """vjp of a ragged 1000x777x520 product against float64."""
  m, k, n = 1000, 520, 776
  a_s, b_s = jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype)
  reason = kernel_supports(kernel, a_s, b_s, precision=precision)
  if reason is not None:
    pytest.skip(f"{kernel}: {reason}")
  rng = np.random.default_rng(7)
  a = random_array(rng, (m, k), dtype)
  b = random_array(rng, (k, n), dtype)
  ct = random_array(rng, (m, n), dtype)
  f = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  da, db = jax.jit(lambda a, b, ct: jax.vjp(f, a, b)[1](ct))(a, b, ct)
  a64, b64, ct64 = as_f64(a), as_f64(b), as_f64(ct)
  tol = tolerance(dtype, dtype, precision)
  assert_gemm_close(da, ct64 @ b64.T, np.abs(ct64) @ np.abs(b64).T, tol, f"{kernel} da")
  assert_gemm_close(db, a64.T @ ct64, np.abs(a64).T @ np.abs(ct64), tol, f"{kernel} db")
  # ... and the gradient graph holds only matmul_p GEMMs for kernel backends.
  if not kernel.is_xla:
    hlo = jax.jit(jax.grad(lambda a, b: f(a, b).astype(jnp.float32).sum(), (0, 1))).lower(
        a, b).as_text()
    assert "dot_general" not in hlo


def test_gpu_auto_is_jnp_matmul():
  a = jnp.asarray(np.random.default_rng(0).standard_normal((1000, 777)), jnp.bfloat16)
  b = jnp.asarray(np.random.default_rng(1).standard_normal((777, 520)), jnp.bfloat16)
  np.testing.assert_allclose(np.asarray(jaxgemm.matmul(a, b), np.float32),
                             np.asarray(jnp.matmul(a, b), np.float32), rtol=1e-2, atol=1e-1)


def _auto_picks_in_the_shipped_table(max_flops=8e9):
  """(problem, choice) for the table's problems where backend='auto' runs a kernel."""
  from jaxgemm import dispatch, tuning_cache  # noqa: PLC0415
  kind = dispatch.device_kind()
  entries = tuning_cache.load(tuning_cache.table_path(kind))
  out = {}
  for key, shapes in entries.items():
    op, device, _, _, rest = tuning_cache.parse_key(key)
    dtypes, _, trans, _ = rest.split("|")
    if op != "matmul" or device != kind or dtypes != "bfloat16->bfloat16":
      continue
    for shape in shapes:
      batch, m, n, k = map(int, shape.split("x"))
      if 2 * batch * m * n * k > max_flops:
        continue
      p = jaxgemm.GemmProblem(batch, m, n, k, BF16, BF16, F32, trans[0] == "T", trans[1] == "T")
      choice = dispatch.choose(p, "auto")
      if choice.backend != "xla":
        out[p] = choice
  return out


def test_auto_runs_the_shipped_tables_picks_correctly(rng):
  """On a device with a shipped table, auto's kernel picks give right answers."""
  picks = _auto_picks_in_the_shipped_table()
  if not picks:
    pytest.skip(f"no shipped table with kernel picks for {jax.devices()[0].device_kind}")
  for p, choice in picks.items():
    a = random_array(rng, p.a_shape, BF16)
    b = random_array(rng, p.b_shape, BF16)
    dims = (((1 if p.trans_a else 2,), (2 if p.trans_b else 1,)), ((0,), (0,)))
    out = jax.jit(lambda a, b: jaxgemm.dot_general(a, b, dims))(a, b)
    ref, bound = dot_general_reference(a, b, dims)
    assert_gemm_close(out, ref, bound, tolerance(BF16),
                      f"auto -> {choice.describe()} on {p.describe()}")
