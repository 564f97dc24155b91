"""scaled_matmul (FP8 GEMMs with scales) and quantize on every registered kernel.

References are float64 products of the dequantized operands, q * scale with the
scales expanded here by their block sizes (independently of the library).

Tolerances (element-wise against |A| @ |B| of the dequantized operands, and
norm-wise, `gemm_testing.assert_gemm_close`): the output's one rounding
(OUT_STEP: half a step of out_dtype, relative to |ref| <= |A| @ |B|) plus
ACC_TOL = 2**-10 for the accumulation. fp32 accumulation's own error is about
sqrt(K) * 2**-24 <= 2**-17 of |A| @ |B| at K = 16384 (random signs; the xla
backend measures far below, see test_accumulation_stays_at_fp32_level). The
allowance is for kernels on Hopper, whose FP8 tensor cores keep about 14 bits
while accumulating (DeepSeek-V3 report): promoted to fp32 every 128 of K, each
interval's sum carries that precision's error, which does not grow with K. The
worst element is where one interval is most of the sum (K near 128): there
every promoted kernel, Pallas and Triton alike, read up to 7.4e-4 (1.5 *
2**-11) of |A| @ |B| element-wise, in 37-43 of 122880 elements at K = 130, and
at most 2.2e-4 at K = 1024 and 4096 (H100, 30 seeds of the operands below,
the fp8-fused-quant probe's run11a at f0b6981, `acc_probe.py`); norm-wise they read
at most 3.6e-4 there, and 1.2e-4 to 3.1e-4 on the H200 (the FP8 step probe's run2 at
b5b0db4). 2**-11, the bound before run11a,
was set from those norm-wise readings and failed element-wise on an H100
(run10's tier: 6 of 4000 elements, 1.2x over); 2**-10 (9.8e-4) is 1.3x above
the worst element read. Unpromoted, the error grows with K (about 2% of the
result at K = 4096 in the report); test_accumulation_stays_at_fp32_level checks
that it does not grow from K = 1024 to 16320, and the pallas file's promotion
test compares against an emulated unpromoted accumulator.

One kernel rounds more: the xla backend's "dequantize_bf16" variant rounds
block-scaled operands (float32 scales) to bf16 once dequantized, so each element
of A and B is off by up to u = 2**-8 of itself, each product by up to 2u, and each
result element by up to 2u * (|A| @ |B|) on top of the others' error: a rigorous
bound, `DEQUANTIZE_ROUNDING`, which its block cases are allowed (`allowance`);
norm-wise it reads 2.2e-3 to 2.6e-3 of ||ref|| here, about sqrt(2/3) * u * 0.74
(independent uniform roundings of log-distributed mantissas). Its other cases
widen exactly and get no allowance. test_scaled_matmul_xla.py tests it against
float64 at its expected level.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
import gemm_testing
from gemm_testing import as_f64, assert_gemm_close
from jaxgemm import registry
from jaxgemm.ops.scaled_matmul.quantize import pow2_ceil, quantize_pair

pytestmark = pytest.mark.op("scaled_matmul")

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
ACC_TOL = 2.0**-10
OUT_STEP = {BF16: 2.0**-8, F16: 2.0**-11, F32: 2.0**-24}
# quantize's block for each scale kind, for a (stored (M, K)) and b (stored (K, N)).
A_BLOCK = {"tensor": None, "row_col": (1, None), "block": (1, 128)}
B_BLOCK = {"tensor": None, "row_col": (None, 1), "block": (128, 128)}


def expand(scale, shape, block):
  """The float64 scale of every element of an array of `shape` quantized with `block`."""
  s = as_f64(scale)
  if block is None:
    return np.broadcast_to(s, shape)
  for axis, b in ((-2, block[0]), (-1, block[1])):
    size = shape[axis]
    s = np.repeat(s, size if b is None else b, axis=axis)
    s = np.take(s, np.arange(size), axis=axis)
  return np.broadcast_to(s, shape)


def dequantized(q, scale, block):
  return as_f64(q) * expand(scale, q.shape, block)


def reference(a, b):
  """(a @ b, |a| @ |b|) in float64."""
  return np.matmul(a, b), np.matmul(np.abs(a), np.abs(b))


def operands(rng, shape, dtype, block, spread=True):
  """(q, scale, dequantized float64) of random data quantized with `block`; rows
  and columns of different magnitudes when `spread`, so scales differ."""
  x = rng.standard_normal(shape)
  if spread:
    x = x * np.exp2(rng.integers(-3, 4, size=shape[-2:-1] + (1,)))
    x = x * np.exp2(rng.integers(-3, 4, size=(1,) + shape[-1:]))
  q, s = jaxgemm.quantize(jnp.asarray(x, jnp.float32), dtype, block)
  return q, s, dequantized(q, s, block)


def unsupported(kernel, a, b, sa, sb, **kw) -> str | None:
  """None when `kernel` takes the call, else its NotImplementedError's message
  (`gemm_testing.kernel_supports`): a variant may take some scale kinds only
  (pallas' warp_specialized_tma_scales takes block scales)."""
  return gemm_testing.kernel_supports(
      kernel, a, b, fn=lambda a, b, **k: jaxgemm.scaled_matmul(a, b, sa, sb, **k), **kw)


def skip_unless_supported(kernel, a, b, sa, sb, **kw) -> None:
  reason = unsupported(kernel, a, b, sa, sb, **kw)
  if reason is not None:
    pytest.skip(f"{kernel} does not support this case: {reason}")


def check(out, ref, bound, out_dtype, what="", extra=0.0):
  """`out` within the output's rounding, ACC_TOL and `extra`, the kernel's own allowance
  (`allowance(kernel, kinds)`), of |A| @ |B| element-wise and of ||ref|| norm-wise."""
  assert out.dtype == out_dtype, (out.dtype, out_dtype)
  assert_gemm_close(out, ref, bound, OUT_STEP[np.dtype(out_dtype)] + ACC_TOL + extra, what)


# The block-scaled operands' bf16 rounding of the xla backend's "dequantize_bf16"
# variant, relative to |A| @ |B| (module docstring).
DEQUANTIZE_ROUNDING = 2 * 2.0**-8


def allowance(kernel, *kinds) -> float:
  """The allowance beyond ACC_TOL of `kernel` on a call with scales of `kinds` (float32):
  DEQUANTIZE_ROUNDING for the dequantize_bf16 variant with block scales, else none."""
  rounds = (kernel.backend, kernel.variant) == ("xla", "dequantize_bf16") and "block" in kinds
  return DEQUANTIZE_ROUNDING if rounds else 0.0


# The pallas variant that copies block scales through the TMA ring (block scales
# only): on the CPU it runs the transposed weight and the pallas file's promotion test;
# the other tests (the same kernel behind the same pre-pass and wrapper) in the GPU tier.
TMA_ONLY_ON_GPU = pytest.mark.slow_for_kernels(variants=("warp_specialized_tma_scales",))

KIND_PAIRS = [("tensor", "tensor"), ("row_col", "row_col"), ("block", "block"),
              ("tensor", "row_col"), ("row_col", "tensor"), ("tensor", "block"),
              ("block", "tensor"), ("row_col", "block")]
DTYPE_PAIRS = [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2), (E5M2, E4M3)]


