"""scaled_matmul's entry: the fp8 suites (FP8 GEMMs with scales, issue 28, then an FP8
training step), their table and the issue's targets.

The problems run in bench/fp8.py (`fp8.run_suite`), the training step's recipes in
bench/training.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..entry import BenchOp, Section, Suite
from ..problems import dtype_of
from ..report.csvio import AUTO, REF, num
from ..report.markdown import (backends_in, base_suite, fmt_t, fmt_x, pick, ref_step, shape,
                               step_vs_xla, table, verdict)

OP = "scaled_matmul"
# XLA's scaled form of a problem in its own layout (bench/fp8.py): the `xla_dot` row's
# variant, the program every other row is timed interleaved with.
REF_TENSOR, REF_BLOCK = "dot_f32*scales", "scaled_matmul[xla]"
# XLA's other programs of the problem, measured beside the kernels (not jaxgemm backends):
# the `backend` of their rows, and their variants. Two are programs of the problem itself
# that a user may run instead, XLA's baselines beside the reference (`baselines`):
# * SCALED_OTHER_B, the scaled form with b stored the other way ((N, K) where the problem
#   has (K, N), and back): XLA's FP8 GEMM reads both operands K-major and transposes a
#   (K, N) b itself on every call, so the layout a user stores the weight in decides its
#   speed (issue 44: 1141 TFLOP/s with the weight (N, K) at 2048x5120x5120 per tensor,
#   where our kernel ran 819 on (K, N));
# * DEQUANT_BF16 (block scales), the operands dequantized to bf16 in XLA, then its bf16 dot
#   (issue 44: our block-scaled kernels ran 0.51x (H100) and 0.39x (H200) of it at 128 rows).
# The other two are for comparison only: FP8_DOT, the fp8 values' dot without scales (the
# FP8 GEMM alone), and BF16_DOT, the bf16 dot of operands dequantized beforehand (the GEMM
# without FP8, its dequantization not timed).
PEER = "xla_peer"
FP8_DOT, BF16_DOT = "fp8_dot", "bf16_dot"
SCALED_OTHER_B, DEQUANT_BF16 = "scaled_form_other_b_layout", "dequantize+bf16_dot"

# The FP8 training step's recipes each backend trains with (variant "fp8=<recipe>";
# `jaxgemm.Fp8Recipe.named`), and those the GPU suite trains for `auto` beside them, with
# the same checks: (scaling, Fp8Recipe's other fields). Each is a named recipe as it was
# before run11 (per tensor: float32 scales and XLA's quantizer, 1.14-1.15x of XLA's bf16
# step against the named one's 1.245-1.255x; block: XLA's quantizer, 0.93-0.95x against
# 1.07-1.09x; H100, paired, the fp8-fused-quant probe's runs 10-13 at f0b6981 to 7d3d88d).
FP8_RECIPES = ("tensor", "block")
FP8_VARIANT_PREFIX = "fp8="
FP8_OPTION_RECIPES = {
    "tensor+f32-scales": ("tensor", {"grad_dtype": "float8_e5m2", "quantize_backend": "xla"}),
    "block+xla-quantize": ("block", {"quantize_backend": "xla"}),
}


def ref_variant(bp) -> str:
  """The name of XLA's scaled form for the problem (bench/fp8.py's reference)."""
  return REF_TENSOR if bp.scaling == "tensor" else REF_BLOCK


def baselines(bp) -> tuple[str, ...]:
  """XLA's baselines of the problem beside the reference (PEER's variants, above): every
  ratio of the problem is against the fastest of them and the reference."""
  return (SCALED_OTHER_B,) + ((DEQUANT_BF16,) if bp.scaling == "block" else ())


def b_layout(trans_b: bool) -> str:
  """'(K, N)' or '(N, K)': how b is stored."""
  return "(N, K)" if trans_b else "(K, N)"


# ---------------------------------------------------------------- fp8 (issue 28)
# `scaled_matmul`: C = (op(A) * a_scale) @ (op(B) * b_scale) of fp8 operands, accumulated in
# fp32, stored in bf16, with one scale per tensor ("tensor") or in blocks ("block": 1x128
# blocks of A along K, 128x128 blocks of B, the DeepSeek-V3 recipe), against XLA's program
# of the same scaled product (bench/fp8.py). m, k, n are the GEMM's own: a layer's dgrad
# (dX = dY W^T, W stored (K_layer, N_layer): trans_b) and wgrad (dW = X^T dY, X stored
# (tokens, K_layer): trans_a) swap them as the `backward` suite's problems do.

FP8_NAMES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


@dataclasses.dataclass(frozen=True)
class Fp8Problem:
  suite: str
  name: str
  layer: str              # the forward shape's name: its dgrad and wgrad share it
  scaling: str            # "tensor" or "block" (above)
  m: int
  k: int
  n: int
  mode: str = "fwd"       # "fwd", "dgrad" (trans_b) or "wgrad" (trans_a)
  a_dtype: str = "float8_e4m3fn"
  b_dtype: str = "float8_e4m3fn"
  default: bool = False
  quick: bool = False
  note: str = ""

  op = "scaled_matmul"
  batch = 1
  ladder = False
  # The output's dtype (the "bf16 output"), whatever the run's --dtype: the
  # correctness gate and the bf16 dot it is compared with are bf16's.
  dtype = "bf16"
  # pct_peak and memory_bound against the FP8 dense peak (runner.PEAK_TFLOPS).
  peak_dtype = "fp8"

  @property
  def trans_a(self) -> bool:
    return self.mode == "wgrad"

  @property
  def trans_b(self) -> bool:
    return self.mode == "dgrad"

  @property
  def layout(self) -> str:
    return ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n

  def a_shape(self) -> tuple[int, int]:
    return (self.k, self.m) if self.trans_a else (self.m, self.k)

  def b_shape(self, trans_b: bool | None = None) -> tuple[int, int]:
    """b as stored (trans_b: as if stored the other way, for SCALED_OTHER_B)."""
    trans_b = self.trans_b if trans_b is None else trans_b
    return (self.n, self.k) if trans_b else (self.k, self.n)

  def out_shape(self) -> tuple[int, int]:
    return (self.m, self.n)

  def a_block(self) -> tuple[int, int] | None:
    """quantize's block for A as stored: 1x128 along K ((128, 1) when stored (K, M))."""
    if self.scaling == "tensor":
      return None
    return (128, 1) if self.trans_a else (1, 128)

  def b_block(self) -> tuple[int, int] | None:
    return None if self.scaling == "tensor" else (128, 128)

  def dimension_numbers(self, trans_b: bool | None = None):
    """lax.dot_general dimension numbers of the stored layout (2-D operands); with
    `trans_b`, of b stored that way instead."""
    trans_b = self.trans_b if trans_b is None else trans_b
    return (((0 if self.trans_a else 1,), (1 if trans_b else 0,)), ((), ()))

  def scale_elems(self) -> int:
    if self.scaling == "tensor":
      return 2
    kb, mb, nb = -(-self.k // 128), self.m, -(-self.n // 128)
    return mb * kb + kb * nb

  def min_bytes(self, dtype_name: str = "bf16") -> int:
    """The fp8 operands and float32 scales read once, the output written once (bf16)."""
    out = np.dtype(dtype_of(self.dtype)).itemsize
    return self.m * self.k + self.k * self.n + 4 * self.scale_elems() + out * self.m * self.n

  @property
  def fp8_dtypes(self) -> str:
    return f"{FP8_NAMES[self.a_dtype]}x{FP8_NAMES[self.b_dtype]}"

  def size_label(self) -> str:
    return f"{self.m}x{self.k}x{self.n} {self.scaling} {self.mode}"

  def csv_fields(self, dtype_name: str) -> dict:
    """The problem's columns of a CSV row (`runner.base_row`); `xla_ref` names the XLA
    program the row's `speedup_vs_xla` is against: the reference (`ref_variant`), which
    bench/fp8.py replaces on the other rows by the problem's strongest baseline."""
    return {
        "batch": 1, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": 0, "flops": self.flops, "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note, "mode": self.mode, "layer": self.layer,
        "scaling": self.scaling, "fp8_dtypes": self.fp8_dtypes,
        "xla_ref": ref_variant(self),
    }


# The shapes (MxKxN): (name, M, K, N, note). 8192x4096x14336 and 128x4096x14336 are
# Llama-3-8B's MLP gate (or up) projection at 8192 and 128 tokens.
FP8_SHAPES = (
    ("sq8192", 8192, 8192, 8192, "8192^3"),
    ("m8192.k4096.n14336", 8192, 4096, 14336, "llama3-8b MLP gate/up, 8192 tokens"),
    ("sq4096", 4096, 4096, 4096, "4096^3"),
    ("m128.k4096.n14336", 128, 4096, 14336, "llama3-8b MLP gate/up, 128 tokens"),
)
FP8_SCALINGS = ("tensor", "block")
# The backward's layouts at one LLM shape: the gate/up projection's dgrad and wgrad. The
# per-tensor recipe's gradients are e5m2 (`jaxgemm.Fp8Recipe.named("tensor")`), the block
# recipe's e4m3: each problem has the dtypes its GEMM has in FP8 training.
FP8_BACKWARD_LAYER = "m8192.k4096.n14336"
FP8_QUICK = {"m8192.k4096.n14336.tensor", "m8192.k4096.n14336.block", "m128.k4096.n14336.block"}


def _fp8_problems(suite, shapes, backward_layers, tiny=False):
  """Every forward problem (per tensor, then block), then the backward layouts."""
  out = []
  for scaling in FP8_SCALINGS:
    for layer, m, k, n, note in shapes:
      name = f"{layer}.{scaling}"
      out.append(Fp8Problem(suite, name, layer, scaling, m, k, n, default=True,
                            quick=tiny or name in FP8_QUICK,
                            note=f"{note}; {scaling} scales"))
  for layer, m, k, n, note in shapes:
    if layer not in backward_layers:
      continue
    for scaling in FP8_SCALINGS:
      grad = "float8_e5m2" if scaling == "tensor" else "float8_e4m3fn"
      e4m3 = "float8_e4m3fn"
      out.append(Fp8Problem(suite, f"{layer}.dgrad.{scaling}", layer, scaling, m, n, k,
                            mode="dgrad", a_dtype=grad, b_dtype=e4m3, default=True,
                            note=f"{note}; dgrad dX = dY W^T ({FP8_NAMES[grad]} dY); "
                                 f"{scaling} scales"))
      out.append(Fp8Problem(suite, f"{layer}.wgrad.{scaling}", layer, scaling, k, m, n,
                            mode="wgrad", a_dtype=e4m3, b_dtype=grad, default=True,
                            note=f"{note}; wgrad dW = X^T dY ({FP8_NAMES[grad]} dY); "
                                 f"{scaling} scales"))
  return out


# The CPU's analogue (XLA:CPU, the kernels' interpreters): K of two whole blocks; K, M and N
# off the 128-wide blocks (a partial block, N below one block); a decode-sized M.
FP8_TINY_SHAPES = (
    ("m64.k256.n128", 64, 256, 128, "two K blocks"),
    ("m40.k200.n72", 40, 200, 72, "a partial K block, N below one block"),
    ("m4.k128.n256", 4, 128, 256, "decode-sized"),
)
FP8_SUITES: dict[str, list[Fp8Problem]] = {
    "fp8": _fp8_problems("fp8", FP8_SHAPES, (FP8_BACKWARD_LAYER,)),
    "fp8-tiny": _fp8_problems("fp8-tiny", FP8_TINY_SHAPES, ("m64.k256.n128",), tiny=True),
}


# ---------------------------------------------------------------- the report

# XLA's programs of an fp8 problem as the tables name them: the scaled form in each layout
# of b (the reference is the problem's own, SCALED_OTHER_B the other), then PEER's others.
SCALED_KN, SCALED_NK = "XLA scaled form, b (K, N)", "XLA scaled form, b (N, K)"
PEER_LABELS = {FP8_DOT: "XLA fp8 dot (no scales)", DEQUANT_BF16: "dequantize + XLA bf16 dot",
               BF16_DOT: "XLA bf16 dot (dequantized beforehand)"}


def _tflops(r: dict | None) -> str:
  """'1,310.2': a row's TFLOP/s alone (3 significant digits below 1), or its status."""
  if r is None:
    return "-"
  if r["status"] != "ok":
    return r["status"]
  return f"{num(r['tflops']):,.1f}" if num(r["tflops"]) >= 1 else fmt_t(num(r["tflops"]))


def _tf_x(r: dict | None, label: bool = True, ratio: float | None = None) -> str:
  """'1,310.2 (1.35x) variant': a row's TFLOP/s and its speedup over the problem's strongest
  XLA baseline (`speedup_vs_xla`; for the reference row, which is timed before the others,
  `ratio`)."""
  text = _tflops(r)
  if r is None or r["status"] != "ok":
    return text
  v = r["variant"]
  s = ratio if r["backend"] == REF else num(r.get("speedup_vs_xla"))
  if s is not None:
    text += f" ({fmt_x(s)})"
  return text + (f" {v}" if label and r["backend"] not in (REF, PEER)
                 and v not in ("(default)", "default") else "")


def strongest(run, suite: str, ref: dict) -> tuple[str, float | None]:
  """(name, the reference's speedup over it) of the problem's strongest XLA baseline: the
  reference (the scaled form in the problem's layout) or the fastest baseline peer
  (`baselines`), by their ratios to the reference when each was timed interleaved with it
  (`speedup_vs_paired`). A run from before these baselines: (the reference, None)."""
  best, factor, seen = ref["variant"], 1.0, False
  for r in run.gemm:
    if (r["suite"] == suite and r["problem"] == ref["problem"] and r["backend"] == PEER
        and r["variant"] in (SCALED_OTHER_B, DEQUANT_BF16)):
      seen = True
      s = num(r.get("speedup_vs_paired")) if r["status"] == "ok" else None
      if s is not None and s > factor:
        best, factor = r["variant"], s
  return (best, 1 / factor) if seen else (ref["variant"], None)


def _baseline_name(variant: str, ref: dict) -> str:
  """How the tables name a baseline: by b's layout for the scaled forms."""
  trans_b = ref.get("layout", "NN")[1:] == "T"
  if variant == SCALED_OTHER_B:
    trans_b = not trans_b
  elif variant != ref["variant"]:
    return PEER_LABELS.get(variant, variant)
  return f"scaled form, b {b_layout(trans_b)}"


def _baseline_cells(run, suite: str, ref: dict) -> list[str]:
  """The scaled form's TFLOP/s with b (K, N) and (N, K), and the dequantized bf16 dot's,
  each vs the strongest baseline; the reference's variant named."""
  name = ref["problem"]
  _, ref_ratio = strongest(run, suite, ref)
  own = f"{_tf_x(ref, ratio=ref_ratio)} `{ref['variant']}`"
  other = _tf_x(run.row(suite, name, PEER, SCALED_OTHER_B))
  kn, nk = (other, own) if ref.get("layout", "NN")[1:] == "T" else (own, other)
  return [kn, nk, _tf_x(run.row(suite, name, PEER, DEQUANT_BF16))]


def _fp8_cell(run, suite: str, problem: str, backend: str) -> str:
  best = pick(run, suite, problem, backend)
  if best is None:
    st = sorted({r["status"] for r in run.kernel_rows(suite, problem) if r["backend"] == backend})
    return "/".join(st) or "-"
  return _tf_x(best)


def fp8_table(run, suite: str) -> list[str]:
  """An fp8 suite's problems: TFLOP/s of XLA's programs (its fp8 dot, the scaled form with
  b in each layout, the dequantized bf16 dot, the bf16 dot), the default and each
  backend, each vs the problem's strongest XLA baseline (named)."""
  bs = backends_in(run, [suite])
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    best, _ = strongest(run, suite, p)
    row = [name, p.get("scaling", ""), p.get("layout", ""), shape(p), p.get("fp8_dtypes", ""),
           _tf_x(run.row(suite, name, PEER, FP8_DOT)), *_baseline_cells(run, suite, p),
           _tf_x(run.row(suite, name, PEER, BF16_DOT)), _baseline_name(best, p)]
    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else f"{_tf_x(a)} {a.get('chosen') or ''}".strip())
    row += [_fp8_cell(run, suite, name, b) for b in bs]
    rows.append(row)
  header = ["problem", "scales", "layout", "MxKxN", "fp8", PEER_LABELS[FP8_DOT], SCALED_KN,
            SCALED_NK, PEER_LABELS[DEQUANT_BF16], PEER_LABELS[BF16_DOT],
            "strongest XLA baseline", *(["default (auto), chose"] if run.has_auto else []), *bs]
  return table(header, rows)


