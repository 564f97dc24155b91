"""scaled_ragged_dot's entry: the fp8-moe suites (FP8 grouped GEMMs with scales, issue 45,
then an FP8 MoE training step), their table and the issue's targets.

The problems run in bench/fp8_moe.py (`fp8_moe.run_suite`).
"""

from __future__ import annotations

import dataclasses
import math

from ..entry import BenchOp, Section, Suite
from ..report.csvio import AUTO, num
from ..report.markdown import (backends_in, base_suite, fmt_t, fmt_x, pick, shape, step_vs_xla,
                               table, us, verdict)
from .ragged_dot import _roofline

OP = "scaled_ragged_dot"
# The problems' modes: "fwd", the contiguous grouped GEMM (tokens (M, K) times each
# expert's (K, N), out (M, N)), and "wgrad", the ragged-K form, a mixture-of-experts weight
# gradient (tokens (M, K) and dY (M, N), both ragged in M, out (G, K, N): per group
# x[rows g]^T @ dy[rows g]; `scaled_ragged_dot(..., ragged_dot_dimension_numbers=
# RAGGED_K_NUMBERS)`). XLA's grouped GEMM of each, and jaxgemm's bf16 entry of each:
XLA_OPS = {"fwd": "lax.ragged_dot", "wgrad": "lax.ragged_dot_general"}
BF16_OPS = {"fwd": "ragged_dot", "wgrad": "ragged_dot_general"}
MODES = tuple(XLA_OPS)


# The programs measured beside the kernels (not jaxgemm backends of this op), their rows'
# `backend` (the variants, named for the mode's programs: `Fp8MoeProblem.peers`):
# * XLA_PEER: the fp8 operands dequantized to bf16 in the program, then XLA's grouped GEMM
#   ("dequantize+lax.ragged_dot"): what a user with fp8 weights and no FP8 grouped GEMM
#   runs. With the reference, XLA's baselines: every ratio is against the faster of the two.
# * BF16_PEER: jaxgemm's own bf16 grouped GEMM ("ragged_dot[auto]": `jaxgemm.ragged_dot`, or
#   `jaxgemm.ragged_dot_general` for wgrad, with its default, backend="auto") on the
#   dequantized bf16 operands: each kernel row's `speedup_vs_bf16` is our FP8 over our bf16.
XLA_PEER, BF16_PEER = "xla_peer", "jaxgemm_bf16"
FP8_NAMES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