# Mosaic GPU's interpreter takes ~7 s a case: on the CPU the plain Pallas variant runs the
# first 6, the GPU tier the rest and the TMA-scales variant's block cases (the CPU runs
# that variant in the batches and promotion tests; every case runs on Triton's
# interpreter). 6, not 12, since issue 44's tests brought CI to 24:23 (at 7c98e04).
@pytest.mark.slow_for_kernels(keep=6, cpu_variants=("warp_specialized",))
@pytest.mark.cases([pytest.param((ka, kb, da, db, BF16), id=f"{ka}-{kb}-{da.name}-{db.name}")
                    for ka, kb in KIND_PAIRS for da, db in DTYPE_PAIRS]
                   + [pytest.param((k, k, E4M3, E4M3, o), id=f"{k}-out-{o.name}")
                      for k in ("tensor", "row_col", "block") for o in (F16, F32)])
def test_scale_kinds_dtypes_and_out_dtypes(kernel, case, rng):
  """Every scale kind (and their mixes), fp8 dtype pairing and out dtype, on ragged
  M, K, N (none a multiple of 128: partial blocks along K and N)."""
  ka, kb, da, db, out_dtype = case
  spread = out_dtype != F16   # rows and columns 8x apart would overflow float16's 65504
  a, sa, a64 = operands(rng, (70, 300), da, A_BLOCK[ka], spread)
  b, sb, b64 = operands(rng, (300, 200), db, B_BLOCK[kb], spread)
  skip_unless_supported(kernel, a, b, sa, sb, out_dtype=out_dtype)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, **kernel.kw)
  check(out, *reference(a64, b64), out_dtype, f"{case}", allowance(kernel, ka, kb))


