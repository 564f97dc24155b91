"""The benchmark problems, as data: one row per GEMM, grouped in named suites.

Every problem is C = op(A) @ op(B) with op = transpose where flagged:

    A: (M, K), or (K, M) with trans_a     (a leading (batch,) when batch > 1)
    B: (K, N), or (N, K) with trans_b

The dtype is the run's (``--dtype``) unless a problem pins one. Flags:

* ``default``: in the set ``--suite default`` runs (sized to finish in under
  10 minutes on an H200 with every registered backend);
* ``quick``: in the smaller set ``--quick`` runs;
* ``ladder``: every variant of every backend runs it (the kernel ladder
  table); elsewhere only each backend's best variant runs unless
  ``--variants all`` (or a list of variants) is given.

The same table doubles as test cases (tests/test_bench.py checks its shapes).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

# dtype names of the CLI -> (numpy dtype, lax precision name or None).
# fp32 runs at the default precision, which is TF32 tensor cores on NVIDIA GPUs
# (what jnp.matmul does); fp32-highest asks for true fp32 (precision=HIGHEST).
DTYPES = {
    "bf16": ("bfloat16", None),
    "fp16": ("float16", None),
    "fp32": ("float32", None),
    "fp32-highest": ("float32", "HIGHEST"),
}


@dataclasses.dataclass(frozen=True)
class BenchProblem:
  suite: str
  name: str
  m: int
  k: int
  n: int
  batch: int = 1
  trans_a: bool = False
  trans_b: bool = False
  dtype: str | None = None      # a key of DTYPES; None: the run's dtype
  default: bool = False
  quick: bool = False
  ladder: bool = False
  note: str = ""

  @property
  def layout(self) -> str:
    return ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k

  def a_shape(self) -> tuple[int, ...]:
    s = (self.k, self.m) if self.trans_a else (self.m, self.k)
    return ((self.batch,) if self.batch > 1 else ()) + s

  def b_shape(self) -> tuple[int, ...]:
    s = (self.n, self.k) if self.trans_b else (self.k, self.n)
    return ((self.batch,) if self.batch > 1 else ()) + s

  def out_shape(self) -> tuple[int, ...]:
    return ((self.batch,) if self.batch > 1 else ()) + (self.m, self.n)

  def dimension_numbers(self):
    """lax.dot_general dimension numbers of this problem's stored layout."""
    nb = 1 if self.batch > 1 else 0
    lc = nb if self.trans_a else nb + 1
    rc = nb + 1 if self.trans_b else nb
    batch = ((0,), (0,)) if nb else ((), ())
    return ((lc,), (rc,)), batch

  def min_bytes(self, dtype_name: str) -> int:
    """Each operand read once and C written once, all in the problem's dtype."""
    item = np.dtype(dtype_of(dtype_name)).itemsize
    return item * self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)

  def size_label(self) -> str:
    b = f"{self.batch}x" if self.batch > 1 else ""
    return f"{b}{self.m}x{self.k}x{self.n}"

  def csv_fields(self, dtype_name: str) -> dict:
    """The problem's columns of a CSV row (`runner.base_row`)."""
    return {
        "batch": self.batch, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": int(self.ladder), "flops": self.flops,
        "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note,
    }


def dtype_of(name: str):
  import jax.numpy as jnp  # noqa: PLC0415 (bfloat16 is jax's)
  return jnp.dtype(DTYPES[name][0])


def _p(suite, name, m, k, n, **kw):
  return BenchProblem(suite, name, m, k, n, **kw)


# ---------------------------------------------------------------- square

def _square():
  sizes = [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192,
           12288, 16384]
  default = {256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 16384}
  quick = {1024, 4096, 8192}
  ladder = {2048, 4096, 8192}
  return [_p("square", f"sq{s}", s, s, s, default=s in default, quick=s in quick,
             ladder=s in ladder,
             note="" if s & (s - 1) == 0 else "not a power of two")
          for s in sizes]


