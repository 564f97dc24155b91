"""fused_matmul's entry (with glu's): the epilogue suites (a GEMM and what follows it as one
expression, issue 27, then a SwiGLU training step), their table and the issue's targets.

The problems run in bench/epilogue.py (`epilogue.run_suite`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..entry import BenchOp, Section, Suite
from ..problems import LLM_LAYERS, dtype_of
from ..report.csvio import AUTO, num
from ..report.markdown import (backends_in, base_suite, fmt_x, pick, ref_step, shape,
                               step_vs_xla, table, verdict)

# ---------------------------------------------------------------- epilogue (issue 27)
# A GEMM and what follows it in a transformer layer, as one expression: a bias, an
# activation, a residual add, or the gate of a SwiGLU MLP. Each problem is one
# expression at one shape, x (M, K) and each weight (K, N), in one of two modes:
#
#   fwd       y = expr(x, w, ...)                                   -> y
#   fwd+bwd   y, vjp = jax.vjp(expr, x, w[, b]); vjp(dy), dy random -> (y, dx, dw[, db])
#
# against XLA's jitted program of the same jnp expression (bench/epilogue.py).
# Gradients are taken with respect to x, the weights and the bias (a residual's is
# the cotangent itself); the cotangent dy is an input (normal(0,1)), as a layer's is
# in training, not the ones of grad(sum(...)), whose GEMMs XLA may simplify.


@dataclasses.dataclass(frozen=True)
class Expression:
  """One jnp expression of the epilogue suites."""

  name: str
  text: str                     # as the reports print it
  activation: str | None = None
  bias: bool = False
  residual: bool = False
  glu: bool = False             # activation(x @ wg) * (x @ wu): two weights

  @property
  def op(self) -> str:
    """The jaxgemm op its forward runs: matmul (bare), fused_matmul or glu."""
    if self.glu:
      return "glu"
    return "fused_matmul" if (self.activation or self.bias or self.residual) else "matmul"

  @property
  def weights(self) -> int:
    return 2 if self.glu else 1


EXPRESSIONS = {e.name: e for e in (
    Expression("dot", "x @ w"),
    Expression("bias", "x @ w + b", bias=True),
    Expression("bias.gelu", "gelu(x @ w + b)", activation="gelu", bias=True),
    Expression("silu", "silu(x @ w)", activation="silu"),
    Expression("bias.residual", "x @ w + b + residual", bias=True, residual=True),
    Expression("swiglu", "silu(x @ wg) * (x @ wu)", activation="silu", glu=True),
)}
EPILOGUE_MODES = ("fwd", "fwd+bwd")


@dataclasses.dataclass(frozen=True)
class EpilogueProblem:
  suite: str
  name: str
  layer: str              # the shape's name: every expression at it shares it
  expr: str               # a key of EXPRESSIONS
  m: int
  k: int
  n: int
  mode: str = "fwd"       # "fwd" or "fwd+bwd" (above)
  dtype: str | None = None
  default: bool = False
  quick: bool = False
  ladder: bool = False
  note: str = ""

  batch = 1
  trans_a = False
  trans_b = False
  layout = "NN"

  @property
  def expression(self) -> Expression:
    return EXPRESSIONS[self.expr]

  @property
  def op(self) -> str:
    return self.expression.op

  @property
  def backward(self) -> bool:
    return self.mode == "fwd+bwd"

  @property
  def gemms(self) -> int:
    """GEMMs of M x K x N the expression runs: 1 or 2 forward, 3x with the backward."""
    return self.expression.weights * (3 if self.backward else 1)

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n * self.gemms

  def input_shapes(self) -> list[tuple[int, ...]]:
    """The operands in call order: x, the weight(s), [b], [residual], [dy (fwd+bwd)]."""
    e = self.expression
    shapes = [(self.m, self.k)] + [(self.k, self.n)] * e.weights
    shapes += [(self.n,)] if e.bias else []
    shapes += [(self.m, self.n)] if e.residual else []
    shapes += [(self.m, self.n)] if self.backward else []
    return shapes

  def grad_argnums(self) -> tuple[int, ...]:
    """The operands differentiated in fwd+bwd: x, the weight(s), the bias."""
    e = self.expression
    return tuple(range(1 + e.weights + int(e.bias)))

  def out_shape(self) -> tuple[int, int]:
    return (self.m, self.n)

  def min_bytes(self, dtype_name: str) -> int:
    """Each operand read once and each output written once (fwd+bwd: y and the
    gradients of x, the weights and the bias)."""
    item = np.dtype(dtype_of(dtype_name)).itemsize
    shapes = self.input_shapes() + [self.out_shape()]
    if self.backward:
      shapes += [self.input_shapes()[i] for i in self.grad_argnums()]
    return item * sum(math.prod(s) for s in shapes)

  def size_label(self) -> str:
    return f"{self.m}x{self.k}x{self.n} {self.expr} {self.mode}"

  def csv_fields(self, dtype_name: str) -> dict:
    """The problem's columns of a CSV row (`runner.base_row`)."""
    return {
        "batch": 1, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": int(self.ladder), "flops": self.flops, "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note, "mode": self.mode, "layer": self.layer, "expr": self.expr,
    }