# The first three cases take each scale kind and each layout once: the plain Pallas
# variant runs those on the CPU, the GPU tier every pair (and the TMA-scales variant).
TRANSPOSED_CASES = [
    pytest.param((kind, ta, tb), id=f"{ta}-{tb}-{kind}")
    for kind, (ta, tb) in [("tensor", (False, True)), ("row_col", (True, False)),
                           ("block", (True, True))]
    + [(kind, t) for kind in ("tensor", "row_col", "block")
       for t in [(False, True), (True, False), (True, True)]
       if (kind, t) not in [("tensor", (False, True)), ("row_col", (True, False)),
                            ("block", (True, True))]]]


@pytest.mark.cases(TRANSPOSED_CASES)
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=("warp_specialized",))
def test_transposed_layouts(kernel, case, rng):
  """Operands stored transposed, with their scales as quantize returns them for the
  stored array (the backward's layouts: the forward's fp8 tensors reused)."""
  kind, trans_a, trans_b = case
  m, k, n = 40, 260, 136
  a_block = {"tensor": None, "row_col": (None, 1), "block": (128, 1)}[kind] if trans_a \
      else A_BLOCK[kind]
  b_block = {"tensor": None, "row_col": (1, None), "block": (128, 128)}[kind] if trans_b \
      else B_BLOCK[kind]
  a, sa, a64 = operands(rng, (k, m) if trans_a else (m, k), E4M3, a_block)
  b, sb, b64 = operands(rng, (n, k) if trans_b else (k, n), E5M2, b_block)
  skip_unless_supported(kernel, a, b, sa, sb, trans_a=trans_a, trans_b=trans_b)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, trans_a=trans_a, trans_b=trans_b,
                              **kernel.kw)
  check(out, *reference(a64.T if trans_a else a64, b64.T if trans_b else b64), F32,
        extra=allowance(kernel, kind))


def test_transposed_weight_reuses_forward_scales(kernel, rng):
  """dgrad's dY @ W^T takes the forward's w8 and w_scale unchanged (trans_b=True)."""
  w, sw, w64 = operands(rng, (384, 256), E4M3, (128, 128))
  dy, sdy, dy64 = operands(rng, (24, 256), E5M2, (1, 128))
  out = jaxgemm.scaled_matmul(dy, w, sdy, sw, out_dtype=F32, trans_b=True, **kernel.kw)
  check(out, *reference(dy64, w64.T), F32, extra=allowance(kernel, "block"))


BATCH_SHAPES = {"shared-weight": ((3, 2, 50, 130), (130, 140)),
                "batched": ((3, 50, 130), (3, 130, 140)),
                "broadcast": ((2, 1, 50, 130), (3, 130, 140))}
# The first three take each form and each scale kind once: the plain Pallas variant runs
# those on the CPU, the GPU tier every pair (and the TMA-scales variant).
BATCH_CASES = [pytest.param((kind, form), id=f"{form}-{kind}") for kind, form in
               [("tensor", "shared-weight"), ("row_col", "batched"), ("block", "broadcast")]
               + [(kind, form) for form in BATCH_SHAPES for kind in ("tensor", "row_col", "block")
                  if (kind, form) not in [("tensor", "shared-weight"), ("row_col", "batched"),
                                          ("block", "broadcast")]]]


@pytest.mark.cases(BATCH_CASES)
@pytest.mark.slow_for_kernels(keep=1, cpu_variants=("warp_specialized",))
def test_batches(kernel, case, rng):
  """Leading batch dimensions as in jnp.matmul, with scales per batch entry."""
  kind, form = case
  a_shape, b_shape = BATCH_SHAPES[form]
  a, sa, a64 = operands(rng, a_shape, E4M3, A_BLOCK[kind])
  b, sb, b64 = operands(rng, b_shape, E4M3, B_BLOCK[kind])
  if kind == "tensor":   # one scale per tensor: quantize saw the whole batch
    assert sa.shape == sb.shape == ()
  skip_unless_supported(kernel, a, b, sa, sb)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, **kernel.kw)
  check(out, *reference(a64, b64), F32, extra=allowance(kernel, kind))


@TMA_ONLY_ON_GPU
def test_scale_without_batch_dims_applies_to_every_entry(kernel, rng):
  a, sa, _ = operands(rng, (50, 130), E4M3, (1, 128))
  b, sb, b64 = operands(rng, (4, 130, 20), E4M3, (128, 128))
  a4 = jnp.broadcast_to(a, (4, 50, 130))
  out = jaxgemm.scaled_matmul(a4, b, sa, sb, out_dtype=F32, **kernel.kw)
  check(out, *reference(dequantized(a, sa, (1, 128)), b64), F32, extra=allowance(kernel, "block"))


