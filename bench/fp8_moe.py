"""The fp8-moe suites: FP8 grouped GEMMs with scales (`jaxgemm.scaled_ragged_dot`, issue 45)
on every backend against XLA's bf16 grouped GEMM and jaxgemm's own, then an FP8 MoE
training step.

Each problem (`ops.scaled_ragged_dot.Fp8MoeProblem`) runs as the moe suites' problems do
(`runner.run_problem`, with `SCALED_RAGGED_DOT` saying what differs: a subclass of
`moe.RaggedDotMeasured`, whose group sizes, `active_groups` and unpaired slow reference it
keeps), in one process:

1. the group sizes: the moe suites' (`moe.group_sizes`: a Dirichlet(2) split of M with the
   run's seed, or the problem's fixed sizes);
2. inputs: lhs (M, K) and rhs (G, K, N) normal(0, 1) in float32, quantized to e4m3 with
   `jaxgemm.quantize` as the problem says (one scale each; or 1x128 blocks of lhs and
   128x128 blocks of each expert), and the same values dequantized and rounded to bf16;
   every function takes (lhs8, rhs8, group_sizes, lhs_scale, rhs_scale, lhs16, rhs16);
3. XLA's reference (backend `xla_dot`): `lax.ragged_dot` in bf16 on the dequantized
   operands (their dequantization not timed), the strongest grouped GEMM a JAX user has on
   Hopper without an FP8 kernel;
4. the peers, checked and then timed interleaved with the reference as kernels are: XLA's
   other baseline `dequantize+lax.ragged_dot` (the fp8 operands dequantized in the program),
   and jaxgemm's bf16 `jaxgemm.ragged_dot` (backend="auto") on the dequantized operands;
5. every backend of op scaled_ragged_dot (its best variant, or every one with `--variants
   all`) and the default (`auto`), through `jaxgemm.scaled_ragged_dot(lhs8, rhs8,
   group_sizes, lhs_scale, rhs_scale, out_dtype=bf16, backend=, variant=)`: checked, then
   timed interleaved with the reference.

Every ratio is against the faster of XLA's two baselines (`fp8.strongest_of`, `fp8._against`,
as the fp8 suites compare with theirs): `speedup_vs_xla` and `xla_time_ms` against it,
`speedup_vs_paired` against the reference as timed, `xla_ref` naming it; each kernel row's
`speedup_vs_bf16` is our bf16 grouped GEMM's time over its own (both read against the
reference they were paired with), `bf16_time_ms` that time.

Every result is checked against the exact product of the dequantized operands (fp32,
HIGHEST; `exact_fn`) within the fp8 suites' `fp8.TOLERANCE`. TFLOP/s count 2 M K N;
`min_bytes` (and so the roofline fraction `pct_copy_bw`) counts the fp8 lhs, the fp8
weights of the experts with tokens, the fp32 scales and the bf16 output.

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
from jaxgemm.ops.scaled_ragged_dot.problem import ScaledRaggedDotProblem

from . import fp8 as F
from . import runner as R
from . import training as T
from .moe import RaggedDotMeasured
from .ops.scaled_ragged_dot import (BASELINES, BF16_PEER, BF16_RAGGED, DEQUANT_RAGGED, OP,
                                    REF_VARIANT, XLA_PEER, Fp8MoeProblem)
from .runner import SuiteOptions

OUT = jnp.bfloat16
ARITY = 7   # lhs8, rhs8, group_sizes, lhs_scale, rhs_scale, lhs16, rhs16
# The peers, in the order they run: (backend, variant).
PEERS = ((XLA_PEER, DEQUANT_RAGGED), (BF16_PEER, BF16_RAGGED))


def dequantize_lhs(q, scale, bp: Fp8MoeProblem):
  """lhs8 * its scale in float32 (`fp8.dequantize`, quantize's inverse)."""
  return F.dequantize(q, scale, bp.a_block())


def dequantize_rhs(q, scale, bp: Fp8MoeProblem):
  """rhs8 (G, K, N) * its scale in float32: one scale, or each expert's 128x128 blocks."""
  block = bp.b_block()
  if block is None:
    return F.dequantize(q, scale, None)
  return jax.vmap(lambda w, s: F.dequantize(w, s, block))(q, scale)


def ref_fn(bp: Fp8MoeProblem) -> Callable:
  """XLA's reference: lax.ragged_dot in bf16 on the operands dequantized beforehand."""
  def xla_ragged_dot_bf16(l8, r8, gs, sl, sr, l16, r16):
    return lax.ragged_dot(l16, r16, gs, preferred_element_type=OUT)
  return xla_ragged_dot_bf16


def peer_fn(bp: Fp8MoeProblem, variant: str) -> Callable:
  """A peer's program (module docstring, 4)."""
  if variant == DEQUANT_RAGGED:
    def dequantize_ragged_dot(l8, r8, gs, sl, sr, *_):
      return lax.ragged_dot(dequantize_lhs(l8, sl, bp).astype(OUT),
                            dequantize_rhs(r8, sr, bp).astype(OUT), gs,
                            preferred_element_type=OUT)
    return dequantize_ragged_dot
  if variant == BF16_RAGGED:
    def jaxgemm_ragged_dot_bf16(l8, r8, gs, sl, sr, l16, r16):
      return jaxgemm.ragged_dot(l16, r16, gs, preferred_element_type=OUT)
    return jaxgemm_ragged_dot_bf16
  raise ValueError(f"unknown peer variant={variant!r}; valid: {[v for _, v in PEERS]}")


def kernel_fn(bp: Fp8MoeProblem, backend: str, variant: str | None) -> Callable:
  """jaxgemm.scaled_ragged_dot on (backend, variant); AUTO: as a user calls it."""
  v = None if backend == R.AUTO or variant in (R.AUTO_VARIANT, R.DEFAULT_VARIANT) else variant

  def scaled_grouped(l8, r8, gs, sl, sr, *_):
    return jaxgemm.scaled_ragged_dot(l8, r8, gs, sl, sr, out_dtype=OUT, backend=backend,
                                     variant=v)
  return scaled_grouped


def exact_fn(bp: Fp8MoeProblem) -> Callable:
  """The exact product of the dequantized operands (fp32, HIGHEST; rows past the groups
  zeros, as lax.ragged_dot leaves them): one dense dot per expert with tokens, over the
  rows the problem's group sizes (drawn on the host, the same as the group_sizes operand)
  give it. Not lax.ragged_dot: the check stays apart from the reference it checks, and
  clear of XLA's grouped GEMM's memory on a GPU, in float32 here (its bf16 program of 128
  experts and 65536 rows did not fit in an H100's: d591a99)."""
  if bp.group_sizes is None:
    raise ValueError(f"{bp.name}: exact_fn needs the problem's group sizes "
                     "(SCALED_RAGGED_DOT.prepare draws them)")

  def exact(l8, r8, gs, sl, sr, *_):
    lhs, rhs = dequantize_lhs(l8, sl, bp), dequantize_rhs(r8, sr, bp)
    parts, start = [], 0
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
  """The canonical problem `jaxgemm.scaled_ragged_dot` makes of `bp`."""
  return ScaledRaggedDotProblem(1, bp.groups, bp.m, bp.k, bp.n, np.dtype(jnp.dtype(bp.a_dtype)),
                                np.dtype(OUT), np.dtype(jnp.dtype(bp.b_dtype)),
                                scale_kind=bp.scaling)


class ScaledRaggedDotMeasured(RaggedDotMeasured):
  """What the fp8-moe suites measure differently from the moe suites."""

  op = OP
  arity = ARITY

  def ref_variant(self, bp):
    return REF_VARIANT

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
    """The peers (`PEERS`), each checked and timed against the reference; then every row's
    ratios against the faster XLA baseline, and each kernel row's against our bf16."""
    rows = []
    for backend, variant in PEERS:
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
    against = F._against(*F.strongest_of(bp, rows, ref=REF_VARIANT, names=BASELINES))
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