# Issue 28's targets (bf16 output): (problem of the fp8 suite, kind, threshold, as the issue
# says it). Kinds: "tflops" (the best jaxgemm kernel's TFLOP/s, at least), "speedup" (its
# speedup over XLA, at least: issue 28 said over XLA's scaled form of the problem; since
# issue 44, over the strongest of XLA's baselines, which is that or faster).
FP8_TARGETS = (
    *((f"{layer}.tensor", "tflops", t) for layer, t in (
        ("sq8192", 1350.0), ("m8192.k4096.n14336", 1300.0), ("sq4096", 1100.0))),
    ("m128.k4096.n14336.tensor", "speedup", 2.0),
    *((f"{layer}.block", "tflops", t) for layer, t in (
        ("sq8192", 1250.0), ("m8192.k4096.n14336", 1200.0), ("sq4096", 1000.0))),
    ("m128.k4096.n14336.block", "speedup", 1.8),
)
# The FP8 training step's: at least this x XLA's bf16 step, its last loss within
# FP8_TRAIN_LOSS (2%) of bf16's after FP8_TRAIN_STEPS steps (training.GPU_FP8_MODEL's).
FP8_TRAIN_TARGET = 1.25
FP8_TRAIN_LOSS = 0.02
FP8_TRAIN_STEPS = 100
STRONGEST_NOTE = (
    "XLA's baselines of a problem: its scaled form with b stored (K, N) and with b stored "
    "(N, K) (per tensor `(jnp.dot(a8, b8, f32) * (sa * sb)).astype(bf16)`, `dot_f32*scales`; "
    "block scales the `xla` backend's fori_loop over 128-wide K blocks, "
    "`scaled_matmul[xla]`), and with block scales the operands dequantized to bf16 then XLA's "
    "bf16 dot; every ratio is against the fastest of them (the CSV's `xla_ref`; issue 44), "
    "each timed interleaved with the scaled form in the problem's own layout and compared "
    "through it.")