@TMA_ONLY_ON_GPU   # test_each_k_block_is_promoted_to_fp32 runs it at K = 16320
@pytest.mark.parametrize("kind", ["tensor", "block"])
def test_accumulation_stays_at_fp32_level(kernel, kind, rng):
  """K up to 16384 (partial last block): the error against float64 of the dequantized
  inputs stays within ACC_TOL of |A| @ |B| (module docstring), with no growth in K
  beyond fp32's."""
  errors, norm_errors = [], []
  for k in (1024, 4096, 16384 - 64):
    a, sa, a64 = operands(rng, (16, k), E4M3, A_BLOCK[kind], spread=False)
    b, sb, b64 = operands(rng, (k, 24), E4M3, B_BLOCK[kind], spread=False)
    skip_unless_supported(kernel, a, b, sa, sb)
    out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, **kernel.kw)
    ref, bound = reference(a64, b64)
    assert_gemm_close(out, ref, bound, ACC_TOL + allowance(kernel, kind), f"K={k}")
    errors.append(float(np.max(np.abs(as_f64(out) - ref) / bound)))
    norm_errors.append(float(np.linalg.norm(as_f64(out) - ref) / np.linalg.norm(ref)))
  # Promoted, the error relative to ||ref|| stays flat in K; one reduced-precision
  # accumulator over all of K grows ~sqrt(16) = 4x from K = 1024 to 16320. (Plus
  # 2**-17, fp32 accumulation's own level, far below the H200's 1.2e-4.)
  assert norm_errors[-1] <= 2 * norm_errors[0] + 2.0**-17, norm_errors
  if kernel.is_xla and not allowance(kernel, kind):   # XLA accumulates in fp32: far below it
    assert max(errors) < 2.0**-17, errors


def test_zero_k_and_zero_rows(kernel):
  a, b = jnp.zeros((5, 0), E4M3), jnp.zeros((0, 7), E4M3)
  skip_unless_supported(kernel, a, b, jnp.float32(2), jnp.float32(3))
  out = jaxgemm.scaled_matmul(a, b, jnp.float32(2), jnp.float32(3), out_dtype=F32, **kernel.kw)
  np.testing.assert_array_equal(out, np.zeros((5, 7)))
  out = jaxgemm.scaled_matmul(jnp.zeros((0, 130), E4M3), jnp.ones((130, 7), E4M3),
                              jnp.zeros((0, 2)), jnp.ones((2, 1)), **kernel.kw)
  assert out.shape == (0, 7)


@TMA_ONLY_ON_GPU
def test_jit_and_vmap(kernel, rng):
  """Under jit; vmap over activations (joins M), over both operands, and over
  per-example per-tensor scales (become per-row scales)."""
  kw = dict(out_dtype=F32, **kernel.kw)
  block = allowance(kernel, "block")
  a, sa, a64 = operands(rng, (4, 20, 260), E4M3, (1, 128))
  b, sb, b64 = operands(rng, (260, 30), E4M3, (128, 128))
  f = lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, **kw)
  check(jax.jit(f)(a, b, sa, sb), *reference(a64, b64), F32, "jit", block)
  out = jax.vmap(f, in_axes=(0, None, 0, None))(a, b, sa, sb)
  check(out, *reference(a64, b64), F32, "vmap a", block)
  bs = [operands(rng, (260, 30), E5M2, (128, 128)) for _ in range(4)]
  bq, bsc = jnp.stack([x[0] for x in bs]), jnp.stack([x[1] for x in bs])
  out = jax.jit(jax.vmap(f, in_axes=(0, 0, 0, 0)))(a, bq, sa, bsc)
  check(out, *reference(a64, np.stack([x[2] for x in bs])), F32, "vmap both", block)
  # Per-example tensor scales, vmapped (a mapped, then b mapped with a shared).
  ts = [operands(rng, (20, 64), E4M3, None, spread=False) for _ in range(4)]
  aq, asc = jnp.stack([x[0] for x in ts]), jnp.stack([x[1] for x in ts])
  w, sw, w64 = operands(rng, (64, 30), E4M3, None)
  if unsupported(kernel, aq[0], w, jnp.ones((20, 1)), jnp.ones((1, 30))) is not None:
    return   # a variant for block scales only: they become per-row scales
  out = jax.vmap(f, in_axes=(0, None, 0, None))(aq, w, asc, sw)
  check(out, *reference(np.stack([x[2] for x in ts]), w64), F32, "vmap tensor scales")
  out = jax.vmap(lambda b, sb: f(ts[0][0], b, ts[0][1], sb), in_axes=(0, 0))(
      jnp.stack([w, w]), jnp.stack([sw, 2 * sw]))
  check(out, *reference(ts[0][2], np.stack([w64, 2 * w64])), F32, "vmap b tensor scale")
  # Nested vmap over a batched call.
  out = jax.vmap(jax.vmap(f, in_axes=(0, None, 0, None)), in_axes=(0, None, 0, None))(
      a.reshape(2, 2, 20, 260), b, sa.reshape(2, 2, 20, 3), sb)
  check(out, *reference(a64.reshape(2, 2, 20, 260), b64), F32, "nested vmap", block)


