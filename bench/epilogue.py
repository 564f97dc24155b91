"""The epilogue suites: a GEMM and what follows it, as one expression (issue 27), on every
backend against XLA's program of the same jnp expression, then a SwiGLU training step.

Each problem (`problems.EpilogueProblem`: an expression of `problems.EXPRESSIONS` at one
shape, forward or forward + backward) runs as the GEMM suites' problems do
(`runner.run_problem`, with `EPILOGUE` saying what differs), in one process:

1. inputs: x (M, K) and the bias, residual and cotangent normal(0, 1); each weight
   (K, N) normal(0, 1) / sqrt(K), so that the pre-activation is O(1) and the
   activation is measured and checked where it is not linear;
2. XLA's own program of the jnp expression, jit-compiled: `x @ w + b`,
   `jax.nn.gelu(x @ w + b)` (approximate=True, as jaxgemm's "gelu"), `jax.nn.silu(x @ w)`,
   `x @ w + b + residual`, `jax.nn.silu(x @ wg) * (x @ wu)`, or the bare `x @ w`; in
   fwd+bwd mode `y, vjp = jax.vjp(expr, x, w[, b]); (y, *vjp(dy))`: the reference
   result and time (backend `xla_dot`, variant `jnp` or `jnp+vjp`, as for every suite:
   "XLA's own op");
3. every backend of the expression's op and the default (`auto`), through the public
   API: `jaxgemm.matmul(x, w, bias=b, activation=..., residual=r, backend=...)`,
   `jaxgemm.glu(x, wg, wu, activation="silu", backend=...)` or `jaxgemm.matmul(x, w)`,
   under the same `jax.vjp` in fwd+bwd mode. A named backend runs with variant=None
   (its own choice per GEMM, forward and backward; variant label "(default)"), or, with
   `--variants all` or a list, each named variant of the expression's op. Each is
   checked against XLA's result (every output array: y, and in fwd+bwd mode each
   gradient, relative Frobenius error within the dtype's tolerance), then timed
   interleaved with it: `speedup_vs_xla` is XLA's program over the kernel's, in the
   same run.

TFLOP/s count the GEMMs' FLOPs, 2 M K N for each (two forward GEMMs for SwiGLU, three
times as many with the backward); `min_bytes` each operand read once and each output
written once. The report also relates XLA's time to its bare dot at the same shape
(the GEMMs' floor, `x @ w` of the same problem times the expression's GEMM count).

The suite ends with a training step of a LLaMA-style model with a SwiGLU MLP and
biased projections (`training.GPU_SWIGLU_MODEL`): its dense layers run
`jaxgemm.matmul(..., bias=, residual=)` and `jaxgemm.glu` on each backend, against
the same model in jnp on XLA.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

import jaxgemm
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul.problem import GemmProblem

from . import problems as P
from . import runner as R
from . import training as T
from .ops.fused_matmul import EpilogueProblem, Expression
from .runner import SuiteOptions

OP = "fused_matmul"
REF_VARIANT, REF_VARIANT_BWD = "jnp", "jnp+vjp"


# ---------------------------------------------------------------- the expressions

def xla_expression(e: Expression, precision=None) -> Callable:
  """The jnp expression XLA compiles: f(x, w[, wu][, b][, residual])."""
  def dot(x, w):
    return jnp.matmul(x, w, precision=precision)

  if e.glu:
    def swiglu(x, wg, wu):
      return activations.apply(e.activation, dot(x, wg)) * dot(x, wu)
    return swiglu

  def expr(x, w, *rest):
    rest = list(rest)
    z = dot(x, w)
    if e.bias:
      z = z + rest.pop(0)
    y = activations.apply(e.activation, z)
    if e.residual:
      y = y + rest.pop(0)
    return y
  return expr


def kernel_expression(e: Expression, backend: str, variant: str | None,
                      precision=None) -> Callable:
  """The same expression through jaxgemm's public API on (backend, variant)."""
  kw = dict(precision=precision, backend=backend, variant=variant)
  if e.glu:
    def glu(x, wg, wu):
      return jaxgemm.glu(x, wg, wu, activation=e.activation, **kw)
    return glu

  def fused(x, w, *rest):
    rest = list(rest)
    bias = rest.pop(0) if e.bias else None
    residual = rest.pop(0) if e.residual else None
    if not (e.bias or e.activation or e.residual):
      return jaxgemm.matmul(x, w, **kw)
    return jaxgemm.matmul(x, w, bias=bias, activation=e.activation, residual=residual, **kw)
  return fused