FP8_TARGETS_NOTE = (
    "Each target against this run's rows (bf16 output): TFLOP/s count 2 M K N; ratios are "
    "against the strongest of XLA's baselines of the same problem timed in the same run "
    "(issue 28 stated them against the scaled form in the problem's layout, which the "
    f"strongest is or beats). {STRONGEST_NOTE} Cells: TFLOP/s (vs the strongest). `met` "
    "where a jaxgemm kernel (not the `xla` backend) reaches it. The training step: "
    "`jaxgemm.matmul(x, w, fp8=recipe)` in the layers against the same model's bf16 step on "
    "XLA, step time ratio (XLA's bf16 step timed beside it / the FP8 step) and the last "
    f"step's loss against bf16's (target after {FP8_TRAIN_STEPS} steps).")
FP8_TABLE_NOTE = (
    "Cells: TFLOP/s (2 M K N over the median time) and each one's speedup over the "
    "problem's strongest XLA baseline (named in its column), all timed in the same run. "
    f"{STRONGEST_NOTE} For comparison only: `XLA fp8 dot`, `lax.dot_general(a8, b8, "
    "preferred_element_type=bf16)` without scales; `XLA bf16 dot (dequantized "
    "beforehand)`, the dot of the dequantized values in bf16, their dequantization not "
    "timed. Every result is checked first against the exact product of the dequantized "
    "operands (fp32, HIGHEST). dgrad (NT) and wgrad (TN) are a layer's backward GEMMs, with "
    "the recipe's gradient dtype.")