@TMA_ONLY_ON_GPU
@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
def test_vmap_transposed(kernel, kind, rng):
  """vmap over a stored transposed (its mapped axis joins M after K), b transposed too."""
  a_block = {"tensor": None, "row_col": (None, 1), "block": (128, 1)}[kind]
  b_block = {"tensor": None, "row_col": (1, None), "block": (128, 128)}[kind]
  a, sa, a64 = operands(rng, (3, 260, 40), E4M3, a_block)   # each entry stored (K, M)
  b, sb, b64 = operands(rng, (136, 260), E5M2, b_block)     # stored (N, K)
  f = lambda a, sa: jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, trans_a=True,
                                          trans_b=True, **kernel.kw)
  skip_unless_supported(kernel, a[0], b, sa if kind == "tensor" else sa[0], sb,
                        trans_a=True, trans_b=True)
  out = jax.vmap(f, in_axes=(0, None if kind == "tensor" else 0))(a, sa)
  check(out, *reference(np.swapaxes(a64, -1, -2), b64.T), F32, extra=allowance(kernel, kind))


def test_not_differentiable_names_the_training_path(kernel):
  a, b = jnp.ones((8, 16), E4M3), jnp.ones((16, 8), E4M3)
  skip_unless_supported(kernel, a, b, jnp.float32(1), jnp.float32(1))
  f = lambda sa: jaxgemm.scaled_matmul(a, b, sa, jnp.float32(1), **kernel.kw).sum()
  with pytest.raises(NotImplementedError, match="fp8=.*dgrad and wgrad"):
    jax.grad(lambda s: f(s).astype(jnp.float32))(jnp.float32(1))
  # A call on constants inside a differentiated function is fine (zero tangents).
  g = jax.grad(lambda x: x * f(jnp.float32(2)).astype(jnp.float32))(jnp.float32(3))
  assert float(g) == 2 * 16 * 64   # 64 elements, each 2 * 16


# ---------------------------------------------------------------- errors


def test_bad_inputs_name_the_argument(kernel):
  a, b = jnp.ones((8, 256), E4M3), jnp.ones((256, 16), E4M3)
  one = jnp.float32(1)
  call = lambda *args, **kw: jaxgemm.scaled_matmul(*args, **{**kernel.kw, **kw})
  with pytest.raises(TypeError, match=r"scaled_matmul's a must be fp8.*bfloat16"):
    call(a.astype(jnp.bfloat16), b, one, one)
  with pytest.raises(TypeError, match=r"scaled_matmul's b must be fp8.*float32"):
    call(a, b.astype(jnp.float32), one, one)
  with pytest.raises(TypeError, match=r"a_scale must be float32 or float8_e8m0fnu .*; got "
                                      r"a_scale.dtype=bfloat16"):
    call(a, b, jnp.bfloat16(1), one)
  with pytest.raises(TypeError, match=r"b_scale must be float32 or .*b_scale.dtype=float16"):
    call(a, b, one, jnp.ones((2, 1), jnp.float16))
  with pytest.raises(ValueError, match=r"a_scale has shape \(8, 3\).*\(8, 1\).*\(8, 2\)"):
    call(a, b, jnp.ones((8, 3)), one)
  with pytest.raises(ValueError, match=r"b_scale has shape \(2, 16\).*\(1, 16\).*\(2, 1\)"):
    call(a, b, one, jnp.ones((2, 16)))
  with pytest.raises(ValueError, match=r"a_scale has shape \(5, 8, 1\).*batch \(\)"):
    call(a, b, jnp.ones((5, 8, 1)), one)
  with pytest.raises(ValueError, match=r"b_scale is per column.*block=\(128, 128\)"):
    call(a, b, jnp.ones((8, 2)), jnp.ones((1, 16)))
  with pytest.raises(TypeError, match=r"out_dtype must be one of"):
    call(a, b, one, one, out_dtype=jnp.int32)
  with pytest.raises(TypeError, match=r"contracting dimensions differ.*K=256.*K=128"):
    call(a, b[:128], one, one)
  with pytest.raises(ValueError, match=r"a must have at least 2 dimensions"):
    call(a[0], b, one, one)
  with pytest.raises(ValueError, match=r"batch dimensions do not broadcast"):
    call(jnp.ones((2, 8, 256), E4M3), jnp.ones((3, 256, 16), E4M3), one, one)
  with pytest.raises(ValueError, match=r"unknown backend='nope'"):
    jaxgemm.scaled_matmul(a, b, one, one, backend="nope")