def with_backward(f: Callable, bp: EpilogueProblem) -> Callable:
  """fwd+bwd mode: (x, w..., dy) -> (y, dx, dw...[, db]) through jax.vjp; fwd: f."""
  if not bp.backward:
    return f
  n = len(bp.grad_argnums())        # the leading operands: x, the weights, the bias

  def forward_backward(*args):
    *ops, dy = args
    y, vjp = jax.vjp(lambda *d: f(*d, *ops[n:]), *ops[:n])
    return (y, *vjp(dy))
  return forward_backward


def ref_fn(bp: EpilogueProblem, dtype_name: str) -> Callable:
  return with_backward(xla_expression(bp.expression, R.precision_of(dtype_name)), bp)


def kernel_fn(bp: EpilogueProblem, dtype_name: str, backend: str, variant: str) -> Callable:
  """jaxgemm's (backend, variant) on the problem; (AUTO, ...) and the "(default)" variant
  pass variant=None, as a user naming none does."""
  v = None if backend == R.AUTO or variant == R.DEFAULT_VARIANT else variant
  return with_backward(kernel_expression(bp.expression, backend, v,
                                         R.precision_of(dtype_name)), bp)


def forward_problem(bp: EpilogueProblem, dtype_name: str):
  """The canonical problem of the expression's forward call (what `dispatch` chooses for)."""
  g = R.gemm_problem(bp, dtype_name)
  fields = {f.name: getattr(g, f.name) for f in dataclasses.fields(GemmProblem)}
  e = bp.expression
  if e.op == "matmul":
    return g
  if e.op == "glu":
    return GluProblem(**fields, activation=e.activation)
  return FusedMatmulProblem(**fields, activation=e.activation,
                            bias="shared" if e.bias else None, residual=e.residual)


def input_scales(bp: EpilogueProblem) -> list[float]:
  """Each operand's scale: the weights 1 / sqrt(K), the rest 1."""
  w = bp.expression.weights
  n = len(bp.input_shapes())
  return [1.0] + [1.0 / math.sqrt(bp.k)] * w + [1.0] * (n - 1 - w)


def scaled_normal_inputs(shapes, scales, dt, seed: int) -> list:
  """Independent normal(0, scale) arrays in dtype `dt`: drawn in float32 and scaled,
  then rounded (small sets on the host, large ones on the device, as
  `runner.normal_inputs`)."""
  if sum(math.prod(s) for s in shapes) <= R.HOST_GEN_MAX_ELEMS:
    rng = np.random.default_rng(seed)
    return [jax.device_put((rng.standard_normal(s, dtype=np.float32) * np.float32(c)).astype(dt))
            for s, c in zip(shapes, scales)]

  @jax.jit
  def gen(key):
    return [(jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32) * c).astype(dt)
            for i, (s, c) in enumerate(zip(shapes, scales))]

  return jax.block_until_ready(gen(jax.random.key(seed)))