@dataclasses.dataclass(frozen=True)
class Fp8MoeProblem:
  """One FP8 grouped GEMM, bf16 out, of one mode (`MODES`):

  * "fwd": lhs (M, K) fp8 tokens sorted by expert times rhs (G, K, N) fp8 experts, out
    (M, N), rows past sum(group_sizes) zeros; scales as `jaxgemm.quantize` returns them
    ("tensor": one each; "block": 1x128 blocks of lhs along K, 128x128 blocks of each
    expert);
  * "wgrad", the ragged-K form (the weight gradient): lhs (M, K) fp8 tokens and rhs (M, N)
    fp8 dY, both ragged in M, out (G, K, N) = per group lhs[rows g]^T @ rhs[rows g] (an
    empty group's zeros; rows past sum(group_sizes) contribute nothing); "block": 128x1
    blocks of both along the contracted M (`quantize(x, block=(128, 1))`, DeepSeek-V3's
    wgrad operands), "tensor": one scale each.

  The group sizes are a Dirichlet(2) split of M drawn as the moe suites draw theirs
  (`moe.group_sizes`), or fixed ones (the tiny suite's edge cases).

  >>> p = Fp8MoeProblem("fp8-moe", "g4.m32768.k7168.n4096.wgrad.block",
  ...                   "g4.m32768.k7168.n4096", "block", 4, 32768, 7168, 4096, mode="wgrad")
  >>> p.lhs_shape(), p.rhs_shape(), p.out_shape(), p.b_block(), p.ref_variant
  ((32768, 7168), (32768, 4096), (4, 7168, 4096), (128, 1), 'lax.ragged_dot_general[bf16 dequantized]')
  """

  suite: str
  name: str
  layer: str
  scaling: str            # "tensor" or "block"
  groups: int
  m: int
  k: int
  n: int
  mode: str = "fwd"       # "fwd" or "wgrad" (above)
  group_sizes: tuple[int, ...] | None = None
  active_groups: int | None = None   # experts with tokens (the runner fills it in)
  default: bool = True
  quick: bool = False
  note: str = ""
  a_dtype: str = "float8_e4m3fn"
  b_dtype: str = "float8_e4m3fn"

  op = OP
  batch = 1
  trans_a = trans_b = False
  ladder = False
  dtype = "bf16"          # the output's, whatever the run's --dtype
  peak_dtype = "fp8"      # pct_peak and memory_bound against the FP8 dense peak

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"{self.name}: mode={self.mode!r} must be one of {MODES}")
    if self.scaling not in ("tensor", "block"):
      raise ValueError(f"{self.name}: scaling={self.scaling!r} must be 'tensor' or 'block'")

  @property
  def wgrad(self) -> bool:
    return self.mode == "wgrad"

  @property
  def layout(self) -> str:
    """The moe suites' names: "NN" (fwd), "TN" (wgrad: lhs contracted over its rows)."""
    return "TN" if self.wgrad else "NN"

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n

  @property
  def fp8_dtypes(self) -> str:
    return f"{FP8_NAMES[self.a_dtype]}x{FP8_NAMES[self.b_dtype]}"

  @property
  def ref_variant(self) -> str:
    """XLA's reference (bench/fp8_moe.py): its mode's grouped GEMM in bf16 on the operands
    dequantized beforehand, the strongest grouped GEMM a JAX user has on Hopper without
    FP8 kernels; every other row is timed interleaved with it."""
    return f"{XLA_OPS[self.mode]}[bf16 dequantized]"

  @property
  def peers(self) -> tuple[tuple[str, str], ...]:
    """(backend, variant) of the programs measured beside the kernels, in the order they
    run: XLA's dequantization followed by its grouped GEMM, then our bf16 grouped GEMM."""
    return ((XLA_PEER, f"dequantize+{XLA_OPS[self.mode]}"),
            (BF16_PEER, f"{BF16_OPS[self.mode]}[auto]"))

  @property
  def baselines(self) -> tuple[str, ...]:
    """XLA's baselines among the peers' variants (with the reference: the faster counts)."""
    return (self.peers[0][1],)

  def a_block(self) -> tuple[int, int] | None:
    if self.scaling == "tensor":
      return None
    return (128, 1) if self.wgrad else (1, 128)

  def b_block(self) -> tuple[int, int] | None:
    """rhs's `quantize` block: of each expert (G is a batch dimension) for fwd, of dY for
    wgrad."""
    if self.scaling == "tensor":
      return None
    return (128, 1) if self.wgrad else (128, 128)

  def lhs_shape(self) -> tuple[int, int]:
    return (self.m, self.k)

  def rhs_shape(self) -> tuple[int, ...]:
    return (self.m, self.n) if self.wgrad else (self.groups, self.k, self.n)

  def out_shape(self) -> tuple[int, ...]:
    return (self.groups, self.k, self.n) if self.wgrad else (self.m, self.n)

  def active(self) -> int:
    return self.groups if self.active_groups is None else self.active_groups

  def scale_elems(self) -> int:
    """float32 scales read: of lhs, and of rhs (fwd: of the experts that have tokens)."""
    if self.scaling == "tensor":
      return 2
    if self.wgrad:   # 128x1 blocks of both, along M
      return -(-self.m // 128) * (self.k + self.n)
    kb, nb = -(-self.k // 128), -(-self.n // 128)
    return self.m * kb + self.active() * kb * nb

  def min_bytes(self, dtype_name: str = "bf16") -> int:
    """The fp8 operands and the float32 scales read once, the bf16 output written once.
    fwd: the fp8 lhs and the fp8 weights of the experts that have tokens (`active_groups`,
    else all G); wgrad: the fp8 lhs and dY, and every group's (K, N) block of the output
    (an empty group's zeros are written too)."""
    rhs = self.m * self.n if self.wgrad else self.active() * self.k * self.n
    return (self.m * self.k + rhs + 4 * self.scale_elems()
            + 2 * math.prod(self.out_shape()))

  def size_label(self) -> str:
    return f"G{self.groups} {self.m}x{self.k}x{self.n} {self.scaling}" + (
        " wgrad" if self.wgrad else "")

  def csv_fields(self, dtype_name: str) -> dict:
    """The problem's columns of a CSV row (`runner.base_row`)."""
    return {
        "batch": 1, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": 0, "flops": self.flops, "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note, "groups": self.groups, "mode": self.mode,
        "layer": self.layer, "scaling": self.scaling, "fp8_dtypes": self.fp8_dtypes,
        "xla_ref": self.ref_variant,
        "active_groups": "" if self.active_groups is None else self.active_groups,
        "group_sizes": "" if self.group_sizes is None else " ".join(map(str, self.group_sizes)),
    }


# Issue 45's FP8 shapes: (layer, G, M, K, N, {mode: scalings}, quick, note). Block scales
# on every one (the DeepSeek-V3 recipe, the targets), per tensor on three; the
# weight gradient (ragged-K, DeepGEMM's k-grouped wgrad: out (G, K, N)) at the contiguous
# shapes and Qwen3-MoE's.
FP8_MOE_LAYERS = (
    ("g4.m32768.k7168.n4096", 4, 32768, 7168, 4096,
     {"fwd": ("block", "tensor"), "wgrad": ("block",)}, True,
     "contiguous: 4 experts x 8192 tokens, DeepSeek-V3's K (DeepGEMM's grouped shape)"),
    ("g8.m32768.k4096.n7168", 8, 32768, 4096, 7168, {"fwd": ("block",), "wgrad": ("block",)},
     False, "contiguous: 8 experts x 4096 tokens (DeepGEMM's grouped shape)"),
    ("g128.m16384.k2048.n768", 128, 16384, 2048, 768,
     {"fwd": ("block", "tensor"), "wgrad": ("block",)}, True,
     "Qwen3-30B-A3B: 128 experts of 2048x768, 16384 tokens"),
    ("g32.m16384.k7168.n4096", 32, 16384, 7168, 4096, {"fwd": ("block",)}, False,
     "DeepSeek-V3 on 8-way expert parallelism: 32 local experts, gate and up fused"),
    ("g64.m256.k2048.n1408", 64, 256, 2048, 1408, {"fwd": ("block", "tensor")}, True,
     "decode: 256 tokens over 64 experts' 185 MB of fp8 weights"),
)
# The CPU's analogues (interpreters): (layer, G, M, K, N, {mode: scalings}, quick, fixed
# sizes, note), with the edge cases: empty groups, a one-row group, rows past
# sum(group_sizes) (zeros; in wgrad, rows that must add nothing), partial 128-wide blocks of
# K and N, a decode-sized M; in wgrad, groups that are not multiples of 128 rows, a 128-row
# scale block holding two groups' rows, a group across a block boundary, a partial last
# block.
FP8_MOE_TINY_LAYERS = (
    ("g4.m64.k256.n128", 4, 64, 256, 128, {"fwd": ("block", "tensor")}, True, None,
     "Dirichlet(2) split, two K blocks"),
    ("g8.m48.k256.n64.edges", 8, 48, 256, 64, {"fwd": ("block",)}, False,
     (10, 0, 1, 20, 0, 9, 8, 0), "empty groups and a group of one row; N below one block"),
    ("g4.m40.k200.n72.tail", 4, 40, 200, 72, {"fwd": ("block", "tensor")}, False,
     (5, 10, 0, 15), "rows past sum(group_sizes) (zeros); partial K and N blocks"),
    ("g4.m8.k128.n256", 4, 8, 128, 256, {"fwd": ("block",)}, True, None, "decode"),
    ("g5.m320.k192.n80.edges", 5, 320, 192, 80, {"wgrad": ("block", "tensor")}, False,
     (100, 0, 150, 40, 0), "empty groups; groups of 100, 150 and 40 rows (not multiples "
     "of 128): the 100 and the 150 share the first 128-row scale block, the 40 crosses row "
     "256; rows 290-319 past sum(group_sizes) (they add nothing), in a partial last block"),
)
# The order of a suite's problems: block scales first (the targets), the forward
# before the weight gradient, then per tensor: a run stopped by its time budget has
# measured the forward targets, then the weight gradient's.
ORDER = (("block", "fwd"), ("block", "wgrad"), ("tensor", "fwd"), ("tensor", "wgrad"))


def _problems(suite: str, layers, tiny: bool = False) -> list[Fp8MoeProblem]:
  """The layers' problems in `ORDER`; names `<layer>.<scaling>` (fwd) and
  `<layer>.wgrad.<scaling>`. Only the forward problems are quick (as the moe suites')."""
  out = []
  for scaling, mode in ORDER:
    for row in layers:
      if tiny:
        layer, g, m, k, n, scalings, quick, sizes, note = row
      else:
        (layer, g, m, k, n, scalings, quick, note), sizes = row, None
      if scaling in scalings.get(mode, ()):
        wgrad = mode == "wgrad"
        out.append(Fp8MoeProblem(
            suite, f"{layer}.wgrad.{scaling}" if wgrad else f"{layer}.{scaling}", layer,
            scaling, g, m, k, n, mode=mode, group_sizes=sizes, quick=quick and not wgrad,
            note=f"{note}; {'weight gradient (ragged-K); ' if wgrad else ''}{scaling} scales"))
  return out


FP8_MOE_SUITES: dict[str, list[Fp8MoeProblem]] = {
    "fp8-moe": _problems("fp8-moe", FP8_MOE_LAYERS),
    "fp8-moe-tiny": _problems("fp8-moe-tiny", FP8_MOE_TINY_LAYERS, tiny=True),
}

# ---------------------------------------------------------------- the report

TABLE_NOTE = (
    "`G (with tokens)`: experts, and those with tokens (a Dirichlet(2) split of M, the moe "
    "suites' seed). Operands e4m3, bf16 out. Cells: TFLOP/s (2 M K N over the median time), "
    "then its speedup over the faster of XLA's baselines (`lax.ragged_dot` in bf16 on the "
    "operands dequantized beforehand, and the dequantization in the program followed by it), "
    "and for our FP8 kernels their speedup over our bf16 `jaxgemm.ragged_dot` on the "
    "dequantized operands (`vs bf16`); all timed interleaved with XLA's in the same run. Every "
    "result is checked first against the exact product of the dequantized operands (fp32, "
    "HIGHEST). The last column: the time and fraction of the bandwidth roofline (min bytes: "
    "the fp8 lhs, the fp8 weights of the experts with tokens, the fp32 scales, the bf16 "
    "output; against the run's measured copy bandwidth) of memory-bound rows. The weight "
    "gradient's rows (`.wgrad.`, the ragged-K form: x (M, K) and dY (M, N) ragged in M, out "
    "(G, K, N), 128x1 block scales along M): XLA's `lax.ragged_dot_general` and our bf16 "
    "`jaxgemm.ragged_dot_general` with the ragged-K dimension numbers in those columns; their "
    "min bytes: the fp8 x and dY, the scales, every group's bf16 (K, N) block.")


def _cell(r: dict | None, label: bool = True) -> str:
  """'1,210.3 (9.8x; 1.71x bf16) grouped': TFLOP/s, vs XLA's strongest, vs our bf16."""
  if r is None:
    return "-"
  if r["status"] != "ok":
    return r["status"]
  t = num(r["tflops"])
  text = f"{t:,.1f}" if t >= 1 else fmt_t(t)
  parts = [fmt_x(s) for s in (num(r.get("speedup_vs_xla")),) if s is not None]
  b = num(r.get("speedup_vs_bf16"))
  if b is not None:
    parts.append(f"{fmt_x(b)} bf16")
  if parts:
    text += f" ({'; '.join(parts)})"
  v = r["variant"]
  return text + (f" {v}" if label and v not in ("default", "(default)") else "")


def _kernel_cell(run, suite: str, problem: str, backend: str) -> str:
  best = pick(run, suite, problem, backend)
  if best is None:
    st = sorted({r["status"] for r in run.kernel_rows(suite, problem) if r["backend"] == backend})
    return "/".join(st) or "-"
  return _cell(best)


def _ref_vs_strongest(dequant: dict | None) -> float:
  """The reference's speedup over the faster XLA baseline: 1, or 1 / the other baseline's
  speedup over it (read when the two were timed interleaved) where that one is faster.
  The reference's row is written before the baseline is timed, so its own ratio is 1."""
  s = num(dequant.get("speedup_vs_paired")) if dequant and dequant["status"] == "ok" else None
  return 1 / s if s and s > 1 else 1.0


def fp8_moe_table(run, suite: str) -> list[str]:
  """An fp8-moe suite's problems: TFLOP/s of XLA's baselines, our bf16 grouped GEMM, the
  default and each backend (best variant) with their ratios, and the roofline."""
  bs = backends_in(run, [suite])
  rows = []
  for p in run.problems(suite):
    name = p["problem"]
    # One row of each peer a problem (its variant names its mode's program).
    peers = (run.row(suite, name, XLA_PEER), run.row(suite, name, BF16_PEER))
    ref = _cell(dict(p, speedup_vs_xla=_ref_vs_strongest(peers[0])), label=False)
    row = [name, p.get("scaling", ""), f"{p.get('groups')} ({p.get('active_groups') or '?'})",
           shape(p), ref, *(_cell(x, label=False) for x in peers)]
    if run.has_auto:
      a = run.auto(suite, name)
      row.append("-" if a is None else f"{_cell(a)} {a.get('chosen') or ''}".strip())
    row += [_kernel_cell(run, suite, name, b) for b in bs]
    parts = []
    if p.get("memory_bound") == "1":
      for who, r in (("XLA", p if p["status"] == "ok" else None), ("bf16", peers[1]),
                     *((b, pick(run, suite, name, b)) for b in bs)):
        if r is not None and r["status"] == "ok" and _roofline(r) is not None:
          parts.append(f"{who} {us(r)} {_roofline(r):.2f}x")
    row.append("; ".join(parts))
    rows.append(row)
  header = ["problem", "scales", "G (with tokens)", "MxKxN",
            "XLA lax.ragged_dot bf16 (dequantized beforehand)",
            "dequantize + XLA lax.ragged_dot", "jaxgemm bf16 ragged_dot (auto)",
            *(["default (auto), chose"] if run.has_auto else []), *bs,
            "memory bound: time, fraction of the bandwidth roofline"]
  return table(header, rows)


# Issue 45's FP8 targets (H100; bf16 out): (problem, kind, threshold, as the issue says it).
# Kinds: "tflops" (at least), "roofline" (min bytes / time / copy bandwidth, at least),
# "train" (the FP8 MoE step's speedup over our bf16 MoE step, at least).
FP8_MOE_TARGETS = (
    ("g4.m32768.k7168.n4096.block", "tflops", 1200.0, ">= 1200 TFLOP/s (contiguous)"),
    ("g8.m32768.k4096.n7168.block", "tflops", 1200.0, ">= 1200 TFLOP/s (contiguous)"),
    ("g128.m16384.k2048.n768.block", "tflops", 600.0, ">= 600 TFLOP/s"),
    ("g4.m32768.k7168.n4096.wgrad.block", "tflops", 900.0,
     ">= 900 TFLOP/s (k-grouped weight gradient)"),
    ("g8.m32768.k4096.n7168.wgrad.block", "tflops", 900.0,
     ">= 900 TFLOP/s (k-grouped weight gradient)"),
    ("g64.m256.k2048.n1408.block", "roofline", 0.90, ">= 0.90x of the bandwidth roofline"),
    ("FP8 MoE training step", "train", 1.4, ">= 1.4x our bf16 MoE step (same model)"),
)
TARGETS_NOTE = (
    "Each target against this run's rows (`.wgrad.`: the k-grouped weight gradient, the "
    "ragged-K form): TFLOP/s count 2 M K N; the roofline is the "
    "minimum bytes (fp8 lhs, the fp8 weights of the experts with tokens, fp32 scales, bf16 "
    "output) over the time, against the run's measured copy bandwidth. `met` where one of "
    "jaxgemm's FP8 kernels (a backend other than xla, or the default) reaches it; `not "
    "measured` where the run has no such row. The training step: our FP8 MoE step "
    "(`jaxgemm.ragged_dot(x, w, gs, fp8=recipe)` in the experts) over our bf16 MoE step on "
    "the same backend, each read against XLA's bf16 step timed beside it.")


def _target_value(kind: str, r: dict | None) -> tuple[float | None, str]:
  if r is None:
    return None, "-"
  if r["status"] != "ok":
    return None, r["status"]
  if kind == "tflops":
    t = num(r["tflops"])
    return t, f"{t:,.1f} TFLOP/s"
  rf = _roofline(r)
  return rf, "-" if rf is None else f"{rf:.2f}x ({us(r)})"


def _train_rows(run, bs: list[str]) -> list[list[str]]:
  """The FP8 MoE step's target, one row per recipe: each backend's FP8 step over its own
  bf16 step (both against XLA's step timed beside them)."""
  steps = [r for r in run.rows if r["kind"] == "train_step" and r["suite"] in FP8_MOE_SUITES]
  out = []
  for model in dict.fromkeys(r["problem"] for r in steps):
    mine = [r for r in steps if r["problem"] == model]
    recipes = [v for v in dict.fromkeys(r["variant"] for r in mine) if v.startswith("fp8=")]
    for recipe in recipes:
      cells, values = [], []
      for b in bs:
        fp8 = next((r for r in mine if r["backend"] == b and r["variant"] == recipe), None)
        bf16 = next((r for r in mine if r["backend"] == b and not r["variant"].startswith(
            "fp8=")), None)
        if fp8 is None or fp8["status"] != "ok":
          cells.append(fp8["status"] if fp8 else "-")
          continue
        s, s16 = num(fp8.get("speedup_vs_xla")), bf16 and num(bf16.get("speedup_vs_xla"))
        if bf16 is None or bf16["status"] != "ok" or not s or not s16:
          cells.append(f"{step_vs_xla(fp8, 2)} (no bf16 step)")
          continue
        cells.append(f"{fmt_x(s / s16)} ({step_vs_xla(fp8, 2)}; bf16 {step_vs_xla(bf16, 2)})")
        if b != "xla":
          values.append(s / s16)
      outcome = "not measured" if not values else verdict(run, max(values) >= 1.4)
      out.append([f"FP8 MoE training step ({model}), {recipe}",
                  ">= 1.4x our bf16 MoE step (same model)", *cells, outcome])
  return out


def fp8_moe_targets_table(run) -> list[str]:
  """Issue 45's FP8 targets against this run; a target whose problem the run has no row
  of is listed `not measured`."""
  suites = [s for s in run.suites if base_suite(s) in FP8_MOE_SUITES]
  steps = any(r["kind"] == "train_step" and r["suite"] in FP8_MOE_SUITES for r in run.rows)
  if not suites and not steps:
    return []
  has_auto = any(run.auto(s, p["problem"]) for s in suites for p in run.problems(s))
  bs = backends_in(run, suites) + ([AUTO] if has_auto else [])
  if steps:
    bs += [b for b in dict.fromkeys(r["backend"] for r in run.rows if r["kind"] == "train_step"
                                    and r["suite"] in FP8_MOE_SUITES and r["backend"] not in bs
                                    and r["backend"] != "xla_dot")]
  rows = []
  for problem, kind, target, text in FP8_MOE_TARGETS:
    if kind == "train":
      rows += _train_rows(run, bs)
      continue
    suite = next((s for s in suites if any(p["problem"] == problem for p in run.problems(s))),
                 None)
    if suite is None:
      if any(base_suite(s) == "fp8-moe" for s in suites):   # a GPU run that left it out
        rows.append([problem, text, *["-"] * len(bs), "not measured"])
      continue
    cells, values = [], []
    for b in bs:
      v, c = _target_value(kind, pick(run, suite, problem, b))
      cells.append(c)
      if v is not None and b != "xla":
        values.append(v)
    outcome = "not measured" if not values else verdict(run, max(values) >= target)
    ref = next(p for p in run.problems(suite) if p["problem"] == problem)
    rows.append([f"{problem} (G={ref.get('groups')}, {shape(ref)})", text, *cells, outcome])
  if not rows:
    return []
  return table(["problem", "target", *["default (auto)" if b == AUTO else f"{b} (best variant)"
                                       for b in bs], ""], rows)


def _suite_table(run, suite: str) -> list[str]:
  return [TABLE_NOTE, "", *fp8_moe_table(run, suite)]


def _targets(run) -> list[str]:
  rows = fp8_moe_targets_table(run)
  return [TARGETS_NOTE, "", *rows] if rows else []


# ---------------------------------------------------------------- the entry

ENTRY = BenchOp(
    name="scaled_ragged_dot", order=45, ops=(OP, "ragged_dot"), family="fp8-moe",
    suites=(
        Suite("fp8-moe", "FP8 grouped GEMMs (scaled_ragged_dot, issue 45): e4m3 -> bf16 with "
              "block (1x128 / 128x128 per expert) and per-tensor scales at G=4 M=32768 "
              "K=7168 N=4096, G=8 M=32768 K=4096 N=7168, Qwen3-MoE's G=128, DeepSeek-V3 at "
              "EP8 (G=32) and decode (G=64 M=256); the k-grouped weight gradient (ragged-K, "
              "128x1 block scales along M) at G=4, G=8 and G=128; vs lax.ragged_dot(_general) "
              "in bf16 and our bf16 ragged_dot(_general); an FP8 MoE training step",
              FP8_MOE_SUITES["fp8-moe"],
              runner="fp8_moe", list_note="then an FP8 MoE training step (bench/training.py)"),
        Suite("fp8-moe-tiny", "the fp8-moe suite's CPU analogue (interpreters; empty groups, "
              "a one-row group, rows past sum(group_sizes); a weight gradient whose groups "
              "share and cross 128-row scale blocks)", FP8_MOE_SUITES["fp8-moe-tiny"],
              runner="fp8_moe", cpu_default=True,
              list_note="then an FP8 MoE training step (bench/training.py)"),
    ),
    # As the fp8 suites: the FP8 step's block recipe on the xla backend is the slowest run.
    gpu_time_budget_s=420.0,
    extra_variants=tuple(f"fp8={r}" for r in ("tensor", "block")),
    peers=(XLA_PEER, BF16_PEER),
    suite_table=_suite_table, suite_title="Suite `{suite}` (FP8 grouped GEMMs)",
    readme_suite_title="FP8 grouped GEMMs: suite `{suite}`",
    targets=(Section("FP8 grouped GEMM targets (issue 45)", _targets,
                     readme_title="FP8 grouped GEMM targets (issue 45)"),),
    train_ref_label="XLA lax.ragged_dot (bf16)",
)