@TMA_ONLY_ON_GPU
def test_registered_op_and_problem(kernel):
  """The op is registered (problems_in finds it: backward=False, as it has no gradient);
  its example operands run through Op.call, as the autotuner runs them."""
  assert "scaled_matmul" in registry.ops() and "xla" in jaxgemm.backends("scaled_matmul")
  a, b = jnp.ones((2, 64, 256), E4M3), jnp.ones((256, 32), E5M2)
  fn = lambda a, b: jaxgemm.scaled_matmul(a, b, jnp.ones((2, 64, 2)), jnp.ones((2, 1)))
  (problem,) = jaxgemm.problems_in(fn, a, b, backward=False)
  assert isinstance(problem, jaxgemm.ScaledMatmulProblem)
  assert problem.describe() == ("1x(128x256 @ 256x32) NN float8_e4m3fn x float8_e5m2->bfloat16 "
                                "block scales")
  op = registry.get_op("scaled_matmul")
  args = op.example_operands(problem, jax.random.key(0))
  out = op.call(problem, *args, backend=kernel.backend, variant=kernel.variant, config=None)
  assert out.shape == problem.out_shape and out.dtype == BF16


# ---------------------------------------------------------------- quantize

BLOCKS = [None, (1, 128), (128, 128), (1, None), (None, 1), (128, 1)]


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_quantize_round_trip_and_shapes(block, dtype, rng):
  """x ~= q * scale within half the fp8 dtype's relative step (normal range) plus half
  its smallest subnormal step times the scale; scales in scaled_matmul's shapes."""
  rows, cols = 200, 300
  x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-6, 7, size=(rows, 1)))
  q, s = jax.jit(jaxgemm.quantize, static_argnums=(1, 2))(jnp.asarray(x, jnp.float32), dtype,
                                                           block)
  want = {None: (), (1, 128): (rows, 3), (128, 128): (2, 3), (1, None): (rows, 1),
          (None, 1): (1, cols), (128, 1): (2, cols)}[block]
  assert q.dtype == dtype and q.shape == x.shape and s.shape == want and s.dtype == F32
  info = jnp.finfo(dtype)
  x32 = as_f64(jnp.asarray(x, jnp.float32))
  scale = expand(s, x.shape, block)
  err = np.abs(dequantized(q, s, block) - x32)
  limit = float(info.eps) / 2 * np.abs(x32) + scale * float(info.smallest_subnormal) / 2
  assert np.all(err <= limit * (1 + 1e-6)), float(np.max(err / limit))
  # Each block's largest element lands on the dtype's max: the range is used.
  np.testing.assert_allclose(np.max(np.abs(as_f64(q))), float(info.max))


def test_quantize_saturates_zero_safe_and_batched(rng):
  fmax = float(jnp.finfo(E4M3).max)
  # Saturation: x / scale is clipped to +-max (never inf or nan), even for an
  # element that rounds up past the max.
  x = jnp.asarray([[1e30, -3e38, 2.0, 0.0]], jnp.float32)
  q, s = jaxgemm.quantize(x)
  assert np.all(np.isfinite(as_f64(q))) and float(jnp.min(q.astype(F32))) == -fmax
  q, s = jaxgemm.quantize(jnp.asarray([[448.0, 470.0]]), block=None)
  assert float(s) == np.float32(470.0) / np.float32(fmax) and np.all(np.abs(as_f64(q)) <= fmax)
  # Zeros: an all-zero tensor and an all-zero block get scale 1 and q = 0.
  q, s = jaxgemm.quantize(jnp.zeros((4, 4)))
  assert float(s) == 1.0 and not np.any(as_f64(q))
  x = np.ones((2, 256), np.float32)
  x[1, 128:] = 0
  q, s = jaxgemm.quantize(jnp.asarray(x), jnp.float8_e5m2, (1, 128))
  c = np.float32(1) / np.float32(57344)
  np.testing.assert_array_equal(s, np.array([[c, c], [c, 1.0]], np.float32))
  assert not np.any(as_f64(q)[1, 128:])
  # Leading dimensions are batch: one scale per block of each entry.
  x = rng.standard_normal((3, 5, 260)).astype(np.float32)
  q, s = jaxgemm.quantize(x, block=(1, 128))
  assert s.shape == (3, 5, 3)
  np.testing.assert_allclose(as_f64(s)[1], as_f64(jaxgemm.quantize(x[1], block=(1, 128))[1]))


