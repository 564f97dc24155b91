"""The held-out suites: fresh random problems of every op, `auto` against XLA (issue 44).

    python -m bench --suite heldout --backends auto           # a new draw: its seed is printed
    python -m bench --suite heldout --backends auto --seed S  # the same problems again
    python -m bench --suite heldout-tiny --backends auto      # without a GPU: a handful, tiny

Every run draws its problems at run time from one seed: the run's `--seed`, or, where
none was given (the default 0), a seed from the clock, printed at the start and recorded
in every row's `seed` column. So no problem of a run was known when `auto`'s rules and
tables were made: the set is held out by construction, and `--seed S` replays it (the
same problems and the same inputs: the inputs are drawn from the same seed).

Per group (`GROUPS`, `PER_GROUP` problems each; `--quick` fewer), each size log-uniform in
the suite's range (`Sizes`), then rounded up to a multiple drawn from `Sizes.aligns`
(1: as drawn), redrawn until the problem's FLOPs and bytes are under the group's caps
(a problem's XLA program runs in well under 50 ms on an H100):

* `matmul`: `jaxgemm.matmul` / `dot_general`, bf16, fp16 or fp32 (default precision: TF32
  on a GPU), each operand transposed or not, a third of them batched (2..64);
* `matmul+bwd`: `y, vjp = jax.vjp(jaxgemm.matmul, x, w)`, `(y, *vjp(dy))`: the forward GEMM
  and both of its gradients (NT and TN), against jnp's program under the same `jax.vjp`;
* `fused_matmul`, `fused_matmul+bwd`: `act(x @ w + b)` with an activation drawn from
  jaxgemm's (`jaxgemm.ops.activations.ACTIVATIONS`), forward, and forward + backward;
* `glu`: `act(x @ wg) * (x @ wu)`, the activation drawn;
* `ragged_dot`: G in [4, 256] experts (log-uniform), a routing of the M rows to them drawn
  from a Dirichlet of a random concentration (0.1: a few experts take most rows, some
  none; 10: even), one of the three calls (forward, dgrad, wgrad);
* `scaled_matmul`: FP8 (e4m3; the gradient e5m2 per tensor, as the recipes have it), per
  tensor or block scales, forward (NN), dgrad (NT) or wgrad (TN).

Each problem runs as its op's suite runs it (`runner.run_problem` with the op's
`runner.Measured`: the matmul, moe, epilogue or fp8 suites'), so XLA's program is the same
expression and the timing the same (CUPTI, paired with XLA's: `speedup_vs_xla`). The
kernels are `auto` and, where `--backends` names them, each backend with its own choice
(variant=None): the suite asks what a user gets on problems nobody tuned for. The report's
"Held-out problems" section (bench/ops/heldout.py) has, per group, the geomean, the worst
and the count below 0.97x, with the card named.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from jaxgemm.ops.activations import ACTIVATIONS

from . import runner as R
from .ops.fused_matmul import EpilogueProblem, Expression
from .ops.heldout import GROUPS, PER_GROUP, SUITES, TINY
from .ops.ragged_dot import MoeProblem
from .ops.scaled_matmul import Fp8Problem
from .problems import BenchProblem
from .runner import SuiteOptions

DTYPES = ("bf16", "fp16", "fp32")
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


@dataclasses.dataclass(frozen=True)
class Sizes:
  """How big a suite's problems are drawn."""

  lo: int                       # M, N and K each log-uniform in [lo, hi]
  hi: int
  groups: tuple[int, int]       # ragged_dot's G, log-uniform in this range
  batch_hi: int                 # a batched matmul's batch, log-uniform in [2, batch_hi]
  aligns: tuple[int, ...]       # each size is rounded up to a multiple of one of these
  max_flops: dict               # group -> FLOPs of the problem (every GEMM of it) at most
  max_bytes: int                # operands and results together, at most


# On a GPU. The FLOP caps keep XLA's program of a problem well under 50 ms on an H100:
# dense GEMMs at >= 50 TFLOP/s (fp32 or a transposed, unaligned layout; bf16 runs at
# 400-800), XLA's lax.ragged_dot at >= 1.3 TFLOP/s (its slowest in issue 44's table,
# G=256), and XLA's block-scaled form (one GEMM per 128 of K) at >= 50 TFLOP/s (8192^3 in
# 21-24 ms, the fp8 suite on the H100). Rejection keeps the sizes log-uniform below them.
GPU_SIZES = Sizes(
    lo=16, hi=16384, groups=(4, 256), batch_hi=64, aligns=(1, 8, 64, 128),
    max_flops={"matmul": 2**41, "matmul+bwd": 2**41, "fused_matmul": 2**41,
               "fused_matmul+bwd": 2**41, "glu": 2**41, "ragged_dot": 2**36,
               "scaled_matmul": 2**40},
    max_bytes=2 * 2**30)