# ---------------------------------------------------------------- llm
# Projections of real transformer layers: y = x @ W with x (tokens, in).
# Llama-3-8B: hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336.
# Llama-3-70B: hidden 8192, 64 query heads and 8 KV heads of 128, MLP 28672.
LLM_LAYERS = {
    "llama3-8b": {
        "qkv": (4096, 4096 + 2 * 8 * 128),      # 4096 -> 6144
        "o": (4096, 4096),
        "gate_up": (4096, 2 * 14336),           # fused gate and up: 4096 -> 28672
        "up": (4096, 14336),                    # gate or up alone: 4096 -> 14336
        "down": (14336, 4096),
    },
    "llama3-70b": {
        "qkv": (8192, 8192 + 2 * 8 * 128),      # 8192 -> 10240
        "o": (8192, 8192),
        "gate_up": (8192, 2 * 28672),           # 8192 -> 57344
        "down": (28672, 8192),
    },
}
LLM_TOKENS = (1, 16, 128, 512, 2048, 4096, 8192, 16384)


def _llm():
  out = []
  for model, projs in LLM_LAYERS.items():
    for proj, (d_in, d_out) in projs.items():
      for t in LLM_TOKENS:
        default = (model == "llama3-8b" and t in (128, 2048, 8192)) or (
            model == "llama3-70b" and t == 4096)
        quick = model == "llama3-8b" and t == 2048
        # The MLP shapes of issue 4's table: 8192x4096x14336 and 8192x14336x4096.
        ladder = model == "llama3-8b" and ((proj == "gate_up" and t == 2048) or (
            proj in ("up", "down") and t == 8192))
        out.append(_p("llm", f"{model}.{proj}.t{t}", t, d_in, d_out,
                      default=default, quick=quick, ladder=ladder,
                      note=f"{model} {proj} projection, {t} tokens"))
  return out


# ---------------------------------------------------------------- skinny
# Decode: a handful of tokens against a big weight; memory bound.

def _skinny():
  out = []
  for m in (1, 2, 4, 8, 16, 32, 64, 128, 256):
    out.append(_p("skinny", f"m{m}.k8192.n8192", m, 8192, 8192,
                  default=m in (1, 16, 64, 128, 256), quick=m in (16, 128),
                  ladder=m in (16, 128), note="decode, memory bound"))
  for m in (1, 16, 64, 256):
    out.append(_p("skinny", f"m{m}.k4096.n14336", m, 4096, 14336,
                  default=m in (1, 64), note="llama3-8b up, decode"))
    out.append(_p("skinny", f"m{m}.k14336.n4096", m, 14336, 4096,
                  default=m in (1, 64), note="llama3-8b down, decode"))
  return out


# ---------------------------------------------------------------- unaligned
# Sizes that are not multiples of 8 or 16 (XLA measured 158 TFLOP/s on an H200
# at 4095x4097x4093, against about 815 at 4096^3).

def _unaligned():
  rows = [
      ("u4095x4097x4093", 4095, 4097, 4093, True, True, True),
      ("u2047x2049x2051", 2047, 2049, 2051, True, False, False),
      ("u1000x1000x1000", 1000, 1000, 1000, True, False, False),
      ("u8191x8193x8191", 8191, 8193, 8191, True, False, False),
      ("u4096x4093x4096", 4096, 4093, 4096, True, False, False),  # only K odd
      ("u4097x4096x4096", 4097, 4096, 4096, False, False, False),  # only M odd
      ("u4096x4096x4095", 4096, 4096, 4095, False, False, False),  # only N odd
      ("u127x4099x4097", 127, 4099, 4097, True, False, False),
      ("u12345x4097x3001", 12345, 4097, 3001, False, False, False),
  ]
  return [_p("unaligned", name, m, k, n, default=d, quick=q, ladder=l,
             note="not a multiple of 8 or 16")
          for name, m, k, n, d, q, l in rows]


# ---------------------------------------------------------------- backward
# For a dense layer y = x @ W (x: tokens x d_in, W: d_in x d_out), the forward
# GEMM and both backward GEMMs, in the layouts they are stored in:
#   fwd:   y  = x @ W          M=T,    K=d_in,  N=d_out  NN
#   dgrad: dx = dy @ W^T       M=T,    K=d_out, N=d_in   NT (W stored d_in x d_out)
#   wgrad: dW = x^T @ dy       M=d_in, K=T,     N=d_out  TN (x stored T x d_in)
BACKWARD_LAYERS = {
    "square4096": (4096, 4096),                 # the issues' "4096^3 layer"
    "llama3-8b.gate_up": (4096, 2 * 14336),
    "llama3-8b.down": (14336, 4096),
    "llama3-70b.qkv": (8192, 8192 + 2 * 8 * 128),
}