def test_quantize_bad_arguments():
  with pytest.raises(TypeError, match="dtype must be one of"):
    jaxgemm.quantize(jnp.ones((2, 2)), jnp.bfloat16)
  with pytest.raises(TypeError, match="block must be None or a pair"):
    jaxgemm.quantize(jnp.ones((2, 2)), block=128)
  with pytest.raises(TypeError, match="positive ints or None"):
    jaxgemm.quantize(jnp.ones((2, 2)), block=(0, 128))
  with pytest.raises(ValueError, match="last two dimensions"):
    jaxgemm.quantize(jnp.ones(8), block=(1, 128))
  with pytest.raises(TypeError, match="floating x"):
    jaxgemm.quantize(jnp.ones((2, 2), jnp.int32))


def test_problems_in_finds_it_and_no_backward():
  """The tuner's default (backward=True) skips an op with no derivative instead of failing."""
  a, b = jnp.ones((64, 256), jnp.float8_e4m3fn), jnp.ones((256, 64), jnp.float8_e4m3fn)
  s = jnp.ones((), jnp.float32)
  found = jaxgemm.problems_in(lambda a, b: jaxgemm.scaled_matmul(a, b, s, s), a, b)
  assert [p.op for p in found] == ["scaled_matmul"]


E8M0 = np.dtype(jnp.float8_e8m0fnu)


@TMA_ONLY_ON_GPU
@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
def test_power_of_two_scales(kernel, kind, rng):
  """float8_e8m0fnu scales (quantize's power-of-two scales) give the float32 scales'
  result: bit for bit on the CPU (the same fp32 sums, times exact scales); on the GPU
  the xla backend writes bf16 from cuBLAS and scales it, within the one rounding.
  One e8m0 and one float32 scale run as float32."""
  a, sa, _ = operands(rng, (70, 300), E4M3, A_BLOCK[kind])
  b, sb, _ = operands(rng, (300, 200), E5M2, B_BLOCK[kind])
  pa, pb = pow2_ceil(sa), pow2_ceil(sb)
  ea, eb = pa.astype(E8M0), pb.astype(E8M0)
  skip_unless_supported(kernel, a, b, ea, eb)
  run = jax.jit(lambda a, b, sa, sb: jaxgemm.scaled_matmul(a, b, sa, sb, **kernel.kw))
  out = run(a, b, ea, eb)
  a64, b64 = dequantized(a, pa, A_BLOCK[kind]), dequantized(b, pb, B_BLOCK[kind])
  check(out, *reference(a64, b64), BF16, kind)
  if jax.default_backend() == "cpu":
    np.testing.assert_array_equal(np.asarray(out, F32), np.asarray(run(a, b, pa, pb), F32))
  mixed = run(a, b, ea, pb)
  check(mixed, *reference(a64, b64), BF16, f"{kind} mixed")
  (problem,) = jaxgemm.problems_in(lambda a, b: jaxgemm.scaled_matmul(a, b, ea, eb), a, b,
                                   backward=False)
  assert problem.pow2_scales and "power-of-two scales" in problem.describe()


@TMA_ONLY_ON_GPU
@pytest.mark.kernel_backends
def test_autotune_checks_fp8_kernels_against_xla(kernel, tmp_path):
  """jaxgemm.autotune finds the scaled_matmul GEMM and checks each candidate against
  XLA's result at the fp8 tolerance (the output's rounding), so a correct kernel's
  trials are "ok" (a KeyError or a too-tight tolerance would make them fail)."""
  from jaxgemm import tuning  # noqa: PLC0415
  x = jax.random.normal(jax.random.key(0), (64, 256))
  w = jax.random.normal(jax.random.key(1), (256, 128))
  a8, sa = jaxgemm.quantize(x, block=(1, 128))
  b8, sb = jaxgemm.quantize(w, block=(128, 128))
  report = jaxgemm.autotune(lambda *a: jaxgemm.scaled_matmul(*a), a8, b8, sa, sb,
                            backends=(kernel.backend,), cache_path=tmp_path / "c.json",
                            time_budget_s=120, iters=1, log=None)
  (problem,) = report.tuned
  assert tuning.tolerance(problem) == tuning.TOLERANCE["fp8"]
  trials = [t for t in report.trials if t.backend == kernel.backend]
  assert trials and all(t.status == "ok" and t.error < 5e-3 for t in trials), trials


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_quantize_is_the_same_in_and_outside_jit(block, rng):
  """Bit for bit: a training step quantizes inside jit, its tests outside. (Written as
  divisions, XLA turned amax / 448 into a product inside jit only: scales an ulp
  apart, different fp8 values, a reference drifting from the step by 0.9%.)"""
  x = jnp.asarray(rng.standard_normal((3, 48, 300)) * 5, jnp.float32)
  for dtype in (E4M3, E5M2):
    q, s = jaxgemm.quantize(x, dtype, block)
    qj, sj = jax.jit(lambda x: jaxgemm.quantize(x, dtype, block))(x)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(sj))
    np.testing.assert_array_equal(np.asarray(q, np.float32), np.asarray(qj, np.float32))