class EpilogueMeasured(R.Measured):
  """What the epilogue suites measure differently from the GEMM suites (`runner.Measured`)."""

  op = OP

  def ref_variant(self, bp):
    return REF_VARIANT_BWD if bp.backward else REF_VARIANT

  def arity_of(self, bp):
    return len(bp.input_shapes())

  def ref_fn(self, bp, dtype_name):
    return ref_fn(bp, dtype_name)

  def kernel_fn(self, bp, dtype_name, backend, variant):
    return kernel_fn(bp, dtype_name, backend, variant)

  def check_fn(self, bp, dtype_name):
    """fwd+bwd: the expression in fp32 (inputs upcast, exact products), results rounded to
    the dtype. XLA's own bf16 program sums the bias gradient's rows in bf16: 1.1% off a
    float64 reference at 4096x1024x1024 where jaxgemm's was 0.19% (measured on the CPU),
    which failed every backend's check at 4096^3 against XLA's result (1.2-1.5% >
    the 1% tolerance: the epilogue suite at 5e779e5 and b2472d0, H100, sq4096.bias.gelu.fwd+bwd)."""
    if not bp.backward:
      return None
    fn = with_backward(xla_expression(bp.expression, lax.Precision.HIGHEST), bp)
    dtype = P.dtype_of(dtype_name)

    def in_fp32(*args):
      outs = fn(*(a.astype(jnp.float32) for a in args))
      return jax.tree.map(lambda o: o.astype(dtype), outs)
    return in_fp32

  def inputs(self, bp, dtype_name, n_rot, seed):
    shapes, scales = bp.input_shapes(), input_scales(bp)
    return scaled_normal_inputs(shapes * n_rot, scales * n_rot, P.dtype_of(dtype_name), seed)

  def problem(self, bp, dtype_name):
    return forward_problem(bp, dtype_name)

  def kernels(self, bp, backends, variants_policy, dtype_name, slow=(), best_seen=None):
    """Each backend of the expression's op with variant=None ("(default)"), or the named
    variants (`--variants all` / a list) of that op; and the default (`auto`)."""
    op = bp.op
    out = []
    for b in backends:
      if b == R.AUTO:
        out.append((R.AUTO, R.AUTO_VARIANT, ""))
        continue
      if b not in jaxgemm.backends(op):
        out.append((b, "-", f"{R.UNSUPPORTED_PREFIX}backend {b!r} has no {op} kernels here "
                            f"(jaxgemm.backends({op!r}) = {jaxgemm.backends(op)})"))
        continue
      vs = list(jaxgemm.variants(b, op))
      if variants_policy == "all":
        out.extend((b, v, "") for v in vs)
      elif isinstance(variants_policy, (list, tuple)):
        named = [v for v in vs if v in variants_policy]
        out.extend((b, v, "") for v in named)
        if not named:
          out.append((b, R.DEFAULT_VARIANT, f"no variant of {op} named for {b}: its default"))
      else:
        out.append((b, R.DEFAULT_VARIANT, ""))
    return out

  def before_kernels(self, ctx, bp, dtype_name, bufs, refs, ref_compiled, n_rot,
                     solo_ref_ms=None):
    """Nothing to measure first; the default's `chosen` says it is the forward's choice
    where the problem has a backward."""
    if not bp.backward:
      return [], None

    def finish(r):
      if r.get("chosen"):
        r["chosen"] = f"forward: {r['chosen']}"
    return [], finish


EPILOGUE = EpilogueMeasured()


def run_epilogue_suite(ctx: R.Context, suite: str, probs: list[EpilogueProblem],
                       backends: list[str], variants_policy, *, training_cfg=None,
                       quick: bool = False, training: bool = True) -> list[dict]:
  """The suite's expressions, then (with `training`) its SwiGLU training step
  (`training.run_suite_then_training`: under a time budget the problems leave
  `training.TRAINING_RESERVE_S` of it to the step)."""
  model = (training_cfg or T.swiglu_model(ctx.on_gpu, quick)) if training else None
  return T.run_suite_then_training(ctx, suite, probs, backends, variants_policy,
                                   ops=EPILOGUE, model=model, label="SwiGLU")


def run_suite(ctx: R.Context, suite: str, probs: list[EpilogueProblem], backends: list[str],
              variants_policy, options: SuiteOptions) -> list[dict]:
  """An epilogue suite (bench/ops/fused_matmul.py): its problems, then its SwiGLU step
  (unless --only names other problems only, as for the moe suites)."""
  cfg = T.model_for(T.swiglu_model(ctx.on_gpu, options.quick), options)
  return run_epilogue_suite(ctx, suite, probs, backends, variants_policy, training_cfg=cfg,
                            quick=options.quick, training=options.runs(cfg.name))