# The three shapes: (name, M, K, N, note). 8192x4096x14336 and 128x4096x14336 are
# Llama-3-8B's MLP gate (or up) projection at 8192 and 128 tokens.
EPILOGUE_SHAPES = (
    ("m8192.k4096.n14336", 8192, 4096, 14336, "llama3-8b MLP gate/up, 8192 tokens"),
    ("sq4096", 4096, 4096, 4096, "4096^3"),
    ("m128.k4096.n14336", 128, 4096, 14336, "llama3-8b MLP gate/up, 128 tokens"),
)
# The table (and targets): what `--default-only` runs; swiglu at 4096^3 is not in it.
EPILOGUE_DEFAULT = {
    "fwd": {"dot", "bias", "bias.gelu", "silu", "bias.residual", "swiglu"},
    "fwd+bwd": {"bias.gelu", "swiglu"},
}
EPILOGUE_QUICK = {("m8192.k4096.n14336", "bias.gelu", "fwd"), ("m128.k4096.n14336", "swiglu", "fwd"),
                  ("m8192.k4096.n14336", "bias.gelu", "fwd+bwd")}
# The MLP shapes of the llm suite (LLM_LAYERS) at its default token counts: the gate/up
# projection with an activation (bias.gelu, silu) or as SwiGLU, the down projection with a
# bias and the residual add. Llama-3-8B's up at 128 and 8192 tokens are the shapes.
EPILOGUE_LLM = (
    ("llama3-8b", (2048,), (128, 2048, 8192)),     # (model, tokens of up, tokens of down)
    ("llama3-70b", (4096,), (4096,)),
)
EPILOGUE_LLM_D_FF = {"llama3-8b": 14336, "llama3-70b": 28672}


def _epilogue_problem(suite, layer, expr, m, k, n, mode, note, **kw):
  name = f"{layer}.{expr}" + ("" if mode == "fwd" else f".{mode}")
  return EpilogueProblem(suite, name, layer, expr, m, k, n, mode=mode,
                         note=f"{note}; {EXPRESSIONS[expr].text}"
                              + ("; forward + backward" if mode != "fwd" else ""), **kw)