def _fp8_train_cell(r: dict) -> tuple[str, float | None, float | None]:
  """(cell, speedup, last-step loss rel diff) of an FP8 step row."""
  if r["status"] != "ok":
    return r["status"], None, None
  s, d = num(r.get("speedup_vs_xla")), num(r.get("loss_last_rel_diff"))
  text = step_vs_xla(r, 2)
  if d is not None:
    text += f", loss {100 * d:.2f}% off"
  return text, s, d


def fp8_targets_table(run) -> list[str]:
  """Issue 28's targets against this run: XLA's programs, each backend's best variant and
  the default; `met` where one of jaxgemm's kernels (a backend other than xla, or the
  default) reaches the target."""
  suites = [s for s in run.suites if base_suite(s) in FP8_SUITES]
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["suite"] in FP8_SUITES]
  bs = [*backends_in(run, suites), *([AUTO] if run.has_auto or any(
      r["backend"] == AUTO for r in steps) else [])]
  ours = [b for b in bs if b != "xla"]
  rows = []
  for problem, kind, target in FP8_TARGETS:
    suite = next((s for s in suites if any(p["problem"] == problem for p in run.problems(s))),
                 None)
    if suite is None:
      continue
    ref = next(p for p in run.problems(suite) if p["problem"] == problem)
    cells = _baseline_cells(run, suite, ref)
    values = []
    for b in bs:
      r = pick(run, suite, problem, b)
      cells.append(_fp8_cell(run, suite, problem, b))
      if r is not None and b in ours:
        values.append(num(r["tflops"]) if kind == "tflops" else num(r["speedup_vs_xla"]))
    outcome = "not measured" if not values else verdict(run, max(values) >= target)
    text = f">= {target:,.0f} TFLOP/s" if kind == "tflops" else f">= {target:g}x XLA's strongest"
    rows.append([f"{problem} ({shape(ref)}, {ref.get('scaling')} scales)", text, *cells,
                 outcome])
  models = list(dict.fromkeys(r["problem"] for r in steps))
  for model in models:
    ref = ref_step(steps, model)
    recipes = list(dict.fromkeys(r["variant"] for r in steps
                                 if r["problem"] == model and r["backend"] != REF))
    for recipe in recipes:
      cells = ["-", f"{num(ref['time_ms_median']):.2f} ms (bf16 step)"
               if ref and ref["status"] == "ok" else (ref["status"] if ref else "-"), "-"]
      met, measured = False, False
      n_steps = 0
      for b in bs:
        rr = [r for r in steps if r["problem"] == model and r["backend"] == b
              and r["variant"] == recipe]
        if not rr:
          cells.append("-")
          continue
        cell, sp, d = _fp8_train_cell(rr[0])
        cells.append(cell)
        if sp is not None and d is not None and b in ours:
          measured = True
          n_steps = max(n_steps, int(num(rr[0].get("steps")) or 0))
          met |= sp >= FP8_TRAIN_TARGET and d <= FP8_TRAIN_LOSS
      outcome = ("not measured" if not measured else
                 f"not measured ({n_steps} steps)" if n_steps < FP8_TRAIN_STEPS and run.on_gpu
                 else verdict(run, met))
      rows.append([f"FP8 training step ({model}), {recipe}",
                   f">= {FP8_TRAIN_TARGET:g}x XLA's bf16 step, last loss within "
                   f"{100 * FP8_TRAIN_LOSS:g}%", *cells, outcome])
  if not rows:
    return []
  return table(["problem", "target", SCALED_KN, SCALED_NK, PEER_LABELS[DEQUANT_BF16],
                 *["default (auto)" if b == AUTO else f"{b} (best variant)" for b in bs], ""],
                rows)