def _backward():
  out = []
  for layer, (d_in, d_out) in BACKWARD_LAYERS.items():
    for t in (4096, 16384):
      default = t == 4096 and layer != "llama3-70b.qkv"
      quick = t == 4096 and layer == "llama3-8b.down"
      ladder = t == 4096 and layer == "square4096"
      for step, (m, k, n, ta, tb) in {
          "fwd": (t, d_in, d_out, False, False),
          "dgrad": (t, d_out, d_in, False, True),
          "wgrad": (d_in, t, d_out, True, False),
      }.items():
        out.append(_p("backward", f"{layer}.t{t}.{step}", m, k, n, trans_a=ta,
                      trans_b=tb, default=default, quick=quick, ladder=ladder,
                      note=f"{layer}, {t} tokens, {step}"))
  # Attention scores as a batched GEMM: S = Q K^T per (batch x head).
  for t in (2048,):
    out.append(_p("backward", f"attn.qkT.h32.t{t}", t, 128, t, batch=32, trans_b=True,
                  default=True, note="batched Q K^T, 32 heads of 128"))
  return out


# ---------------------------------------------------------------- random
# Problems no one picked: the development set of issue 23 for the heuristics
# (`random`, fixed seed) and a held-out set drawn the same way with another
# seed (`random-holdout`), to check on problems the heuristics were not
# developed on. M, N and K are log-uniform in [1, 16384]; half the problems
# are aligned (every size a multiple of 64, or a power of two below 64), half
# take the drawn sizes as they are (most not a multiple of 8); the dtype
# (bf16, fp16, fp32 at default precision) and each operand's transpose are
# drawn uniformly.
RANDOM_SEED, RANDOM_COUNT = 2311, 48
RANDOM_HOLDOUT_SEED, RANDOM_HOLDOUT_COUNT = 1125, 24
RANDOM_DTYPES = ("bf16", "fp16", "fp32")