def _epilogue():
  """Every forward problem first, then the fwd+bwd ones; the issue's shapes first."""
  out = []
  for mode in EPILOGUE_MODES:
    for layer, m, k, n, note in EPILOGUE_SHAPES:
      for expr in EXPRESSIONS:
        out.append(_epilogue_problem(
            "epilogue", layer, expr, m, k, n, mode, note,
            default=expr in EPILOGUE_DEFAULT[mode] and not (expr == "swiglu" and layer == "sq4096"),
            quick=(layer, expr, mode) in EPILOGUE_QUICK))
    for model, up_tokens, down_tokens in EPILOGUE_LLM:
      d, ff = LLM_LAYERS[model]["o"][0], EPILOGUE_LLM_D_FF[model]
      for t in up_tokens:
        for expr in ("bias.gelu", "silu", "swiglu"):
          out.append(_epilogue_problem("epilogue", f"{model}.up.t{t}", expr, t, d, ff, mode,
                                       f"{model} MLP gate/up, {t} tokens"))
      for t in down_tokens:
        out.append(_epilogue_problem("epilogue", f"{model}.down.t{t}", "bias.residual", t, ff,
                                     d, mode, f"{model} MLP down, {t} tokens"))
  return out


# The CPU's analogue (interpreters, XLA:CPU): every expression in both modes at one small
# shape, and a few at a shape that is no multiple of any tile, and a decode-sized one.
EPILOGUE_TINY_SHAPES = (
    ("m64.k32.n128", 64, 32, 128, tuple(EXPRESSIONS), "small"),
    ("m40.k24.n72", 40, 24, 72, ("bias.gelu", "swiglu"), "no multiple of a tile"),
    ("m4.k64.n96", 4, 64, 96, ("bias.residual",), "decode-sized"),
)


def _epilogue_tiny():
  out = []
  for mode in EPILOGUE_MODES:
    for layer, m, k, n, exprs, note in EPILOGUE_TINY_SHAPES:
      for expr in exprs:
        out.append(_epilogue_problem("epilogue-tiny", layer, expr, m, k, n, mode, note,
                                     default=True, quick=layer == "m64.k32.n128"))
  return out


# The ops an epilogue suite's backends come from (a backend of either runs on every problem;
# one without kernels for a problem's op gets an `unsupported` row there).
EPILOGUE_OPS = ("fused_matmul", "glu")
EPILOGUE_SUITES: dict[str, list[EpilogueProblem]] = {
    "epilogue": _epilogue(),
    "epilogue-tiny": _epilogue_tiny(),
}


# ---------------------------------------------------------------- the report

def _expr_text(p: dict) -> str:
  e = EXPRESSIONS.get(p.get("expr", ""))
  text = e.text if e else p.get("expr", "")
  return text + (" (fwd+bwd)" if p.get("mode") == "fwd+bwd" else "")


def _gemm_floor_ms(run, suite: str, p: dict) -> float | None:
  """XLA's bare dot at the problem's shape (the `dot` forward problem of its layer) times
  the expression's GEMM count: the time the GEMMs alone take on XLA."""
  dot = next((q for q in run.problems(suite) if q.get("layer") == p.get("layer")
              and q.get("expr") == "dot" and q.get("mode") == "fwd" and q["status"] == "ok"),
             None)
  if dot is None or not num(dot["time_ms_median"]):
    return None
  e = EXPRESSIONS.get(p.get("expr", ""))
  gemms = (e.weights if e else 1) * (3 if p.get("mode") == "fwd+bwd" else 1)
  return num(dot["time_ms_median"]) * gemms


def _us_e(r: dict) -> str:
  """A row's time in us, with a decimal below 100 us (the decode-sized problems)."""
  us = num(r["time_ms_median"]) * 1e3
  return f"{us:.1f} us" if us < 100 else f"{us:,.0f} us"


def _us_x(r: dict) -> str:
  """'1,234 us (1.05x)': a kernel row's time and its speedup over XLA's program."""
  return f"{_us_e(r)} ({fmt_x(num(r['speedup_vs_xla']))})"


def _epilogue_cell(run, suite: str, problem: str, backend: str) -> str:
  best = pick(run, suite, problem, backend)
  if best is None:
    st = sorted({r["status"] for r in run.kernel_rows(suite, problem) if r["backend"] == backend})
    return "/".join(st) or "-"
  v = best["variant"]
  return _us_x(best) + ("" if v in ("(default)", "default") else f" {v}")