# Without a GPU: the interpreters and XLA:CPU, a few seconds for the whole suite.
TINY_SIZES = Sizes(lo=4, hi=64, groups=(2, 6), batch_hi=3, aligns=(1, 8),
                   max_flops=dict.fromkeys(GROUPS, 2**22), max_bytes=2**22)


def clock_seed() -> int:
  """A seed from the clock (never 0, which means "draw one": `run_suite`)."""
  return time.time_ns() // 1000 % (2**31 - 1) + 1


def _log_uniform(rng, lo: int, hi: int) -> int:
  return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _sizes(rng, sizes: Sizes, n: int = 3) -> list[int]:
  """`n` log-uniform sizes, rounded up to one drawn multiple (1: as drawn)."""
  align = int(rng.choice(sizes.aligns))
  return [-(-_log_uniform(rng, sizes.lo, sizes.hi) // align) * align for _ in range(n)]


def _cost(p) -> tuple[int, int]:
  """(FLOPs of every GEMM of the problem, bytes of its operands and results)."""
  return p.flops, p.min_bytes(p.dtype)


@dataclasses.dataclass(frozen=True)
class DrawnEpilogueProblem(EpilogueProblem):
  """An epilogue problem whose expression is drawn (`activation`, `bias`, `glu`), not one
  of the epilogue suites' (`ops.fused_matmul.EXPRESSIONS`); `expr` is its label."""

  activation: str | None = None
  bias: bool = False
  glu: bool = False

  @property
  def expression(self) -> Expression:
    if self.glu:
      text = f"{self.activation}(x @ wg) * (x @ wu)"
    elif self.activation:
      text = f"{self.activation}(x @ w{' + b' if self.bias else ''})"
    else:
      text = "x @ w" + (" + b" if self.bias else "")
    return Expression(self.expr, text, activation=self.activation, bias=self.bias,
                      glu=self.glu)


def _draw_one(group: str, i: int, suite: str, rng, sizes: Sizes):
  """Problem `i` of `group`, drawn from `rng` (not yet checked against the caps)."""
  dtype = str(rng.choice(DTYPES))
  m, k, n = _sizes(rng, sizes)
  tag = f"{group}.{i:02d}"
  if group == "matmul":
    batch = _log_uniform(rng, 2, sizes.batch_hi) if rng.random() < 1 / 3 else 1
    ta, tb = (bool(t) for t in rng.integers(2, size=2))
    layout = ("T" if ta else "N") + ("T" if tb else "N")
    b = f"{batch}x" if batch > 1 else ""
    return BenchProblem(suite, f"{tag}.{b}{m}x{k}x{n}.{dtype}.{layout}", m, k, n, batch=batch,
                        trans_a=ta, trans_b=tb, dtype=dtype, default=True)
  if group in ("matmul+bwd", "fused_matmul", "fused_matmul+bwd", "glu"):
    mode = "fwd+bwd" if group.endswith("+bwd") else "fwd"
    if group.startswith("matmul"):
      act, bias, glu, expr = None, False, False, "dot"
    else:
      act, glu = str(rng.choice(ACTIVATIONS)), group == "glu"
      bias = not glu
      expr = f"glu.{act}" if glu else f"bias.{act}"
    return DrawnEpilogueProblem(suite, f"{tag}.{m}x{k}x{n}.{dtype}.{expr}", tag, expr, m, k,
                                n, mode=mode, dtype=dtype, default=True, activation=act,
                                bias=bias, glu=glu)
  if group == "ragged_dot":
    g = _log_uniform(rng, *sizes.groups)
    alpha = math.exp(rng.uniform(math.log(0.1), math.log(10.0)))
    shares = rng.dirichlet(np.full(g, alpha))
    routing = tuple(int(x) for x in rng.multinomial(m, shares))
    mode = str(rng.choice(MoeProblem.MODES))
    return MoeProblem(suite, f"{tag}.g{g}.{m}x{k}x{n}.{dtype}.{mode}", tag, g, m, k, n,
                      mode=mode, group_sizes=routing, dtype=dtype, default=True,
                      note=f"Dirichlet({alpha:.2g}) routing")
  if group == "scaled_matmul":
    scaling = str(rng.choice(("tensor", "block")))
    mode = str(rng.choice(("fwd", "dgrad", "wgrad")))
    grad = E5M2 if scaling == "tensor" else E4M3
    a_dtype = grad if mode == "dgrad" else E4M3
    b_dtype = grad if mode == "wgrad" else E4M3
    return Fp8Problem(suite, f"{tag}.{m}x{k}x{n}.{scaling}.{mode}", tag, scaling, m, k, n,
                      mode=mode, a_dtype=a_dtype, b_dtype=b_dtype, default=True)
  raise ValueError(f"unknown group {group!r}; valid: {GROUPS}")


def draw(suite: str, seed: int, per_group: int, sizes: Sizes) -> list:
  """`per_group` problems of every group, drawn from `seed`: the same for a seed, each
  group's draw independent of the others' (its own stream), interleaved (problem 0 of
  every group, then 1, ...) so that a run cut short by its time budget has measured
  every group alike.

  >>> [p.name for p in draw("heldout", 7, 1, GPU_SIZES)][:2]
  ['matmul.00.5x4096x512x256.fp16.TN', 'matmul+bwd.00.128x128x128.fp32.dot']
  """
  if per_group < 0:
    raise ValueError(f"per_group={per_group} must be at least 0")
  by_group = []
  for gi, group in enumerate(GROUPS):
    rng = np.random.default_rng((seed, gi))
    out = []
    for i in range(per_group):
      for _ in range(10_000):
        p = _draw_one(group, i, suite, rng, sizes)
        flops, nbytes = _cost(p)
        if flops <= sizes.max_flops[group] and nbytes <= sizes.max_bytes:
          break
      else:   # cannot happen with caps above the smallest problem's cost
        raise RuntimeError(f"no {group} problem under the caps in 10000 draws")
      out.append(p)
    by_group.append(out)
  return [p for i in range(per_group) for ps in by_group for p in ps[i:i + 1]]


def measured(p) -> R.Measured:
  """What measures problem `p`: its op's suite's `runner.Measured` (imported when a suite
  runs), without the programs that suite measures beside the kernels (jax's example grouped
  GEMM, XLA's unscaled FP8 and bf16 dots): here every ratio is `auto`'s, or a backend's,
  against XLA's program of the same expression."""
  if isinstance(p, EpilogueProblem):
    from . import epilogue  # noqa: PLC0415
    return epilogue.EPILOGUE
  if isinstance(p, MoeProblem):
    from . import moe  # noqa: PLC0415
    return _without_peers(moe.RaggedDotMeasured)
  if isinstance(p, Fp8Problem):
    from . import fp8  # noqa: PLC0415
    return _without_peers(fp8.ScaledMatmulMeasured)
  return R.GEMM


_MEASURED: dict[type, R.Measured] = {}


def _without_peers(cls: type) -> R.Measured:
  """One instance of `cls` (a `runner.Measured`) that measures nothing before the kernels."""
  if cls not in _MEASURED:
    class WithoutPeers(cls):
      def before_kernels(self, *args, **kwargs):
        return [], None
    _MEASURED[cls] = WithoutPeers()
  return _MEASURED[cls]


def run_suite(ctx: R.Context, suite: str, probs, backends: list[str], variants_policy,
              options: SuiteOptions) -> list[dict]:
  """A held-out suite (bench/ops/heldout.py): draws its problems from the run's seed (or
  the clock's), then runs each as its op's suite does, `auto` and the named backends."""
  seed, drawn = (ctx.seed, False) if ctx.seed else (clock_seed(), True)
  count = PER_GROUP[(suite == TINY, options.quick)]
  problems = [p for p in draw(suite, seed, count, TINY_SIZES if suite == TINY else GPU_SIZES)
              if options.runs(p.name)]
  ctx.log(f"  {suite}: seed {seed} ({'drawn from the clock' if drawn else 'from --seed'}); "
          f"{len(problems)} problems; replay: python -m bench --suite {suite} --seed {seed}"
          + (" --quick" if options.quick else ""))
  saved, ctx.seed = ctx.seed, seed   # the inputs and every row's `seed` column: the draw's
  rows, unrun = [], []
  bar = R.Progress(len(problems), suite)
  log, ctx.log = ctx.log, bar.write
  try:
    for bp in problems:
      ops = measured(bp)
      dtype_name = bp.dtype or ctx.dtype_name
      if ctx.out_of_time():
        row = R.base_row(ctx, bp.suite, "gemm", R.REF, ops.ref_variant(bp), bp, dtype_name)
        row.update(status=R.STATUS_SKIPPED,
                   note=f"not run: --time-budget {ctx.time_budget_s:g} s spent")
        ctx.emit(row)
        rows.append(row)
        unrun.append(bp.name)
        bar.update(f"{bp.name} (out of time)")
        continue
      kernels = ops.kernels(bp, backends, variants_policy, dtype_name,
                            slow={} if ctx.on_gpu else ctx.slow, best_seen=ctx.best_seen)
      r = R.run_problem(ctx, bp, kernels, ops=ops)
      rows.extend(r)
      bar.write(R.one_line(bp, r))
      bar.update(bp.name)
  finally:
    ctx.log = log
    ctx.seed = saved
    bar.close()
  if unrun:
    ctx.log(f"  {suite}: {len(unrun)} problems not run for lack of time; run them with "
            f"--seed {seed} --only '{','.join(unrun)}' and merge the CSVs with "
            "`python -m bench report a.csv b.csv --out DIR`")
  return rows