def random_problems(suite: str, seed: int, count: int, max_size: int = 16384,
                    min_size: int = 1):
  """`count` problems drawn as the comment above says (sizes in [min_size,
  max_size]), the same for a seed.

  >>> [p.name for p in random_problems("random", 0, 2)]
  ['r00.484x14x1.bf16.NT', 'r01.7040x384x1216.fp16.TT']
  """
  rng = np.random.default_rng(seed)
  out = []
  for i in range(count):
    m, k, n = (int(round(np.exp(rng.uniform(np.log(min_size), np.log(max_size)))))
               for _ in range(3))
    aligned = bool(rng.integers(2))
    if aligned:
      m, k, n = (1 << (x - 1).bit_length() if x < 64 else -(-x // 64) * 64
                 for x in (m, k, n))
    dtype = RANDOM_DTYPES[int(rng.integers(len(RANDOM_DTYPES)))]
    trans_a, trans_b = (bool(t) for t in rng.integers(2, size=2))
    layout = ("T" if trans_a else "N") + ("T" if trans_b else "N")
    out.append(_p(suite, f"r{i:02d}.{m}x{k}x{n}.{dtype}.{layout}", m, k, n,
                  trans_a=trans_a, trans_b=trans_b, dtype=dtype, default=True,
                  note="aligned" if aligned else "as drawn"))
  return out


# ---------------------------------------------------------------- tiny (CPU)
# What a machine without a GPU runs: XLA:CPU and the kernels' interpreters.

def _tiny():
  return [
      # The ladder problem first: it finds which interpreted variants are too slow.
      _p("tiny", "sq128", 128, 128, 128, default=True, quick=True, ladder=True),
      _p("tiny", "sq64", 64, 64, 64, default=True, quick=True),
      _p("tiny", "u100x75x130", 100, 75, 130, default=True,
         note="not a multiple of 8 or 16"),
      _p("tiny", "skinny.m4.k256.n256", 4, 256, 256, default=True),
      _p("tiny", "llm.t32.k128.n384", 32, 128, 384, default=True),
      _p("tiny", "bwd.dgrad.NT", 64, 96, 128, trans_b=True, default=True),
      _p("tiny", "bwd.wgrad.TN", 128, 64, 96, trans_a=True, default=True),
      _p("tiny", "batched.4x32x64x32", 32, 64, 32, batch=4, default=True),
  ]


# ---------------------------------------------------------------- moe (grouped GEMM)
# Issue 26: `ragged_dot` (op "ragged_dot"), a mixture-of-experts layer's grouped GEMM.
# Each problem is one layer's GEMM over G experts: M tokens (rows of lhs, sorted by
# expert) of width K times each expert's (K, N) weights, in one of three calls:
#
#   fwd    y = ragged_dot(x, W)               x (M, K), W (G, K, N) -> (M, N)     "NN"
#   dgrad  dx = dy @ W[g]^T per group         dy (M, N), W (G, K, N) -> (M, K)    "NT"
#          (ragged_dot_general, rhs contracted on its last dimension)
#   wgrad  dW[g] = x[rows g]^T @ dy[rows g]   x (M, K), dy (M, N) -> (G, K, N)    "TN"
#          (ragged_dot_general, the ragged dimension M contracted)
#
# m, k, n are the layer's (tokens, width in, width out) in all three, so the FLOPs
# are 2 M K N in each, however the tokens split. The group sizes are a Dirichlet(2)
# split of the M tokens (jaxgemm.ops.ragged_dot.primitive.example_group_sizes, a
# fixed seed), or fixed ones (`group_sizes`, the tiny suite's edge cases).


@dataclasses.dataclass(frozen=True)
class MoeProblem:
  suite: str
  name: str
  layer: str              # the layer's name: its fwd, dgrad and wgrad share it
  groups: int
  m: int
  k: int
  n: int
  mode: str = "fwd"       # "fwd", "dgrad" or "wgrad" (above)
  group_sizes: tuple[int, ...] | None = None   # fixed sizes; None: a Dirichlet(2) split
  active_groups: int | None = None   # experts with tokens (the runner fills it in)
  dtype: str | None = None
  default: bool = False
  quick: bool = False
  ladder: bool = False    # every variant of every backend runs it
  note: str = ""

  op = "ragged_dot"
  batch = 1
  trans_a = False

  MODES = ("fwd", "dgrad", "wgrad")

  @property
  def trans_b(self) -> bool:
    return self.mode == "dgrad"

  @property
  def layout(self) -> str:
    return {"fwd": "NN", "dgrad": "NT", "wgrad": "TN"}[self.mode]

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n

  def lhs_shape(self) -> tuple[int, int]:
    return (self.m, self.n) if self.mode == "dgrad" else (self.m, self.k)

  def rhs_shape(self) -> tuple[int, ...]:
    return (self.m, self.n) if self.mode == "wgrad" else (self.groups, self.k, self.n)

  def out_shape(self) -> tuple[int, ...]:
    return {"fwd": (self.m, self.n), "dgrad": (self.m, self.k),
            "wgrad": (self.groups, self.k, self.n)}[self.mode]

  def dimension_numbers(self):
    """lax.RaggedDotDimensionNumbers of the call (lax.ragged_dot's own for fwd)."""
    from jax import lax  # noqa: PLC0415
    if self.mode == "wgrad":
      return lax.RaggedDotDimensionNumbers(
          dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
          rhs_group_dimensions=[])
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [2 if self.mode == "dgrad" else 1]), ([], [])),
        lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])

  def min_bytes(self, dtype_name: str) -> int:
    """lhs and rhs read once, the output written once; of the weights (fwd, dgrad) only
    those of the experts that have tokens (`active_groups`, else all G)."""
    item = np.dtype(dtype_of(dtype_name)).itemsize
    g = self.groups if self.active_groups is None else self.active_groups
    lhs, out = math.prod(self.lhs_shape()), math.prod(self.out_shape())
    rhs = self.m * self.n if self.mode == "wgrad" else g * self.k * self.n
    return item * (lhs + rhs + out)

  def size_label(self) -> str:
    return f"G{self.groups} {self.m}x{self.k}x{self.n} {self.mode}"

  def csv_fields(self, dtype_name: str) -> dict:
    """The problem's columns of a CSV row (`runner.base_row`)."""
    return {
        "batch": 1, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": 0, "flops": self.flops, "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note, "groups": self.groups, "mode": self.mode,
        "layer": self.layer, "active_groups": "" if self.active_groups is None
        else self.active_groups,
        "group_sizes": "" if self.group_sizes is None else " ".join(map(str, self.group_sizes)),
    }


