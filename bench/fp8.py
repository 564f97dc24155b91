"""The fp8 suites: FP8 GEMMs with scales (`jaxgemm.scaled_matmul`, issue 28) on every backend
against XLA's program of the same scaled product, then an FP8 training step.

Each problem (`problems.Fp8Problem`: an e4m3 (or, for the per-tensor recipe's gradients,
e5m2) GEMM at one shape and layout, with per-tensor or block scales, bf16 output) runs as
the GEMM suites' problems do (`runner.run_problem`, with `SCALED_MATMUL` saying what
differs), in one process:

1. inputs: A and B normal(0, 1) in float32, quantized with `jaxgemm.quantize` as the
   problem's scaling says (one scale each; or 1x128 blocks of A along K and 128x128 blocks
   of B, as stored), the same values dequantized and rounded to bf16 (for XLA's bf16 dot
   of the same values), and b8 with its scale stored the other way ((N, K) for (K, N), and
   back: a user's choice of layout, made before the step, not timed); every function takes
   (a8, b8, a_scale, b_scale, a16, b16, b8_other, b_scale_other);
2. XLA's scaled form in the problem's layout, the program every other is timed
   interleaved with (backend `xla_dot`, as for every suite: "XLA's own op"):
   * per tensor, `ref_variant` "dot_f32*scales": `(jnp.dot(a8, b8,
     preferred_element_type=f32) * (sa * sb)).astype(bf16)`, what a user writes;
   * block, "scaled_matmul[xla]": `jaxgemm.scaled_matmul(..., backend="xla",
     variant="dot_general")`, the xla backend's sum over 128-wide K blocks of scaled fp32
     partial products in a fori_loop (XLA has no block-scaled GEMM on Hopper;
     jaxgemm/ops/scaled_matmul/xla.py);
3. XLA's other programs on the same values (backend `xla_peer`), checked and then timed
   interleaved with the reference as kernels are (`ops.scaled_matmul` says why each):
   `fp8_dot`, `lax.dot_general(a8, b8, preferred_element_type=bf16)` with no scales (the
   FP8 GEMM alone; checked against the fp32 product of the fp8 values); XLA's baselines,
   `scaled_form_other_b_layout`, the reference's program on b8_other, and with block
   scales `dequantize+bf16_dot`, `dot(dequantize(a8, sa).astype(bf16),
   dequantize(b8, sb).astype(bf16))` in one program, what a user without an FP8 kernel
   writes; `bf16_dot`, the bf16 dot of a16 and b16 (the GEMM without FP8, dequantization
   not timed);
4. every backend of op scaled_matmul (`jaxgemm.backends("scaled_matmul")`, whatever is
   registered; its best variant, or every one with `--variants all`) and the default
   (`auto`), through `jaxgemm.scaled_matmul(a8, b8, sa, sb, out_dtype=bf16, trans_a=,
   trans_b=, backend=, variant=)`: checked, then timed interleaved with the reference.

Every ratio is against the problem's strongest XLA baseline (issue 44): the fastest of the
reference and XLA's baselines, by their ratios to the reference in their own interleaved
timings. Each row after the reference's has `speedup_vs_paired`, its ratio to the
reference as timed, and `speedup_vs_xla` and `xla_time_ms` against the strongest, which
its `xla_ref` names (`_against`). The reference's row, written before the baselines are
timed, keeps its ratio to itself.

Every result is checked against the exact product of the dequantized operands, computed in
float32 at HIGHEST precision (`check_fn`; XLA's reference row's `error` is its own distance
from it), relative Frobenius error within `TOLERANCE`. TFLOP/s count 2 M K N; `pct_peak`
is against the FP8 dense peak (1979 TFLOP/s on an H100/H200; the bf16 dot's against
bf16's, 989); `min_bytes` counts the fp8 operands, the float32 scales and the bf16 output.

The suite ends with an FP8 training step (`training.GPU_FP8_MODEL`): the dense model whose
layers' GEMMs run `jaxgemm.matmul(x, w, fp8=recipe, backend=...)` for the recipes "tensor"
and "block" on each backend, against the same model's bf16 step on XLA (jnp).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemm
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem

from . import runner as R
from . import training as T
from .ops.scaled_matmul import (BF16_DOT, DEQUANT_BF16, FP8_DOT, OP, PEER, SCALED_OTHER_B,
                                Fp8Problem, baselines, ref_variant)
from .runner import SuiteOptions

OUT = jnp.bfloat16
ARITY = 8   # a8, b8, a_scale, b_scale, a16, b16, b8_other, b_scale_other

# The correctness gate, relative Frobenius error against the exact product of the
# dequantized operands: the bf16 output's rounding step, 2**-8 (each element is off by at
# most half of it, so the norm by at most 2**-9: twice that is slack), plus 2**-10 for the
# accumulation. fp32 accumulation of the exact fp8 products is about sqrt(K) * 2**-24 <=
# 2**-17 at K = 16384; Hopper's FP8 tensor cores keep about 14 bits while accumulating
# (DeepSeek-V3 report), so a kernel promoting its partial sums to fp32 every 128 of K
# stays near 2**-14, 16x below the allowance, while one that never promotes drifts to
# about 2% at K = 4096 and is rejected, as is a wrong scale (one block's scale of 128
# normal values differs from its neighbour's by ~15%). The bf16 dot of the dequantized
# values is held to it too: rounding them to bf16 costs about 2**-9 / sqrt(3) per operand.
TOLERANCE = 2.0**-8 + 2.0**-10


def _dot(bp: Fp8Problem, a, b, out, precision=None, trans_b=None):
  return lax.dot_general(a, b, bp.dimension_numbers(trans_b), precision=precision,
                         preferred_element_type=out)


def ref_fn(bp: Fp8Problem, other_b: bool = False) -> Callable:
  """XLA's scaled form: the per-tensor jnp expression, or the xla backend's block loop;
  with `other_b`, the same on b stored the other way (b8_other and its scale)."""
  trans_b = bp.trans_b != other_b

  def operands(args):
    """(a8, b8, a_scale, b_scale), b as this program stores it."""
    a8, b8, sa, sb = args[:4]
    return (a8, args[6], sa, args[7]) if other_b else (a8, b8, sa, sb)

  if bp.scaling == "tensor":
    def xla_scaled(*args):
      a8, b8, sa, sb = operands(args)
      return (_dot(bp, a8, b8, jnp.float32, trans_b=trans_b) * (sa * sb)).astype(OUT)
    return xla_scaled

  def xla_block_scaled(*args):
    a8, b8, sa, sb = operands(args)
    return jaxgemm.scaled_matmul(a8, b8, sa, sb, out_dtype=OUT, trans_a=bp.trans_a,
                                 trans_b=trans_b, backend="xla", variant="dot_general")
  return xla_block_scaled


def kernel_fn(bp: Fp8Problem, backend: str, variant: str | None) -> Callable:
  """jaxgemm.scaled_matmul on (backend, variant); AUTO and "(default)": variant=None."""
  v = None if backend == R.AUTO or variant in (R.AUTO_VARIANT, R.DEFAULT_VARIANT) else variant

  def scaled(a8, b8, sa, sb, *_):
    return jaxgemm.scaled_matmul(a8, b8, sa, sb, out_dtype=OUT, trans_a=bp.trans_a,
                                 trans_b=bp.trans_b, backend=backend, variant=v)
  return scaled


def peer_fn(bp: Fp8Problem, variant: str) -> Callable:
  """XLA's program `variant` of the problem (PEER's; module docstring)."""
  if variant == FP8_DOT:
    def fp8_dot(a8, b8, *_):
      return _dot(bp, a8, b8, OUT)
    return fp8_dot
  if variant == SCALED_OTHER_B:
    return ref_fn(bp, other_b=True)
  if variant == DEQUANT_BF16:
    def dequantize_bf16_dot(a8, b8, sa, sb, *_):
      a16 = dequantize(a8, sa, bp.a_block()).astype(OUT)
      b16 = dequantize(b8, sb, bp.b_block()).astype(OUT)
      return _dot(bp, a16, b16, OUT)
    return dequantize_bf16_dot
  if variant == BF16_DOT:
    def bf16_dot(*args):
      return _dot(bp, args[4], args[5], OUT)
    return bf16_dot
  raise ValueError(f"unknown {PEER} variant={variant!r}")


def dequantize(q, scale, block):
  """q * scale in float32, each scale repeated over its block (quantize's inverse)."""
  q = q.astype(jnp.float32)
  if block is None:
    return q * scale
  rows, cols = q.shape
  full = jnp.repeat(jnp.repeat(scale, block[0], axis=0), block[1], axis=1)
  return q * full[:rows, :cols]


def exact_fn(bp: Fp8Problem, scaled: bool = True) -> Callable:
  """The exact product of the dequantized operands (fp32, HIGHEST; unrounded), or with
  `scaled=False` of the fp8 values themselves (the fp8 dot's check)."""
  def exact(a8, b8, sa, sb, *_):
    if scaled:
      a, b = dequantize(a8, sa, bp.a_block()), dequantize(b8, sb, bp.b_block())
    else:
      a, b = a8.astype(jnp.float32), b8.astype(jnp.float32)
    return _dot(bp, a, b, jnp.float32, lax.Precision.HIGHEST)
  return exact


def make_inputs(bp: Fp8Problem, n_rot: int, seed: int) -> list:
  """`n_rot` sets of (a8, b8, a_scale, b_scale, a16, b16, b8_other, b_scale_other):
  normal(0, 1) drawn in float32 on the device, quantized as the problem says, the
  dequantized values in bf16, and b8 and its scale transposed (b stored the other way:
  the same fp8 values and scales quantize gives the transposed array)."""
  def one(key):
    x = jax.random.normal(jax.random.fold_in(key, 0), bp.a_shape(), jnp.float32)
    w = jax.random.normal(jax.random.fold_in(key, 1), bp.b_shape(), jnp.float32)
    a8, sa = jaxgemm.quantize(x, jnp.dtype(bp.a_dtype), bp.a_block())
    b8, sb = jaxgemm.quantize(w, jnp.dtype(bp.b_dtype), bp.b_block())
    return [a8, b8, sa, sb]

  # The dequantized values come from the fp8 arrays in a jit of their own: inside the
  # quantizing jit, XLA's GPU compiler dropped the f32 -> fp8 -> f32 convert pair
  # (excess precision), so "dequantized" x was x itself (the H100 run of
  # 2026-11-25: the bf16 dot 0.0376 off the dequantized product, e4m3's rounding).
  @jax.jit
  def dequantized(a8, b8, sa, sb):
    return [dequantize(a8, sa, bp.a_block()).astype(OUT),
            dequantize(b8, sb, bp.b_block()).astype(OUT), b8.T, sb.T]

  @jax.jit
  def gen(key):
    return [one(jax.random.fold_in(key, i)) for i in range(n_rot)]

  sets = jax.block_until_ready(gen(jax.random.key(seed)))
  return jax.block_until_ready([x for one_set in sets
                                for x in (*one_set, *dequantized(*one_set))])


def scaled_problem(bp: Fp8Problem) -> ScaledMatmulProblem:
  """The canonical problem `jaxgemm.scaled_matmul` makes of `bp` (what dispatch chooses for)."""
  return ScaledMatmulProblem(1, bp.m, bp.n, bp.k, jnp.dtype(bp.a_dtype), jnp.dtype(OUT),
                             np.dtype(np.float32), bp.trans_a, bp.trans_b, None,
                             b_dtype=jnp.dtype(bp.b_dtype), scale_kind=bp.scaling)


class ScaledMatmulMeasured(R.Measured):
  """What the fp8 suites measure differently from the GEMM suites (`runner.Measured`)."""

  op = OP
  arity = ARITY

  def ref_variant(self, bp):
    return ref_variant(bp)

  def ref_fn(self, bp, dtype_name):
    return ref_fn(bp)

  def kernel_fn(self, bp, dtype_name, backend, variant):
    return kernel_fn(bp, backend, variant)

  def inputs(self, bp, dtype_name, n_rot, seed):
    return make_inputs(bp, n_rot, seed)

  def problem(self, bp, dtype_name):
    return scaled_problem(bp)

  def tolerance(self, bp, dtype_name):
    return TOLERANCE

  def check_fn(self, bp, dtype_name):
    return exact_fn(bp)

  def before_kernels(self, ctx, bp, dtype_name, bufs, refs, ref_compiled, n_rot,
                     solo_ref_ms=None):
    """XLA's other programs (`PEERS`; the fp8 dot checked against the fp32 product of the
    fp8 values, the others as the kernels are), each timed against the reference: rows
    of backend `xla_peer`. Then every peer's ratios against the strongest baseline, and
    the function that puts each kernel row's there too (`_against`)."""
    rows = []
    unscaled = None
    for variant in PEERS:
      if variant in (SCALED_OTHER_B, DEQUANT_BF16) and variant not in baselines(bp):
        continue
      row = R.base_row(ctx, bp.suite, "gemm", PEER, variant, bp, dtype_name)
      row.update(rotate=n_rot, tolerance=TOLERANCE)
      if variant == SCALED_OTHER_B:   # b as this row stores it
        row["layout"] = bp.layout[0] + ("N" if bp.trans_b else "T")
      rows.append(row)
      if R.excluded(ctx.exclude, PEER, variant, bp.name):
        row.update(status=R.STATUS_SKIPPED, note="excluded by --exclude")
        continue
      try:
        if variant == FP8_DOT:
          unscaled = R._compile_and_run(exact_fn(bp, scaled=False), bufs, n_rot, ARITY)[1]
      except Exception as e:  # noqa: BLE001 (record and go on)
        row.update(status=R.STATUS_ERROR, note=f"its check: {R.short_error(e)}")
        continue
      with R.Watchdog(ctx, row, f"{PEER}/{variant} on {bp.name}"):
        R._run_kernel(ctx, bp, dtype_name, row, lambda *_, v=variant: peer_fn(bp, v), bufs,
                      unscaled if variant == FP8_DOT else refs, n_rot, ref_compiled,
                      (PEER, variant), ARITY, solo_ref_ms, tol=TOLERANCE)
      if variant == BF16_DOT:   # a bf16 GEMM: its fraction of bf16's peak, not FP8's
        peak = R.peak_tflops(ctx.device_kind, "bf16") if ctx.on_gpu else None
        row["peak_tflops"] = peak or ""
        if peak and row.get("tflops"):
          row["pct_peak"] = 100 * row["tflops"] / peak
    against = _against(*strongest_of(bp, rows))
    for row in rows:
      against(row)
    return rows, against


# XLA's other programs, in the order they run (module docstring).
PEERS = (FP8_DOT, SCALED_OTHER_B, DEQUANT_BF16, BF16_DOT)


def strongest_of(bp, peer_rows: list[dict], *, ref: str | None = None,
                 names: tuple[str, ...] | None = None) -> tuple[str, float]:
  """(variant, its speedup over the reference) of the problem's strongest XLA baseline:
  the reference itself (1.0) or the fastest correct baseline peer, by the ratio each
  read against it, interleaved. `ref` and `names` (the reference's variant and the
  baselines' among the peers) default to an fp8 problem's; the fp8-moe suites
  (bench/fp8_moe.py) name theirs."""
  best, factor = ref or ref_variant(bp), 1.0
  names = baselines(bp) if names is None else names
  for r in peer_rows:
    s = r.get("speedup_vs_xla")
    if r["variant"] in names and r.get("status") == R.STATUS_OK and s and s > factor:
      best, factor = r["variant"], s
  return best, factor


def _against(best: str, factor: float) -> Callable[[dict], None]:
  """A function that puts a row's ratio against the strongest baseline, `best`, whose
  speedup over the reference is `factor`: the paired ratio kept as `speedup_vs_paired`,
  `speedup_vs_xla` and `xla_time_ms` divided by `factor`, `xla_ref` naming `best`."""
  def against(row: dict) -> None:
    row["xla_ref"] = best
    s = row.get("speedup_vs_xla")
    if s in (None, ""):
      return
    row.update(speedup_vs_paired=s, speedup_vs_xla=s / factor,
               xla_time_ms=row["xla_time_ms"] / factor)
  return against


SCALED_MATMUL = ScaledMatmulMeasured()


def run_fp8_suite(ctx: R.Context, suite: str, probs: list[Fp8Problem], backends: list[str],
                  variants_policy, *, training_cfg=None, quick: bool = False,
                  training: bool = True) -> list[dict]:
  """The suite's FP8 GEMMs, then (with `training`) its FP8 training step
  (`training.run_suite_then_training`: under a time budget the problems leave
  `training.TRAINING_RESERVE_S` of it to the step)."""
  model = (training_cfg or T.fp8_model(ctx.on_gpu, quick)) if training else None
  return T.run_suite_then_training(ctx, suite, probs, backends, variants_policy,
                                   ops=SCALED_MATMUL, model=model, label="FP8")


def run_suite(ctx: R.Context, suite: str, probs: list[Fp8Problem], backends: list[str],
              variants_policy, options: SuiteOptions) -> list[dict]:
  """An fp8 suite (bench/ops/scaled_matmul.py): its FP8 GEMMs, then its FP8 step (unless
  --only names other problems only, as for the moe suites)."""
  cfg = T.model_for(T.fp8_model(ctx.on_gpu, options.quick), options)
  return run_fp8_suite(ctx, suite, probs, backends, variants_policy, training_cfg=cfg,
                       quick=options.quick, training=options.runs(cfg.name))
