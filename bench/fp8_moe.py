"""The fp8-moe suites: FP8 grouped GEMMs with scales (`jaxgemm.scaled_ragged_dot`, issue 45)
on every backend against XLA's bf16 grouped GEMM and jaxgemm's own, then an FP8 MoE
training step.

Each problem (`ops.scaled_ragged_dot.Fp8MoeProblem`) runs as the moe suites' problems do
(`runner.run_problem`, with `SCALED_RAGGED_DOT` saying what differs: a subclass of
`moe.RaggedDotMeasured`, whose group sizes, `active_groups` and unpaired slow reference it
keeps), in one process. A problem has one of two modes: "fwd", the contiguous grouped GEMM
(tokens (M, K) times each expert's (K, N), out (M, N)), and "wgrad", the ragged-K form, the
weight gradient (tokens (M, K) and dY (M, N), out (G, K, N): per group x[rows g]^T @
dy[rows g]; `ragged_dot_dimension_numbers=RAGGED_K_NUMBERS`). The functions below branch on
it where the programs differ (`grouped_gemm`, `dimension_numbers`,
`exact_fn`, `dequantize_rhs`); the names and shapes are the problem's.

1. the group sizes: the moe suites' (`moe.group_sizes`: a Dirichlet(2) split of M with the
   run's seed, or the problem's fixed sizes);
2. inputs: lhs (M, K) and rhs ((G, K, N) experts, or wgrad's (M, N) dY) normal(0, 1) in
   float32, quantized to e4m3 with `jaxgemm.quantize` as the problem says (one scale each;
   or block scales: fwd, 1x128 blocks of lhs and 128x128 blocks of each expert; wgrad,
   128x1 blocks of both along the contracted M, `quantize(x, block=(128, 1))`), and the
   same values dequantized and rounded to bf16; every function takes (lhs8, rhs8,
   group_sizes, lhs_scale, rhs_scale, lhs16, rhs16);
3. XLA's reference (backend `xla_dot`, variant `Fp8MoeProblem.ref_variant`): its grouped
   GEMM in bf16 on the dequantized operands (their dequantization not timed),
   `lax.ragged_dot` (fwd) or `lax.ragged_dot_general` with the ragged-K numbers (wgrad),
   the strongest grouped GEMM a JAX user has on Hopper without an FP8 kernel;
4. the peers (`Fp8MoeProblem.peers`), checked and then timed interleaved with the
   reference as kernels are: XLA's other baseline, the fp8 operands dequantized in the
   program followed by the same XLA grouped GEMM (`dequantize+lax.ragged_dot`,
   `dequantize+lax.ragged_dot_general`), and jaxgemm's bf16 grouped GEMM (backend="auto")
   on the dequantized operands (`jaxgemm.ragged_dot`; wgrad `jaxgemm.ragged_dot_general`);
5. every backend of op scaled_ragged_dot (its best variant, or every one with `--variants
   all`) and the default (`auto`), through `jaxgemm.scaled_ragged_dot(lhs8, rhs8,
   group_sizes, lhs_scale, rhs_scale, out_dtype=bf16, ragged_dot_dimension_numbers=None or
   RAGGED_K_NUMBERS, backend=, variant=)`: checked, then timed interleaved with the
   reference.

Every ratio is against the faster of XLA's two baselines (`fp8.strongest_of`, `fp8._against`,
as the fp8 suites compare with theirs): `speedup_vs_xla` and `xla_time_ms` against it,
`speedup_vs_paired` against the reference as timed, `xla_ref` naming it; each kernel row's
`speedup_vs_bf16` is our bf16 grouped GEMM's time over its own (both read against the
reference they were paired with), `bf16_time_ms` that time.

Every result is checked against the exact product of the dequantized operands (fp32,
HIGHEST; `exact_fn`: one dot per group, so rows past sum(group_sizes) are zeros in fwd and
add nothing in wgrad) within the fp8 suites' `fp8.TOLERANCE`. TFLOP/s count 2 M K N;
`min_bytes` (and so the roofline fraction `pct_copy_bw`) counts the fp8 operands (fwd: the
weights of the experts with tokens only), the fp32 scales and the bf16 output (wgrad: every
group's (K, N) block).

The suite ends with an FP8 MoE training step (`training.fp8_moe_model`: the moe suites'
model with `fp8=True`): on each backend its bf16 step (variant "(default)") and its FP8
steps (`jaxgemm.ragged_dot(x, w, gs, fp8=recipe)`, variant "fp8=<recipe>"), each against
XLA's bf16 step (`lax.ragged_dot`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemm
from jaxgemm.ops.scaled_ragged_dot.api import RAGGED_K_NUMBERS
from jaxgemm.ops.scaled_ragged_dot.problem import ScaledRaggedDotProblem

from . import fp8 as F
from . import runner as R
from . import training as T
from .moe import RaggedDotMeasured
from .ops.scaled_ragged_dot import OP, Fp8MoeProblem
from .runner import SuiteOptions

OUT = jnp.bfloat16
ARITY = 7   # lhs8, rhs8, group_sizes, lhs_scale, rhs_scale, lhs16, rhs16


def dequantize_lhs(q, scale, bp: Fp8MoeProblem):
  """lhs8 * its scale in float32 (`fp8.dequantize`, quantize's inverse)."""
  return F.dequantize(q, scale, bp.a_block())


def dequantize_rhs(q, scale, bp: Fp8MoeProblem):
  """rhs8 * its scale in float32: one scale; fwd, each expert's 128x128 blocks of (G, K,
  N); wgrad, dY (M, N)'s 128x1 blocks."""
  block = bp.b_block()
  if block is None or bp.wgrad:
    return F.dequantize(q, scale, block)
  return jax.vmap(lambda w, s: F.dequantize(w, s, block))(q, scale)


def dimension_numbers(bp: Fp8MoeProblem) -> lax.RaggedDotDimensionNumbers | None:
  """The call's `ragged_dot_dimension_numbers`: None (lax.ragged_dot's) for fwd,
  RAGGED_K_NUMBERS for wgrad."""
  return RAGGED_K_NUMBERS if bp.wgrad else None


def grouped_gemm(bp: Fp8MoeProblem, lib) -> Callable:
  """The bf16 grouped GEMM of the problem's mode from `lib` (`lax`: XLA's; `jaxgemm`: ours,
  its default backend="auto"), (lhs16, rhs16, gs) -> out: `ragged_dot` (fwd),
  `ragged_dot_general` with the ragged-K numbers (wgrad)."""
  if bp.wgrad:
    return lambda lhs, rhs, gs: lib.ragged_dot_general(lhs, rhs, gs, RAGGED_K_NUMBERS,
                                                       preferred_element_type=OUT)
  return lambda lhs, rhs, gs: lib.ragged_dot(lhs, rhs, gs, preferred_element_type=OUT)


def ref_fn(bp: Fp8MoeProblem) -> Callable:
  """XLA's reference (`bp.ref_variant`): its grouped GEMM (`grouped_gemm(bp, lax)`) in bf16 on the
  operands dequantized beforehand."""
  grouped = grouped_gemm(bp, lax)

  def xla_ragged_dot_bf16(l8, r8, gs, sl, sr, l16, r16):
    return grouped(l16, r16, gs)
  return xla_ragged_dot_bf16


def peer_fn(bp: Fp8MoeProblem, variant: str) -> Callable:
  """A peer's program (`bp.peers`; module docstring, 4)."""
  (_, dequant), (_, bf16) = bp.peers
  if variant == dequant:
    grouped = grouped_gemm(bp, lax)

    def dequantize_ragged_dot(l8, r8, gs, sl, sr, *_):
      return grouped(dequantize_lhs(l8, sl, bp).astype(OUT),
                     dequantize_rhs(r8, sr, bp).astype(OUT), gs)
    return dequantize_ragged_dot
  if variant == bf16:
    grouped = grouped_gemm(bp, jaxgemm)

    def jaxgemm_ragged_dot_bf16(l8, r8, gs, sl, sr, l16, r16):
      return grouped(l16, r16, gs)
    return jaxgemm_ragged_dot_bf16
  raise ValueError(f"unknown peer variant={variant!r} of {bp.name}; valid: "
                   f"{[v for _, v in bp.peers]}")


def kernel_fn(bp: Fp8MoeProblem, backend: str, variant: str | None) -> Callable:
  """jaxgemm.scaled_ragged_dot on (backend, variant), in the problem's form (wgrad:
  ragged_dot_dimension_numbers=RAGGED_K_NUMBERS); AUTO: as a user calls it."""
  v = None if backend == R.AUTO or variant in (R.AUTO_VARIANT, R.DEFAULT_VARIANT) else variant
  numbers = dimension_numbers(bp)

  def scaled_grouped(l8, r8, gs, sl, sr, *_):
    return jaxgemm.scaled_ragged_dot(l8, r8, gs, sl, sr, out_dtype=OUT,
                                     ragged_dot_dimension_numbers=numbers, backend=backend,
                                     variant=v)
  return scaled_grouped


def exact_fn(bp: Fp8MoeProblem) -> Callable:
  """The exact product of the dequantized operands (fp32, HIGHEST): one dense dot per group
  over the rows the problem's group sizes (drawn on the host, the same as the group_sizes
  operand) give it. fwd: each expert with tokens its rows times its weights, rows past the
  groups zeros (as lax.ragged_dot leaves them); wgrad: each group x[rows g]^T @ dy[rows g],
  an empty group's zeros, rows past the groups in no dot. Not XLA's grouped GEMM: the check
  stays apart from the reference it checks, and clear of XLA's grouped GEMM's memory on a
  GPU, in float32 here (its bf16 program of 128 experts and 65536 rows did not fit in an
  H100's: d591a99)."""
  if bp.group_sizes is None:
    raise ValueError(f"{bp.name}: exact_fn needs the problem's group sizes "
                     "(SCALED_RAGGED_DOT.prepare draws them)")

  def exact(l8, r8, gs, sl, sr, *_):
    lhs, rhs = dequantize_lhs(l8, sl, bp), dequantize_rhs(r8, sr, bp)
    parts, start = [], 0
    if bp.wgrad:
      for size in bp.group_sizes:
        parts.append(jnp.dot(lhs[start:start + size].T, rhs[start:start + size],
                             precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
                     if size else jnp.zeros((bp.k, bp.n), jnp.float32))
        start += size
      return jnp.stack(parts)
    for g, size in enumerate(bp.group_sizes):
      if size:
        parts.append(jnp.dot(lhs[start:start + size], rhs[g], precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32))
        start += size
    if start < bp.m:
      parts.append(jnp.zeros((bp.m - start, bp.n), jnp.float32))
    return jnp.concatenate(parts)
  return exact


def make_inputs(bp: Fp8MoeProblem, n_rot: int, seed: int) -> list:
  """`n_rot` sets of (lhs8, rhs8, group_sizes, lhs_scale, rhs_scale, lhs16, rhs16)."""
  def one(key):
    x = jax.random.normal(jax.random.fold_in(key, 0), bp.lhs_shape(), jnp.float32)
    w = jax.random.normal(jax.random.fold_in(key, 1), bp.rhs_shape(), jnp.float32)
    l8, sl = jaxgemm.quantize(x, jnp.dtype(bp.a_dtype), bp.a_block())
    r8, sr = jaxgemm.quantize(w, jnp.dtype(bp.b_dtype), bp.b_block())
    return [l8, r8, sl, sr]

  # In a jit of their own, as fp8.make_inputs says why (XLA drops an f32 -> fp8 -> f32
  # convert pair inside the quantizing jit).
  @jax.jit
  def dequantized(l8, r8, sl, sr):
    return [dequantize_lhs(l8, sl, bp).astype(OUT), dequantize_rhs(r8, sr, bp).astype(OUT)]

  @jax.jit
  def gen(key):
    return [one(jax.random.fold_in(key, i)) for i in range(n_rot)]

  gs = jax.device_put(np.asarray(bp.group_sizes, np.int32))
  sets = jax.block_until_ready(gen(jax.random.key(seed)))
  out = []
  for l8, r8, sl, sr in sets:
    out += [l8, r8, gs, sl, sr, *dequantized(l8, r8, sl, sr)]
  return jax.block_until_ready(out)


def scaled_problem(bp: Fp8MoeProblem) -> ScaledRaggedDotProblem:
  """The canonical problem `jaxgemm.scaled_ragged_dot` makes of `bp` (wgrad: its ragged-K
  form, `ragged_contracting`)."""
  return ScaledRaggedDotProblem(1, bp.groups, bp.m, bp.k, bp.n, np.dtype(jnp.dtype(bp.a_dtype)),
                                np.dtype(OUT), np.dtype(jnp.dtype(bp.b_dtype)),
                                scale_kind=bp.scaling, ragged_contracting=bp.wgrad)


class ScaledRaggedDotMeasured(RaggedDotMeasured):
  """What the fp8-moe suites measure differently from the moe suites."""

  op = OP
  arity = ARITY

  def ref_variant(self, bp):
    return bp.ref_variant

  def ref_fn(self, bp, dtype_name):
    return ref_fn(bp)

  def kernel_fn(self, bp, dtype_name, backend, variant):
    return kernel_fn(bp, backend, variant)

  def inputs(self, bp, dtype_name, n_rot, seed):
    return make_inputs(bp, n_rot, seed)

  def problem(self, bp, dtype_name):
    return scaled_problem(bp)

  def tolerance(self, bp, dtype_name):
    return F.TOLERANCE

  def check_fn(self, bp, dtype_name):
    return exact_fn(bp)

  def before_kernels(self, ctx, bp, dtype_name, bufs, refs, ref_compiled, n_rot,
                     solo_ref_ms=None):
    """The peers (`bp.peers`), each checked and timed against the reference; then every
    row's ratios against the faster XLA baseline, and each kernel row's against our bf16."""
    rows = []
    for backend, variant in bp.peers:
      row = R.base_row(ctx, bp.suite, "gemm", backend, variant, bp, dtype_name)
      row.update(rotate=n_rot, tolerance=F.TOLERANCE)
      rows.append(row)
      if R.excluded(ctx.exclude, backend, variant, bp.name):
        row.update(status=R.STATUS_SKIPPED, note="excluded by --exclude")
        continue
      with R.Watchdog(ctx, row, f"{backend}/{variant} on {bp.name}"):
        R._run_kernel(ctx, bp, dtype_name, row, lambda *_, v=variant: peer_fn(bp, v), bufs,
                      refs, n_rot, ref_compiled, (backend, variant), ARITY, solo_ref_ms,
                      tol=F.TOLERANCE)
    against = F._against(*F.strongest_of(bp, rows, ref=bp.ref_variant, names=bp.baselines))
    for row in rows:
      against(row)
    bf16 = rows[-1]
    bf16_paired = bf16.get("speedup_vs_paired") if bf16["status"] == R.STATUS_OK else None

    def finish(row):
      against(row)
      s = row.get("speedup_vs_paired")
      if bf16_paired and row.get("status") == R.STATUS_OK and s:
        row.update(bf16_time_ms=bf16["time_ms_median"], speedup_vs_bf16=s / bf16_paired)
    return rows, finish


SCALED_RAGGED_DOT = ScaledRaggedDotMeasured()


def run_suite(ctx: R.Context, suite: str, probs: list[Fp8MoeProblem], backends: list[str],
              variants_policy, options: SuiteOptions) -> list[dict]:
  """An fp8-moe suite (bench/ops/scaled_ragged_dot.py): its FP8 grouped GEMMs, then its
  FP8 MoE step (unless --only names other problems only, as for the moe suites)."""
  cfg = T.model_for(T.fp8_moe_model(ctx.on_gpu, options.quick), options)
  return T.run_suite_then_training(ctx, suite, probs, backends, variants_policy,
                                   ops=SCALED_RAGGED_DOT,
                                   model=cfg if options.runs(cfg.name) else None,
                                   label="FP8 MoE")