# (layer, G, M, K, N, with backward GEMMs, default, quick, ladder, note)
MOE_LAYERS = (
    ("g8.m16384.k4096.n14336", 8, 16384, 4096, 14336, True, True, False, True,
     "8 experts of Mixtral-8x7B's MLP width, 16384 tokens"),
    ("g64.m16384.k2048.n1408", 64, 16384, 2048, 1408, True, True, True, True,
     "64 fine-grained experts (DeepSeekMoE-16B's widths), 16384 tokens"),
    ("g128.m8192.k7168.n2048", 128, 8192, 7168, 2048, False, True, False, False,
     "128 experts of DeepSeek-V3's widths: 3.76 GB of weights, memory bound"),
    ("g8.m128.k4096.n14336", 8, 128, 4096, 14336, False, True, True, False,
     "decode: 128 tokens over 0.94 GB of weights, memory bound"),
)
# The CPU's analogues: small enough for the interpreters, with the edge cases
# (empty groups, a group of one row, rows past sum(group_sizes), which are zeros).
MOE_TINY_LAYERS = (
    ("g4.m64.k64.n128", 4, 64, 64, 128, True, True, True, True, None, "Dirichlet(2) split"),
    ("g8.m48.k32.n64.edges", 8, 48, 32, 64, True, True, False, False,
     (10, 0, 1, 20, 0, 9, 8, 0), "empty groups and a group of one row"),
    ("g4.m40.k96.n80.tail", 4, 40, 96, 80, False, True, False, False, (5, 10, 0, 15),
     "rows past sum(group_sizes) (zeros)"),
    ("g4.m8.k128.n256", 4, 8, 128, 256, False, True, True, False, None, "decode"),
)


def _moe(suite, layers, tiny=False):
  """Every layer's forward GEMM first, then the backward ones: a run stopped by its time
  budget has measured every forward problem."""
  out = []
  for modes in (("fwd",), ("dgrad", "wgrad")):
    for row in layers:
      out += _moe_layer(suite, row, tiny, modes)
  return out


def _moe_layer(suite, row, tiny, modes):
  out = []
  if tiny:
    layer, g, m, k, n, backward, default, quick, ladder, sizes, note = row
  else:
    (layer, g, m, k, n, backward, default, quick, ladder, note), sizes = row, None
  for mode in modes:
    if mode == "fwd" or backward:
      out.append(MoeProblem(suite, layer if mode == "fwd" else f"{layer}.{mode}", layer, g,
                            m, k, n, mode=mode, group_sizes=sizes, default=default,
                            quick=quick and mode == "fwd", ladder=ladder and mode == "fwd",
                            note=note if mode == "fwd" else f"{note}; {mode}"))
  return out


