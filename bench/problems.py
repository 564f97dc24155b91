"""matmul's benchmark problems, as data: one row per GEMM, grouped in named suites
(`SUITES`; bench/ops/matmul.py makes them suites), and the run dtypes every op shares.

The other ops' problems are in their entries (bench/ops/*.py); `bench.suites` indexes
every suite. Every problem here is C = op(A) @ op(B) with op = transpose where flagged:

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
