"""The xla backend's second program of scaled_matmul, "dequantize_bf16" (issue 44):
the operands dequantized to bfloat16 and XLA's bf16 dot, fp32 accumulation.

Against float64 (test_scaled_matmul.py's operands and references: scales expanded
here, independently of the library), for every scale kind, out dtype, layout and
transformation. Two references, so each error is accounted for:

* the exact product of the dequantized operands. Where the program widens exactly
  (per-tensor and per-row/column scales, whose factors multiply the fp32
  accumulator; power-of-two block scales) it is within the output's one rounding
  (OUT_STEP: each element off by at most half a step, so the norm too) plus fp32
  accumulation (ACC, 2**-17 as in test_accumulation_stays_at_fp32_level), as
  "dot_general" is. With float32 block scales the dequantized operands are
  rounded to bf16 first, a real extra error (jaxgemm/ops/scaled_matmul/xla.py):
  each element off by up to u = 2**-8 of itself, so each result element by up to
  2u * (|A| @ |B|) (rigorous, ELEMENT_ROUNDING). Norm-wise that rounding reads
  about sqrt(2/3) * u * 0.74 = 2.3e-3 for random data, but only on average: with
  rows and columns 8x apart a few of them carry the norm, and a small product read
  3.53e-3 (fresh-clone CI at 239c07b, seed 2180507). So where the operands round,
  the norm-wise bound is the rigorous one, the norm of the element-wise bounds; the
  tight check below, against the rounded operands' product, pins the program's
  numbers: a wrong block scale (~15% off) or a block dropped is far above it;
* the product of those bf16-rounded operands in float64: the program is that,
  to fp32 accumulation and the output's rounding, in every case.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64
from jaxgemm import dispatch, registry, tuning_cache
from jaxgemm.ops.matmul.xla import XlaConfig
from jaxgemm.ops.scaled_matmul import xla
from jaxgemm.ops.scaled_matmul.quantize import pow2_ceil
from test_scaled_matmul import (A_BLOCK, B_BLOCK, BF16, E4M3, E5M2, F16, F32, OUT_STEP,
                                dequantized, operands, reference)

VARIANT = "dequantize_bf16"
KW = dict(backend="xla", variant=VARIANT)
E8M0 = np.dtype(jnp.float8_e8m0fnu)
ACC = 2.0**-17                       # fp32 accumulation, relative (module docstring)
U = 2.0**-8                          # bf16's unit roundoff
ELEMENT_ROUNDING = 2 * U             # per result element, of |A| @ |B| (rigorous)


def bf16_rounded(x64: np.ndarray) -> np.ndarray:
  """x (float64, a product of an fp8 value and a float32 scale: exact) as the program
  rounds it: to float32, then to bfloat16."""
  return as_f64(jnp.asarray(x64.astype(np.float32)).astype(jnp.bfloat16))


def assert_close(out, ref, bound, out_dtype, rounds: bool, what=""):
  """Norm-wise and element-wise against the exact float64 `ref` (module docstring)."""
  assert out.dtype == out_dtype, (out.dtype, out_dtype)
  out64 = as_f64(out)
  err = np.abs(out64 - ref)
  step = OUT_STEP[np.dtype(out_dtype)]
  rel = np.linalg.norm(err) / np.linalg.norm(ref)
  # Element-wise, relative to |A| @ |B| (the output's rounding is of |ref| <= that), plus
  # one subnormal step of the output (as gemm_testing.assert_gemm_close).
  elem_tol = step + ACC + (ELEMENT_ROUNDING if rounds else 0.0)
  limit = elem_tol * bound + float(jnp.finfo(out.dtype).smallest_subnormal)
  # Norm-wise: the output's rounding and fp32 accumulation; the operands' rounding has
  # no rigorous norm-wise bound tighter than the element-wise one (module docstring).
  norm_tol = np.linalg.norm(limit) / np.linalg.norm(ref) if rounds else step + ACC
  assert rel <= norm_tol, f"{what}: ||out - ref|| / ||ref|| = {rel:.3g} > {norm_tol:.3g}"
  worst = float(np.max(err / limit))
  assert worst <= 1, f"{what}: an element is off by {worst:.3g}x {elem_tol:.3g} of |A| @ |B|"
  return rel


def _pair(rng, kind, m, k, n, da=E4M3, db=E4M3, spread=True, pow2=False):
  a, sa, _ = operands(rng, (m, k), da, A_BLOCK[kind], spread)
  b, sb, _ = operands(rng, (k, n), db, B_BLOCK[kind], spread)
  if pow2:
    sa, sb = pow2_ceil(sa).astype(E8M0), pow2_ceil(sb).astype(E8M0)
  a64, b64 = dequantized(a, sa, A_BLOCK[kind]), dequantized(b, sb, B_BLOCK[kind])
  return a, b, sa, sb, a64, b64


# ---------------------------------------------------------------- numerics


# Power-of-two scales with block scales only: for the others the program is the same
# (the shared base's test_power_of_two_scales runs them on this variant too).
@pytest.mark.parametrize("kind, pow2", [("tensor", False), ("row_col", False), ("block", False),
                                        ("block", True)], ids=["tensor", "row_col", "block",
                                                               "block-pow2"])
@pytest.mark.parametrize("out_dtype", [BF16, F16, F32], ids=lambda d: d.name)
def test_every_scale_kind_against_float64(kind, pow2, out_dtype, rng):
  """Ragged M, K, N (partial blocks along K and N), e4m3 x e5m2: within the output's
  rounding of the exact product where the program widens exactly (then the same sums as
  "dot_general"), plus the operands' bf16 rounding with float32 block scales (and only
  there: it is real, well above "dot_general"'s error); block scales also against the
  product of the operands as rounded."""
  rounds = kind == "block" and not pow2
  spread = out_dtype != F16   # rows and columns 8x apart would overflow float16
  a, b, sa, sb, a64, b64 = _pair(rng, kind, 70, 300, 200, E4M3, E5M2, spread, pow2)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, **KW)
  ref, bound = reference(a64, b64)
  rel = assert_close(out, ref, bound, out_dtype, rounds, "exact product")
  assert xla.dequantize_rounds(jaxgemm.problems_in(
      lambda a, b: jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, **KW), a, b,
      backward=False)[0]) == rounds
  if kind == "block":
    # The product of the operands as the program rounds them, to fp32 accumulation and
    # the output's rounding (power-of-two scales: exactly the dequantized operands).
    rounded_a, rounded_b = bf16_rounded(a64), bf16_rounded(b64)
    assert_close(out, *reference(rounded_a, rounded_b), out_dtype, False, "rounded operands")
    assert (np.array_equal(rounded_a, a64) and np.array_equal(rounded_b, b64)) == pow2
  if out_dtype == F32:
    general = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, backend="xla",
                                    variant="dot_general")
    general_rel = assert_close(general, ref, bound, F32, False, "dot_general")
    if rounds:   # real: well above fp32 accumulation, all that "dot_general" shows
      assert rel > 2.0**-10 > 64 * general_rel, (rel, general_rel)
    else:        # the same sums: both at fp32 accumulation's level
      np.testing.assert_allclose(as_f64(out), as_f64(general), rtol=0, atol=ACC * bound.max())


def test_jit_and_vmap_give_the_programs_numbers(rng):
  """Under jit and vmap over both operands (a batch: b's block scales per entry), exactly
  the program's numbers: the rounded operands' product to fp32 accumulation. (The shared
  base, test_scaled_matmul.py, runs this variant through every layout, batch form and
  transformation against the exact product.)"""
  f = lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, **KW)
  a, sa, a64 = operands(rng, (3, 20, 260), E4M3, (1, 128))
  bs = [operands(rng, (260, 30), E5M2, (128, 128)) for _ in range(3)]
  bq, bsc = jnp.stack([x[0] for x in bs]), jnp.stack([x[1] for x in bs])
  b64 = np.stack([x[2] for x in bs])
  out = jax.jit(jax.vmap(f))(a, bq, sa, bsc)
  assert_close(out, *reference(bf16_rounded(a64), bf16_rounded(b64)), F32, False, "rounded")
  assert_close(out, *reference(a64, b64), F32, True, "exact product")


def test_not_differentiable_names_the_training_path():
  """No gradient (scaled_matmul_p has none, whichever program runs it)."""
  a, b = jnp.ones((8, 256), E4M3), jnp.ones((256, 8), E4M3)
  f = lambda sa: jaxgemm.scaled_matmul(a, b, sa, jnp.ones((2, 1)), **KW).astype(F32).sum()
  with pytest.raises(NotImplementedError, match="fp8=.*dgrad and wgrad"):
    jax.grad(f)(jnp.ones((8, 2)))


# ---------------------------------------------------------------- the registry


def _problem(kind="block", out_dtype=BF16, scale_dtype=F32, dtype=E4M3):
  return jaxgemm.ScaledMatmulProblem(1, 128, 4096, 1024, dtype, out_dtype, F32,
                                     scale_kind=kind, scale_dtype=scale_dtype)


def test_a_variant_of_the_xla_backend_never_its_default():
  """dot_general stays what backend="xla" (and "auto" without a record) runs, the last
  rung (XLA's own tuning record's); both rungs' code is xla.py's."""
  backend = registry.get_backend("xla", "scaled_matmul")
  assert jaxgemm.variants("xla", "scaled_matmul") == (VARIANT, "dot_general")
  for kind in ("tensor", "row_col", "block"):
    p = _problem(kind)
    assert backend.default_variant(p) == "dot_general"
    assert dispatch.choose(p, "xla").variant == "dot_general"
    assert dispatch.choose(p, "xla", VARIANT).describe().startswith(f"xla/{VARIANT} ")
  assert backend.kernel_modules_of(VARIANT) == ("jaxgemm.ops.scaled_matmul.xla",)
  assert (tuning_cache.kernel_version("xla", "scaled_matmul", variant=VARIANT)
          == tuning_cache.kernel_version("xla", "scaled_matmul", variant="dot_general"))


@pytest.mark.parametrize("kind, out_dtype, scale_dtype, offered", [
    ("tensor", F32, F32, True), ("row_col", F16, F32, True),   # exact widening
    ("block", BF16, F32, True),    # the operands' rounding, the size of the output's
    ("block", F32, F32, False), ("block", F16, F32, False),   # far above the output's
    ("block", F32, E8M0, True),    # power-of-two scales: exact
])
def test_tuning_candidates_where_its_error_is_the_outputs(kind, out_dtype, scale_dtype, offered):
  backend = registry.get_backend("xla", "scaled_matmul")
  p = _problem(kind, out_dtype, scale_dtype)
  candidates = backend.tuning_candidates(p)
  assert candidates[0] == ("dot_general", XlaConfig())
  assert ((VARIANT, XlaConfig()) in candidates) == offered
  for variant, config in candidates:
    backend.check(p, variant, config)


def test_bad_inputs_name_the_argument():
  a, b, one = jnp.ones((8, 256), E4M3), jnp.ones((256, 16), E4M3), jnp.float32(1)
  with pytest.raises(ValueError, match=r"unknown variant='dequantize' for backend='xla'; "
                                       r"valid variants: \['dequantize_bf16', 'dot_general'\]"):
    jaxgemm.scaled_matmul(a, b, one, one, backend="xla", variant="dequantize")
  with pytest.raises(ValueError, match=r"variant= and config= pick a kernel within a named"):
    jaxgemm.scaled_matmul(a, b, one, one, variant=VARIANT)
  with pytest.raises(TypeError, match=r"backend='xla' takes config=XlaConfig\(\.\.\.\)"):
    jaxgemm.scaled_matmul(a, b, one, one, config=jaxgemm.TritonConfig(), **KW)
  with pytest.raises(TypeError, match=r"scaled_matmul's b must be fp8.*bfloat16"):
    jaxgemm.scaled_matmul(a, b.astype(jnp.bfloat16), one, one, **KW)
  backend = registry.get_backend("xla", "scaled_matmul")
  with pytest.raises(NotImplementedError, match=r"variant='dequantize_bf16'.*a.dtype=bfloat16"):
    backend.check(_problem(dtype=BF16), VARIANT, XlaConfig())