@pytest.mark.parametrize("block", [None, (1, 128), (128, 128)], ids=str)
def test_quantize_power_of_two_scales(block, rng):
  """scale_dtype=float8_e8m0fnu: each scale is the least power of two >= amax / max,
  so a block's largest |q| lies in [max / 2, max], and q * scale stays as close to x."""
  x = rng.standard_normal((200, 300)) * np.exp2(rng.uniform(-20, 20, size=(200, 1)))
  x = jnp.asarray(x, jnp.float32)
  fmax = float(jnp.finfo(E4M3).max)
  q, s = jax.jit(lambda x: jaxgemm.quantize(x, block=block, scale_dtype=E8M0))(x)
  _, s32 = jaxgemm.quantize(x, block=block)
  assert s.dtype == E8M0 and s.shape == s32.shape
  s64, ref = as_f64(s.astype(F32)), as_f64(s32)
  mantissa, _ = np.frexp(s64)
  assert np.all(mantissa == 0.5), "not powers of two"
  assert np.all(ref <= s64) and np.all(s64 < 2 * ref)
  amax = np.max(np.abs(as_f64(q)))
  assert fmax / 2 <= amax <= fmax
  err = np.abs(dequantized(q, s.astype(F32), block) - as_f64(x))
  scale = expand(s.astype(F32), x.shape, block)
  limit = (float(jnp.finfo(E4M3).eps) / 2 * np.abs(as_f64(x))
           + scale * float(jnp.finfo(E4M3).smallest_subnormal) / 2)
  assert np.all(err <= limit * (1 + 1e-6))
  with pytest.raises(TypeError, match="scale_dtype must be one of"):
    jaxgemm.quantize(x, scale_dtype=jnp.bfloat16)


def test_quantize_pair_is_quantize_both_ways_and_names_bad_arguments(rng):
  """The xla quantize_pair is two quantize calls (x, and x^T with its own blocks); the
  Triton kernel's bit-equality with it is tests/test_cast_transpose.py's."""
  x = jnp.asarray(rng.standard_normal((130, 260)), jnp.float32)
  q, s, qt, st = quantize_pair(x, E4M3, (1, 128), (128, 128))
  for got, want in zip((q, s, qt, st), (*jaxgemm.quantize(x, E4M3, (1, 128)),
                                        *jaxgemm.quantize(x.T, E4M3, (128, 128)))):
    np.testing.assert_array_equal(np.asarray(got, F32), np.asarray(want, F32))
  with pytest.raises(ValueError, match="backend='cuda' must be one of"):
    quantize_pair(x, E4M3, None, None, backend="cuda")
  with pytest.raises(ValueError, match=r"block_t=\(1, 64\) must be one of"):
    quantize_pair(x, E4M3, (1, 128), (1, 64))
  with pytest.raises(ValueError, match="both per tensor or both in blocks"):
    quantize_pair(x, E4M3, None, (1, 128))
  with pytest.raises(ValueError, match="2-D x"):
    quantize_pair(x[None], E4M3, None, None)


@pytest.mark.parametrize("block", [None, (1, 128), (128, 128)], ids=str)
def test_quantize_keeps_nan_in_jit(block):
  """A NaN makes its block's scale and its own q NaN, inside jit too (XLA:CPU's jitted
  max and clip drop NaNs: a NaN block got a finite scale and q = +-max before)."""
  x = jnp.ones((130, 200), jnp.float32).at[129, 150].set(jnp.nan)
  for f in (jaxgemm.quantize, jax.jit(jaxgemm.quantize, static_argnums=(1, 2))):
    q, s = f(x, E4M3, block)
    assert np.isnan(as_f64(q)[129, 150])
    nan_scales = np.isnan(as_f64(s))
    assert nan_scales.sum() == 1 and nan_scales[(..., -1, -1) if block else ()]