# Issue 44's FP8 targets for the default (`auto`), by scaling: (at least this x the strongest
# XLA baseline, on problems of at most this many rows; None: all). Per tensor that is the
# faster of XLA's two layouts (worst problem >= 0.98x); with block scales at up to 256 rows
# the dequantized bf16 dot or faster (>= 1.00x).
AUTO_TARGETS = {"tensor": (0.98, None), "block": (1.00, 256)}


def fp8_baselines_table(run) -> list[str]:
  """Issue 44's FP8 targets: on each problem they cover, the strongest XLA baseline and the
  default's speedup over it, then the worst per scaling."""
  rows, worst = [], {}
  for suite in (s for s in run.suites if base_suite(s) in FP8_SUITES):
    for p in run.problems(suite):
      target, max_rows = AUTO_TARGETS.get(p.get("scaling"), (None, None))
      if target is None or (max_rows is not None and int(p["m"]) > max_rows):
        continue
      name = p["problem"]
      best, ref_ratio = strongest(run, suite, p)
      best_row = p if best == p["variant"] else run.row(suite, name, PEER, best)
      cell = _tflops(best_row)
      a = run.auto(suite, name)
      s = num(a.get("speedup_vs_xla")) if a is not None and a["status"] == "ok" else None
      if ref_ratio is None or s is None:
        outcome = "not measured" if ref_ratio is not None else "not measured (no baselines)"
      else:
        outcome = verdict(run, s >= target)
        if s < worst.get(p["scaling"], (math.inf, ""))[0]:
          worst[p["scaling"]] = (s, name)
      rows.append([name, p.get("layout", ""), shape(p), f"{_baseline_name(best, p)}: {cell}",
                   "-" if a is None else f"{_tf_x(a)} {a.get('chosen') or ''}".strip(),
                   f">= {target:.2f}x", outcome])
  if not rows:
    return []
  lines = table(["problem", "layout", "MxKxN", "strongest XLA baseline: TFLOP/s",
                 "default (auto) TFLOP/s (vs it), chose", "target", ""], rows)
  for scaling, (s, name) in worst.items():
    target = AUTO_TARGETS[scaling][0]
    lines += ["", f"Worst, {scaling} scales: {fmt_x(s)} ({name}), target >= {target:.2f}x: "
                  f"{verdict(run, s >= target)}."]
  return lines