def epilogue_table(run, suite: str) -> list[str]:
  """An epilogue suite's problems: XLA's program of each expression (and its ratio to the
  GEMMs alone on XLA), the default and each backend: time (vs XLA)."""
  bs = backends_in(run, [suite])
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    if p["status"] == "ok":
      floor = _gemm_floor_ms(run, suite, p)
      xla = _us_e(p) + (f" ({num(p['time_ms_median']) / floor:.3f}x)" if floor else "")
    else:
      xla = p["status"]
    row = [name, _expr_text(p), shape(p), xla]
    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else
                 f"{_us_x(a) if a['status'] == 'ok' else a['status']} {a.get('chosen') or ''}".strip())
    row += [_epilogue_cell(run, suite, name, b) for b in bs]
    rows.append(row)
  header = ["problem", "expression", "MxKxN", "XLA's program (x its GEMMs on XLA)",
            *(["default (auto) (vs XLA), chose"] if run.has_auto else []),
            *[f"{b} (vs XLA)" for b in bs]]
  return table(header, rows)


# Issue 27's targets (H200, bf16): (problem of the epilogue suite, best jaxgemm kernel's
# speedup over XLA's program of the same expression, at least), then the SwiGLU
# training step's (backend="auto" only, losses agreeing).
EPILOGUE_TARGETS = (
    *((f"{layer}.bias.gelu", t) for layer, t in (
        ("m8192.k4096.n14336", 1.10), ("sq4096", 1.10), ("m128.k4096.n14336", 1.12))),
    *((f"{layer}.silu", 1.08) for layer in ("m8192.k4096.n14336", "sq4096", "m128.k4096.n14336")),
    *((f"{layer}.bias.residual", 1.03)
      for layer in ("m8192.k4096.n14336", "sq4096", "m128.k4096.n14336")),
    ("m8192.k4096.n14336.swiglu", 1.05), ("m128.k4096.n14336.swiglu", 1.12),
    ("m8192.k4096.n14336.bias.gelu.fwd+bwd", 1.03), ("m128.k4096.n14336.bias.gelu.fwd+bwd", 1.15),
)
EPILOGUE_TRAIN_TARGET = 1.03
EPILOGUE_TARGETS_NOTE = (
    "Each target against XLA's jitted program of the same jnp expression, timed in the same "
    "run; cells: each backend's fastest correct variant, time (vs XLA). `met` where a jaxgemm "
    "kernel (not the `xla` backend) reaches it; the SwiGLU training step's target is the "
    "default's (`backend='auto'`), with its losses agreeing with XLA's model; its cells: the "
    "speedup (XLA's step timed beside it / its own).")
EPILOGUE_TABLE_NOTE = (
    "Cells: time per call (CUPTI on a GPU) and, for kernels, XLA's program's time over "
    "theirs (> 1: faster). XLA's column also gives its time over its bare `x @ w` at the "
    "same shape times the expression's GEMM count (2 for SwiGLU, x3 with the backward): "
    "what the epilogue costs XLA. fwd+bwd: `y, vjp = jax.vjp(expr, x, w[, b])`, `(y, "
    "*vjp(dy))` with a random cotangent `dy`. Named backends run with variant=None (their "
    "own choice per GEMM) unless the run named variants.")