MOE_SUITES: dict[str, list[MoeProblem]] = {
    "moe": _moe("moe", MOE_LAYERS),
    "moe-tiny": _moe("moe-tiny", MOE_TINY_LAYERS, tiny=True),
}


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

  def b_shape(self) -> tuple[int, int]:
    return (self.n, self.k) if self.trans_b else (self.k, self.n)

  def out_shape(self) -> tuple[int, int]:
    return (self.m, self.n)

  def a_block(self) -> tuple[int, int] | None:
    """quantize's block for A as stored: 1x128 along K ((128, 1) when stored (K, M))."""
    if self.scaling == "tensor":
      return None
    return (128, 1) if self.trans_a else (1, 128)

  def b_block(self) -> tuple[int, int] | None:
    return None if self.scaling == "tensor" else (128, 128)

  def dimension_numbers(self):
    """lax.dot_general dimension numbers of the stored layout (2-D operands)."""
    return (((0 if self.trans_a else 1,), (1 if self.trans_b else 0,)), ((), ()))

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
    program every `speedup_vs_xla` of the problem is against (`fp8.ref_variant`)."""
    from . import fp8  # noqa: PLC0415 (fp8 imports this module)
    return {
        "batch": 1, "m": self.m, "k": self.k, "n": self.n, "layout": self.layout,
        "ladder": 0, "flops": self.flops, "min_bytes": self.min_bytes(dtype_name),
        "arith_intensity": round(self.flops / self.min_bytes(dtype_name), 3),
        "problem_note": self.note, "mode": self.mode, "layer": self.layer,
        "scaling": self.scaling, "fp8_dtypes": self.fp8_dtypes,
        "xla_ref": fp8.ref_variant(self),
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


SUITES: dict[str, list[BenchProblem]] = {
    "square": _square(),
    "llm": _llm(),
    "skinny": _skinny(),
    "unaligned": _unaligned(),
    "backward": _backward(),
    "random": random_problems("random", RANDOM_SEED, RANDOM_COUNT),
    "random-holdout": random_problems("random-holdout", RANDOM_HOLDOUT_SEED,
                                      RANDOM_HOLDOUT_COUNT),
    "tiny": _tiny(),
}
# The training suite is not a table of GEMMs: see training.py.
TRAINING = "training"
# Nor is the sharded suite (GEMM layouts and a training step on a mesh of every
# device): see sharded.py.
SHARDED = "sharded"
ALL_SUITES = (*SUITES, TRAINING, *MOE_SUITES, *EPILOGUE_SUITES, *FP8_SUITES, SHARDED)
# The op each suite measures (a jaxgemm op registered in jaxgemm.registry): matmul's
# suites run through runner.py, ragged_dot's (the moe suites: their grouped GEMMs,
# then an MoE training step) through moe.py, fused_matmul's (the epilogue suites: GEMMs
# with epilogues, and glu's dual GEMM, then a SwiGLU training step) through epilogue.py.
# The fp8 suites (scaled_matmul's FP8 GEMMs, then an FP8 training step) through fp8.py.
SUITE_OP = {suite: "ragged_dot" if suite in MOE_SUITES else
            "fused_matmul" if suite in EPILOGUE_SUITES else
            "scaled_matmul" if suite in FP8_SUITES else "matmul" for suite in ALL_SUITES}
GPU_DEFAULT_SUITES = ("square", "llm", "skinny", "unaligned", "backward", TRAINING)
CPU_DEFAULT_SUITES = ("tiny", TRAINING, "moe-tiny", "epilogue-tiny", "fp8-tiny")

SUITE_HELP = {
    "square": "M=K=N from 256 to 16384 (powers of two and a few non-powers)",
    "llm": "Llama-3 8B/70B projections (QKV, O, gate_up, down) at 1..16384 tokens",
    "skinny": "M in 1..256 against large K=N (decode; memory bound)",
    "unaligned": "sizes not multiples of 8 or 16 (e.g. 4095x4097x4093)",
    "backward": "a layer's forward GEMM and both backward GEMMs (NN, NT, TN layouts)",
    "tiny": "small shapes for a machine without a GPU (XLA:CPU, interpreters)",
    TRAINING: "a jit-compiled transformer training step on jaxgemm vs on XLA's dot",
    "moe": "grouped GEMM (ragged_dot, issue 26): 4 MoE layers (2 memory bound) and the "
           "backward GEMMs of 2, vs lax.ragged_dot and jax's example kernel; an MoE "
           "training step",
    "moe-tiny": "the moe suite's CPU analogue (interpreters; empty groups, a one-row group)",
    "epilogue": "GEMM epilogues (issue 27): x@w+b, gelu(x@w+b), silu(x@w), x@w+b+residual, "
                "SwiGLU (glu), forward and forward+backward, vs XLA's program of the same "
                "jnp expression; a SwiGLU training step",
    "epilogue-tiny": "the epilogue suite's CPU analogue (interpreters)",
    "fp8": "FP8 GEMMs (scaled_matmul, issue 28): e4m3 -> bf16 with per-tensor and block "
           "scales at 8192^3, 8192x4096x14336, 4096^3, 128x4096x14336 and a layer's dgrad "
           "and wgrad, vs XLA's scaled form, its fp8 dot and the bf16 dot; an FP8 training step",
    "fp8-tiny": "the fp8 suite's CPU analogue (interpreters)",
    SHARDED: "sharded GEMMs on a mesh of every device (issue 25): data (M), column (N), "
             "row (K: all-reduce, or reduce-scatter), experts (batch) at Llama-3-8B MLP "
             "sizes, and a data x tensor parallel training step, vs XLA's dot on the same "
             "mesh: time, collectives, memory per device",
    "default": "the default subset of every suite (under 10 minutes on an H200); "
               "on a machine without a GPU: tiny + a small training run + moe-tiny + "
               "epilogue-tiny + fp8-tiny",
}


def select(suite: str, *, default_only: bool, quick: bool) -> list:
  """The problems of `suite`, restricted to its default (or quick) subset."""
  probs = (SUITES.get(suite) or MOE_SUITES.get(suite) or EPILOGUE_SUITES.get(suite)
           or FP8_SUITES[suite])
  if quick:
    return [p for p in probs if p.quick]
  if default_only:
    return [p for p in probs if p.default]
  return list(probs)