def _suite_table(run, suite: str) -> list[str]:
  return [FP8_TABLE_NOTE, "", *fp8_table(run, suite)]


def _targets(run) -> list[str]:
  rows = fp8_targets_table(run)
  return [FP8_TARGETS_NOTE, "", *rows] if rows else []


BASELINES_NOTE = (
    "Issue 44's FP8 targets for the default (`auto`, bf16 output): per tensor at least 0.98x "
    "the faster of XLA's two layouts on every problem; with block scales at up to 256 rows at "
    "least 1.00x dequantize + XLA's bf16 dot. Both against the problem's strongest XLA "
    f"baseline. {STRONGEST_NOTE}")


def _baselines(run) -> list[str]:
  rows = fp8_baselines_table(run)
  return [BASELINES_NOTE, "", *rows] if rows else []


def _last_loss_cell(r: dict) -> str:
  """The FP8 model's training column: the last step's loss against bf16's (the issue's
  number)."""
  d = num(r.get("loss_last_rel_diff"))
  return f"{d:.2e}" if d is not None else "-"


# ---------------------------------------------------------------- the entry

ENTRY = BenchOp(
    name="scaled_matmul", order=40, ops=(OP,), family="fp8",
    suites=(
        Suite("fp8", "FP8 GEMMs (scaled_matmul, issue 28): e4m3 -> bf16 with per-tensor and block "
              "scales at 8192^3, 8192x4096x14336, 4096^3, 128x4096x14336 and a layer's dgrad "
              "and wgrad, vs XLA's strongest baseline (its scaled form with b (K, N) or (N, "
              "K); block scales: or dequantize + bf16 dot), beside its fp8 dot and bf16 dot; "
              "an FP8 training step", FP8_SUITES["fp8"], runner="fp8",
              list_note="then an FP8 training step (bench/training.py)"),
        Suite("fp8-tiny", "the fp8 suite's CPU analogue (interpreters)", FP8_SUITES["fp8-tiny"],
              runner="fp8", cpu_default=True,
              list_note="then an FP8 training step (bench/training.py)"),
    ),
    # Less than the other suites' 450 s: the FP8 step's last run, the xla backend's block
    # recipe (a fori_loop over K blocks per GEMM, ~0.4 s a step at d_model 4096 by the
    # estimate in bench/README.md), takes ~60-90 s where the others take 20-40 s (the H100's
    # d_model 1024 steps compiled in 3-24 s: the epilogue suite at 2626589, H100).
    gpu_time_budget_s=420.0,
    extra_variants=tuple(FP8_VARIANT_PREFIX + r for r in (*FP8_RECIPES, *FP8_OPTION_RECIPES)),
    peers=(PEER,),
    suite_table=_suite_table, suite_title="Suite `{suite}` (FP8 GEMMs)",
    readme_suite_title="FP8 GEMMs: suite `{suite}`",
    targets=(Section("FP8 GEMM targets (issue 28)", _targets,
                     readme_title="FP8 GEMM targets (issue 28)"),
             Section("FP8 against XLA's strongest baseline (issue 44)", _baselines,
                     readme_title="FP8 against XLA's strongest baseline (issue 44)")),
    train_ref_label="XLA dot (bf16)",
    step_columns=(("last-step loss rel diff vs XLA", _last_loss_cell),),
)