def epilogue_targets_table(run) -> list[str]:
  """Issue 27's targets against this run: XLA, each backend's best variant and the default;
  `met` where one of jaxgemm's kernels (a backend other than xla, or the default)
  reaches the target (the training step: the default)."""
  suites = [s for s in run.suites if base_suite(s) in EPILOGUE_SUITES
            and all(p["dtype"] == "bf16" for p in run.problems(s))]
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["suite"] in EPILOGUE_SUITES]
  bs = [*backends_in(run, suites), *([AUTO] if run.has_auto else [])]
  ours = [b for b in bs if b != "xla"]
  rows = []
  for problem, target in EPILOGUE_TARGETS:
    suite = next((s for s in suites if any(p["problem"] == problem for p in run.problems(s))),
                 None)
    if suite is None:
      continue
    ref = next(p for p in run.problems(suite) if p["problem"] == problem)
    cells, values = [_us_e(ref) if ref["status"] == "ok" else ref["status"]], []
    for b in bs:
      r = pick(run, suite, problem, b)
      cells.append(_epilogue_cell(run, suite, problem, b))
      if r is not None and b in ours:
        values.append(num(r["speedup_vs_xla"]))
    outcome = "not measured" if not values else verdict(run, max(values) >= target)
    rows.append([f"{_expr_text(ref)} at {shape(ref)}", f">= {target:.2f}x", *cells, outcome])
  if steps:
    model = steps[0]["problem"]
    ref = ref_step(steps, model)
    cells = [f"{num(ref['time_ms_median']):.2f} ms" if ref and ref["status"] == "ok"
             else (ref["status"] if ref else "-")]
    outcome = "not measured"
    for b in bs:
      rr = [r for r in steps if r["backend"] == b and r["problem"] == model]
      ok = [r for r in rr if r["status"] == "ok" and num(r.get("speedup_vs_xla"))]
      if not ok:
        cells.append("/".join(sorted({r["status"] for r in rr})) or "-")
        if b == AUTO and any(r["status"] == "fail" for r in rr):
          outcome = "**missed** (losses disagree)" if run.on_gpu else "**losses disagree**"
        continue
      r = max(ok, key=lambda r: num(r["speedup_vs_xla"]))
      s = num(r["speedup_vs_xla"])
      cells.append(step_vs_xla(r, 2))
      if b == AUTO:
        outcome = verdict(run, s >= EPILOGUE_TRAIN_TARGET)
    rows.append([f"SwiGLU training step ({model}), default", f">= {EPILOGUE_TRAIN_TARGET:.2f}x",
                 *cells, outcome])
  if not rows:
    return []
  return table(["expression at MxKxN", "target vs XLA", "XLA", *[
      "default (auto)" if b == AUTO else f"{b} (best variant)" for b in bs], ""], rows)


def _suite_table(run, suite: str) -> list[str]:
  return [EPILOGUE_TABLE_NOTE, "", *epilogue_table(run, suite)]


def _targets(run) -> list[str]:
  rows = epilogue_targets_table(run)
  return [EPILOGUE_TARGETS_NOTE, "", *rows] if rows else []


# ---------------------------------------------------------------- the entry

ENTRY = BenchOp(
    name="fused_matmul", order=30, ops=EPILOGUE_OPS, family="epilogue",
    suites=(
        Suite("epilogue", "GEMM epilogues (issue 27): x@w+b, gelu(x@w+b), silu(x@w), "
              "x@w+b+residual, SwiGLU (glu), forward and forward+backward, vs XLA's program "
              "of the same jnp expression; a SwiGLU training step", EPILOGUE_SUITES["epilogue"],
              runner="epilogue", list_note="then a SwiGLU training step (bench/training.py)"),
        Suite("epilogue-tiny", "the epilogue suite's CPU analogue (interpreters)",
              EPILOGUE_SUITES["epilogue-tiny"], runner="epilogue", cpu_default=True,
              list_note="then a SwiGLU training step (bench/training.py)"),
    ),
    # As the moe suites' (bench/ops/ragged_dot.py): within a lent GPU's 10 minutes.
    gpu_time_budget_s=450.0,
    suite_table=_suite_table, suite_title="Suite `{suite}` (GEMM epilogues)",
    readme_suite_title="GEMM epilogues: suite `{suite}`",
    targets=(Section("GEMM epilogue targets (issue 27)", _targets,
                     readme_title="GEMM epilogue targets (issue 27)"),),
    train_ref_label="XLA (jnp)",
)
