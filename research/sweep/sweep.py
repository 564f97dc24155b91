"""The no-measure path's evidence (issue 44): `jaxgemm.autotune` over thousands of problems
of every op, resumable in 10-minute calls, one tuning file per device kind.

    python3 research/sweep/sweep.py run --card-dir research/sweep/data --limit-s 540
    python3 research/sweep/sweep.py summarize --card-dir research/sweep/data
    python3 research/sweep/sweep.py list --card-dir research/sweep/data      # the problems
    python3 research/sweep/sweep.py run --tiny --card-dir /tmp/sweep --backends triton   # CPU

The problems (`generate`, deterministic from `--seed`; written once to
`<card-dir>/problems.json.gz`, which every later call and card reads, so the set is pinned):

* model shapes (`model_problems`): the projections of Llama-3 8B and 70B, Mixtral-8x7B,
  Qwen3-MoE (30B-A3B) and DeepSeek-V3 (MLA, dense MLP, router) at prefill token counts
  (512..16384) and decode (16..256), in the forward (NN) and both backward GEMM forms
  (dgrad NT, wgrad TN) where training runs them; their MLPs as `glu` (SwiGLU) and as
  `fused_matmul` (`gelu(x @ w + b)`, the down projection's residual add), with the forms
  `jaxgemm.problems_in` finds for the forward and its gradient (the forward that saves
  Z, the gated backward GEMMs); the MoE layers' grouped GEMMs (`ragged_dot`: Mixtral G=8,
  Qwen3-MoE G=128 K=2048 N=768, DeepSeek-V3 G=256 K=7168 N=2048 and its EP8 share of
  32 experts) at 16..65536 routed rows, forward, dgrad and wgrad; the dense layers in FP8
  (`scaled_matmul`, per tensor and block scales, the recipes' dtypes per form);
* random shapes (`random_problems`): sizes log-uniform in [1, 16384], each rounded up to
  a multiple of 1 (as drawn), 8, 64 or 128, every dtype (bf16, fp16, fp32 at default
  precision and at HIGHEST) and layout (NN, NT, TN, TT), some batched; fused epilogues,
  GLUs and grouped GEMMs (G in [4, 256]) drawn as layers and expanded to the forms their
  forward and gradient run; FP8 of every dtype pairing, scaling and layout.

Every problem is capped (`CAPS`) so that tuning it fits in seconds: XLA's program is
timed beside every candidate, and XLA's grouped GEMM runs at 1-10 TFLOP/s. Each problem's
split, `fit` or `heldout` (one in `HELDOUT_ONE_IN`), is a hash of what identifies it
(op, `Problem.cache_fields()`, shape): the same on every card and every run.

`run` times, for each problem not yet in `<card-dir>/<kind>.cache.json` (a current XLA
record of exactly this problem: `autotune` stores one for every problem it finishes),
XLA and the first `--max-candidates-per-backend` of each backend's `tuning_candidates`
(`jaxgemm.autotune`, in chunks), until `--limit-s`; the next call resumes there. The
problems run in an order where every prefix holds every op, model and random shapes
alike. A problem whose tuning raises is retried alone, then recorded as failed
(`<kind>.state.json`) and skipped; one that was running when a call was killed (a
hang, or the lent machine's limit) is run alone next time, and skipped if it dies again.

`summarize` writes `<kind>.csv`: a row per problem (split, source, XLA's time, each
kernel's time with the XLA time around it, the best), what research/sweep/fit.py reads.
The tuning file itself is in the shipped tables' format (jaxgemm/tables/).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import gzip
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:   # run from anywhere, as research/*.py are
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxgemm  # noqa: E402
from jaxgemm import dispatch, measure, registry, timing, tuning_cache  # noqa: E402
from jaxgemm.ops.activations import ACTIVATIONS  # noqa: E402

DEFAULT_DIR = ROOT / "research" / "sweep" / "data"
HELDOUT_ONE_IN = 5          # a fifth of the problems are held out of the fit
GENERATOR_VERSION = 1       # bump when `generate` changes what a seed gives

BF16, F16, F32 = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(np.float32))
E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
S = jax.ShapeDtypeStruct

# FLOPs (every GEMM of the problem) and bytes at most. XLA's program is timed beside each
# candidate (`tuning.time_paired`): a problem costs about (2 + 2 x candidates) x iters of
# XLA's calls. Dense GEMMs run at hundreds of TFLOP/s (2^42: ~10 ms); XLA's lax.ragged_dot
# at 1.3-10 (issue 44's table: 2^39 ~ 0.1 s at 5), XLA's block-scaled form at ~50 (the fp8
# suite, H100: 2^41 ~ 40 ms).
CAPS = {"dense": 2**42, "ragged_dot": 2**39, "block": 2**41}
RANDOM_MAX_BYTES = 2 * 2**30
MODEL_MAX_BYTES = 16 * 2**30   # DeepSeek-V3's 256 experts of 7168x2048: 7.5 GB of bf16


def identity(problem) -> str:
  """What identifies a problem across cards and runs: op, exact-match fields, shape."""
  return "|".join((problem.op, *problem.cache_fields(), problem.shape_key()))


def split_of(ident: str) -> str:
  """'heldout' for one problem in HELDOUT_ONE_IN (by a hash of its identity), else 'fit'.

  >>> split_of("matmul|bfloat16->bfloat16|default|NN|1x128x128x128")
  'heldout'
  """
  h = int(hashlib.sha256(ident.encode()).hexdigest()[:12], 16)
  return "heldout" if h % HELDOUT_ONE_IN == 0 else "fit"


def _cost_ok(p, max_bytes: int) -> bool:
  if p.op == "ragged_dot":
    cap = CAPS["ragged_dot"]
  elif p.op == "scaled_matmul" and p.scale_kind == "block":
    cap = CAPS["block"]
  else:
    cap = CAPS["dense"]
  return not p.is_empty and p.flops <= cap and p.min_bytes <= max_bytes


def _gemm(m, k, n, dtype=BF16, ta=False, tb=False, batch=1, precision=None):
  return jaxgemm.GemmProblem(batch, m, n, k, dtype, dtype, F32, ta, tb, precision)


def _scaled(m, k, n, a_dtype, b_dtype, kind, ta=False, tb=False):
  return jaxgemm.ScaledMatmulProblem(1, m, n, k, a_dtype, BF16, F32, ta, tb, None,
                                     b_dtype=b_dtype, scale_kind=kind)


def _traced(fn, *args, backward: bool):
  """The problems `fn(*args)` runs through jaxgemm, and with `backward` those of its
  gradient (`jaxgemm.problems_in`: the forward that saves Z, the backward GEMMs)."""
  return jaxgemm.problems_in(fn, *args, backward=backward)


def _fused(m, k, n, dtype, *, bias: bool, activation, residual: bool, backward: bool):
  args = [S((m, k), dtype), S((k, n), dtype)]
  args += [S((n,), dtype)] if bias else []
  args += [S((m, n), dtype)] if residual else []

  def f(x, w, *rest):
    rest = list(rest)
    b = rest.pop(0) if bias else None
    r = rest.pop(0) if residual else None
    return jaxgemm.matmul(x, w, bias=b, activation=activation, residual=r)
  return _traced(f, *args, backward=backward)


def _glu(m, k, n, dtype, *, activation="silu", bias=False, backward: bool):
  args = [S((m, k), dtype), S((k, n), dtype), S((k, n), dtype)]
  args += [S((n,), dtype)] * 2 if bias else []

  def f(x, wg, wu, *b):
    return jaxgemm.glu(x, wg, wu, activation=activation, bias_gate=b[0] if b else None,
                       bias_up=b[1] if b else None)
  return _traced(f, *args, backward=backward)


def _ragged(g, m, k, n, dtype, *, backward: bool):
  return _traced(lambda x, w, gs: jaxgemm.ragged_dot(x, w, gs),
                 S((m, k), dtype), S((g, k, n), dtype), S((g,), jnp.int32), backward=backward)


# ---------------------------------------------------------------- model shapes

PREFILL = (512, 1024, 2048, 4096, 8192, 16384)   # tokens: training and prefill
DECODE = (16, 32, 64, 128, 256)                    # tokens: decode (forward only)
# (d_in, d_out) of each model's dense projections. Llama-3: GQA with 8 KV heads of 128;
# Mixtral-8x7B's attention is Llama-3-8B's; Qwen3-30B-A3B: 32 query heads and 4 KV heads
# of 128 on a 2048-wide stream; DeepSeek-V3's MLA (q_lora 1536, kv_lora 512 + 64 rope,
# 128 heads of 192/128), its dense layers' MLP down projection, and routers.
DENSE = {
    "llama3-8b": {"qkv": (4096, 6144), "o": (4096, 4096), "down": (14336, 4096)},
    "llama3-70b": {"qkv": (8192, 10240), "o": (8192, 8192), "down": (28672, 8192)},
    "mixtral-8x7b": {"router": (4096, 8)},
    "qwen3-moe": {"qkv": (2048, 5120), "o": (4096, 2048), "router": (2048, 128)},
    "deepseek-v3": {"q_a": (7168, 1536), "q_b": (1536, 24576), "kv_a": (7168, 576),
                    "kv_b": (512, 32768), "o": (16384, 7168), "down": (18432, 7168),
                    "router": (7168, 256)},
}
# (d_model, d_ff) of the dense MLPs: gate/up as SwiGLU (glu), or GELU with a bias (fused).
MLP = {"llama3-8b": (4096, 14336), "llama3-70b": (8192, 28672), "deepseek-v3": (7168, 18432)}
# (G, d_model, expert d_ff) of the MoE layers; rows routed to the experts (tokens x top-k).
MOE = {"mixtral-8x7b": (8, 4096, 14336), "qwen3-moe": (128, 2048, 768),
       "deepseek-v3": (256, 7168, 2048), "deepseek-v3.ep8": (32, 7168, 2048)}
MOE_ROWS = (16, 64, 256, 1024, 4096, 16384, 65536)
# The layers FP8 training and inference run (scaled_matmul).
FP8_MODELS = ("llama3-8b", "llama3-70b", "deepseek-v3")


def _dense_forms(t, d_in, d_out, train: bool):
  """The forward GEMM of a layer at t tokens, and with `train` its dgrad and wgrad."""
  out = [("fwd", (t, d_in, d_out, False, False))]
  if train:
    out += [("dgrad", (t, d_out, d_in, False, True)), ("wgrad", (d_in, t, d_out, True, False))]
  return out


def model_problems() -> list[tuple[str, object]]:
  """(source label, problem) of the model shapes, forward and backward forms."""
  out = []
  tokens = [(t, True) for t in PREFILL] + [(t, False) for t in DECODE]
  for model, projs in DENSE.items():
    for proj, (d_in, d_out) in projs.items():
      for t, train in tokens:
        for form, (m, k, n, ta, tb) in _dense_forms(t, d_in, d_out, train):
          out.append((f"{model}.{proj}.t{t}.{form}", _gemm(m, k, n, ta=ta, tb=tb)))
  for model, (d, ff) in MLP.items():
    for t, train in tokens:
      label = f"{model}.mlp.t{t}"
      out += [(f"{label}.swiglu", p) for p in _glu(t, d, ff, BF16, backward=train)]
      out += [(f"{label}.up.bias.gelu", p) for p in _fused(
          t, d, ff, BF16, bias=True, activation="gelu", residual=False, backward=train)]
      out += [(f"{label}.down.residual", p) for p in _fused(
          t, ff, d, BF16, bias=False, activation=None, residual=True, backward=train)]
  for model, (g, d, ff) in MOE.items():
    for rows in MOE_ROWS:
      train = rows >= 1024
      for proj, (k, n) in (("up", (d, ff)), ("down", (ff, d))):
        out += [(f"{model}.moe.{proj}.rows{rows}", p)
                for p in _ragged(g, rows, k, n, BF16, backward=train)]
  for model in FP8_MODELS:
    for proj, (d_in, d_out) in [*DENSE[model].items(), ("up", MLP[model])]:
      if proj == "router":
        continue
      for t, train in tokens:
        for kind in ("tensor", "block"):
          grad = E5M2 if kind == "tensor" else E4M3
          for form, (m, k, n, ta, tb) in _dense_forms(t, d_in, d_out, train):
            a_dtype = grad if form == "dgrad" else E4M3
            b_dtype = grad if form == "wgrad" else E4M3
            out.append((f"{model}.{proj}.t{t}.{form}.fp8-{kind}",
                        _scaled(m, k, n, a_dtype, b_dtype, kind, ta, tb)))
  return [(s, p) for s, p in out if _cost_ok(p, MODEL_MAX_BYTES)]


# ---------------------------------------------------------------- random shapes

RANDOM_RANGE = (1, 16384)
ALIGNS = (1, 8, 64, 128)
# What a dense random problem's dtype is: (operand dtype, precision), with its weight.
DENSE_DTYPES = ((BF16, None, 3), (F16, None, 3), (F32, None, 3),
                (F32, (lax.Precision.HIGHEST, lax.Precision.HIGHEST), 1))
# Random problems per op (layers for fused_matmul, glu and ragged_dot, each expanded to
# the forms its forward and gradient run: about 4, 4 and 3 problems).
RANDOM_COUNTS = {"matmul": 1500, "fused_matmul": 250, "glu": 200, "ragged_dot": 250,
                 "scaled_matmul": 500}


def _sizes(rng, n=3, lo=RANDOM_RANGE[0], hi=RANDOM_RANGE[1]) -> list[int]:
  align = int(rng.choice(ALIGNS))
  return [-(-int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))) // align) * align
          for _ in range(n)]


def _dense_dtype(rng):
  weights = np.array([w for *_, w in DENSE_DTYPES], float)
  dtype, precision, _ = DENSE_DTYPES[int(rng.choice(len(DENSE_DTYPES), p=weights / weights.sum()))]
  return dtype, precision


def _random_one(op: str, rng) -> list:
  """The problems of one random draw of `op` (a layer's forms for fused, glu, ragged)."""
  m, k, n = _sizes(rng)
  if op == "matmul":
    dtype, precision = _dense_dtype(rng)
    batch = int(round(math.exp(rng.uniform(math.log(2), math.log(64))))) if rng.random() < 0.25 else 1
    ta, tb = (bool(x) for x in rng.integers(2, size=2))
    return [_gemm(m, k, n, dtype, ta, tb, batch, precision)]
  if op == "scaled_matmul":
    a_dtype, b_dtype = (E4M3 if x else E5M2 for x in rng.integers(4, size=2) > 0)
    ta, tb = (bool(x) for x in rng.integers(2, size=2))
    return [_scaled(m, k, n, a_dtype, b_dtype, str(rng.choice(("tensor", "block"))), ta, tb)]
  dtype = [BF16, F16, F32][int(rng.integers(3))]
  backward = bool(rng.random() < 0.5)
  if op == "fused_matmul":
    bias, residual = bool(rng.integers(2)), bool(rng.random() < 0.25)
    activation = None if rng.random() < 0.2 else str(rng.choice(ACTIVATIONS))
    if not (bias or residual or activation):
      bias = True
    return _fused(m, k, n, dtype, bias=bias, activation=activation, residual=residual,
                  backward=backward)
  if op == "glu":
    return _glu(m, k, n, dtype, activation=str(rng.choice(ACTIVATIONS)),
                bias=bool(rng.random() < 0.25), backward=backward)
  if op == "ragged_dot":
    g = int(round(math.exp(rng.uniform(math.log(4), math.log(256)))))
    return _ragged(g, m, k, n, dtype, backward=backward)
  raise ValueError(f"unknown op={op!r}; valid: {list(RANDOM_COUNTS)}")


def random_problems(seed: int, counts: dict[str, int]) -> dict[str, list]:
  """op -> `counts[op]` random draws' problems, each op from its own stream of `seed`."""
  out = {}
  for i, op in enumerate(RANDOM_COUNTS):
    rng = np.random.default_rng((seed, i))
    got = []
    for _ in range(counts.get(op, 0)):
      for _ in range(1000):   # redraw until every problem of the draw is under the caps
        draw = _random_one(op, rng)
        if all(_cost_ok(p, RANDOM_MAX_BYTES) for p in draw):
          break
      got += draw
    out[op] = got
  return out


def tiny_problems() -> list[tuple[str, object]]:
  """The CPU smoke test's: a GEMM and a fused epilogue, small enough for the interpreters."""
  return [("tiny.matmul", _gemm(32, 48, 64)),
          *(("tiny.fused", p) for p in _fused(16, 32, 48, BF16, bias=True, activation="relu",
                                              residual=False, backward=False))]


def generate(seed: int, counts: dict[str, int] | None = None,
             tiny: bool = False) -> list[tuple[str, object]]:
  """Every problem of the sweep, (source, problem), distinct, in run order: ops in turn,
  and within an op model and random shapes in turn, so every prefix holds all of them."""
  if tiny:
    return tiny_problems()
  counts = RANDOM_COUNTS if counts is None else counts
  by_op: dict[str, list] = {}
  model = model_problems()
  rand = random_problems(seed, counts)
  order = np.random.default_rng((seed, len(RANDOM_COUNTS)))
  for op in RANDOM_COUNTS:
    mine = [x for x in model if x[1].op == op]
    mine = [mine[i] for i in order.permutation(len(mine))]   # every model in each prefix
    other = [("random", p) for p in rand.get(op, [])]
    by_op[op] = [x for pair in _zip_longest(mine, other) for x in pair]
  seen, out = set(), []
  for x in (x for row in _zip_longest(*by_op.values()) for x in row):
    ident = identity(x[1])
    if ident not in seen:
      seen.add(ident)
      out.append(x)
  return out


def _zip_longest(*lists):
  """Rows of one item of each list in turn, lists that ran out left out."""
  return [[lst[i] for lst in lists if i < len(lst)] for i in range(max(map(len, lists), default=0))]


# ---------------------------------------------------------------- problems on disk

_PROBLEM_TYPES = {c.op: c for c in (jaxgemm.GemmProblem, jaxgemm.FusedMatmulProblem,
                                    jaxgemm.GluProblem, jaxgemm.RaggedDotProblem,
                                    jaxgemm.ScaledMatmulProblem)}


def to_json(problem) -> dict:
  """A problem as JSON: its op and fields (dtypes by name, precision as names)."""
  out = {"op": problem.op}
  for f in dataclasses.fields(problem):
    v = getattr(problem, f.name)
    if isinstance(v, np.dtype):
      v = v.name
    elif f.name == "precision" and v is not None:
      v = [p.name for p in v]
    out[f.name] = v
  return out


def from_json(d: dict):
  """`to_json`'s inverse."""
  cls = _PROBLEM_TYPES[d["op"]]
  kw = {}
  for f in dataclasses.fields(cls):
    if f.name not in d:
      continue
    v = d[f.name]
    if f.name.endswith("dtype") and v is not None:
      v = np.dtype(jnp.dtype(v))
    elif f.name == "precision" and v is not None:
      v = tuple(lax.Precision[x] for x in v)
    kw[f.name] = v
  return cls(**kw)


def problems_file(card_dir: Path) -> Path:
  """The pinned list, gzipped: 1.27 MB of JSON is 56 KB so (the checkout stays under
  issue 43's 8 MB)."""
  return card_dir / "problems.json.gz"


def read_problems(path: Path) -> dict:
  """The pinned list's JSON ({"params": ..., "problems": [[source, problem], ...]})."""
  with gzip.open(path, "rt") as f:
    return json.load(f)


def load_or_generate(card_dir: Path, seed: int, counts: dict[str, int], tiny: bool, log):
  """The problem list: `problems.json` of `card_dir` where it was made with these
  arguments, else generated (and written there, so later calls and cards share it)."""
  params = {"seed": seed, "counts": counts, "tiny": tiny, "generator": GENERATOR_VERSION}
  path = problems_file(card_dir)
  if path.exists():
    data = read_problems(path)
    if data.get("params") == params:
      return [(s, from_json(d)) for s, d in data["problems"]]
    raise SystemExit(f"{path} was made with {data.get('params')}, not {params}: name another "
                     "--card-dir, or pass the arguments it was made with")
  t0 = time.perf_counter()
  items = generate(seed, counts, tiny)
  card_dir.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  with gzip.open(tmp, "wt") as f:
    json.dump({"params": params, "problems": [[s, to_json(p)] for s, p in items]}, f, indent=0)
  os.replace(tmp, path)
  log(f"generated {len(items)} problems in {time.perf_counter() - t0:.1f} s -> {path}")
  return items


# ---------------------------------------------------------------- the card's files

def slug(kind: str) -> str:
  """'nvidia-h200' of 'NVIDIA H200': the shipped table's name for the device kind."""
  return tuning_cache.table_path(kind).stem


@dataclasses.dataclass
class CardFiles:
  """A card's files. The tuning file is worked on as JSON (`autotune`'s cache_path, not
  committed) and committed gzipped (`pack`, `unpack`); the log and the CSV are written
  gzipped: the checkout stays small (a problem's records take ~3 KB of JSON)."""
  cache: Path      # the tuning file (autotune's cache_path)
  state: Path      # failed problems, the problems in flight per worker
  log: Path        # appended one gzip member a line, from every worker
  csv: Path

  @classmethod
  def of(cls, card_dir: Path, kind: str) -> "CardFiles":
    return cls.named(card_dir, slug(kind))

  @classmethod
  def named(cls, card_dir: Path, kind_slug: str) -> "CardFiles":
    return cls(card_dir / f"{kind_slug}.cache.json", card_dir / f"{kind_slug}.state.json",
               card_dir / f"{kind_slug}.log.gz", card_dir / f"{kind_slug}.csv.gz")

  @property
  def packed_cache(self) -> Path:
    return self.cache.with_name(self.cache.name + ".gz")

  @property
  def device_lock(self) -> Path:
    return self.cache.with_name(self.cache.name.removesuffix(".cache.json") + ".device")

  def unpack(self) -> None:
    """The working tuning file from the committed one, where that is newer."""
    packed = self.packed_cache
    if packed.exists() and (not self.cache.exists()
                            or packed.stat().st_mtime > self.cache.stat().st_mtime):
      with gzip.open(packed, "rb") as src:
        data = src.read()
      tmp = self.cache.with_suffix(".tmp")
      tmp.write_bytes(data)
      os.replace(tmp, self.cache)

  def pack(self) -> None:
    if self.cache.exists():
      tmp = self.packed_cache.with_suffix(".tmp")
      with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
        dst.write(self.cache.read_bytes())
      os.replace(tmp, self.packed_cache)


def read_state(path: Path) -> dict:
  state = json.loads(path.read_text()) if path.exists() else {}
  state.setdefault("failed", {})
  state.setdefault("alone", [])
  inflight = state.get("inflight") or {}
  state["inflight"] = {"0": inflight} if isinstance(inflight, list) else inflight
  return state


def write_state(path: Path, state: dict) -> None:
  tmp = path.with_suffix(f".{os.getpid()}.tmp")
  tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
  os.replace(tmp, path)


@contextlib.contextmanager
def editing_state(path: Path):
  """The state, read and written back under a lock: the workers share it."""
  with tuning_cache.locked(path):
    state = read_state(path)
    yield state
    write_state(path, state)


def xla_variant(op: str) -> str:
  """The rung XLA's records are stored under (as `autotune` stores them)."""
  return registry.get_backend("xla", op).variants[-1]


def is_done(problem, kind: str, cache: Path) -> bool:
  """Whether the tuning file holds a current XLA record of exactly this problem: `autotune`
  stores one for every problem it finishes (with a record per kernel that passed)."""
  return tuning_cache.has_record(problem, kind, "xla", xla_variant(problem.op), cache)


# ---------------------------------------------------------------- run

def autotune_chunk(chunk, backends, cache: Path, budget_s: float, iters, max_candidates, log,
                   timer=None):
  """`jaxgemm.autotune` on `chunk`, its backends' first `max_candidates` candidates each
  (what `jaxgemm.measure` times at a first compile, with the first sets rotated no more
  than it does), against XLA's program as it comes, as `jaxgemm.measure` times it."""
  usable = [b for b in backends if any(b in registry.backends(p.op) for p in chunk)]
  return jaxgemm.autotune(problems=chunk, backends=usable, cache_path=cache,
                          time_budget_s=budget_s, iters=iters, log=log,
                          max_candidates=max_candidates, max_rotate=measure.MAX_ROTATE,
                          timer=timer, xla_programs="own")


# Errors of the moment, not of the problem: the device's memory taken by the other workers
# (XLA's own autotuner then reports every config failed), CUPTI refusing a subscription.
# A problem that raises one is tried again by a later call, not recorded as failed.
TRANSIENT = ("RESOURCE_EXHAUSTED", "out of memory", "CUPTI_ERROR", "Failed to get configs",
             "All configs failed")


def is_transient(error: str) -> bool:
  return any(t in error for t in TRANSIENT)


class Log:
  """Prints a line and appends it, stamped, to the card's gzipped log (one gzip member a
  line: the workers append side by side, and `gzip.open` reads the members as one)."""

  def __init__(self, path: Path, prefix: str = ""):
    self.path, self.prefix = path, prefix

  def __call__(self, line: str) -> None:
    line = self.prefix + line
    print(line, flush=True)
    member = gzip.compress(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n".encode(), mtime=0)
    # One whole member per write, under a lock: gzip.open's appends write a member in
    # pieces, and two workers' pieces interleaved into a file no reader could decompress
    # (a fresh clone's CI at 486de00).
    with tuning_cache.locked(self.path), open(self.path, "ab") as f:
      f.write(member)


def shard_of(ident: str, workers: int) -> int:
  """The worker that tunes a problem: a hash of its identity, so every worker knows its
  share without asking the others, whatever they have finished."""
  return int(hashlib.sha256(ident.encode()).hexdigest()[12:24], 16) % workers


def run(args) -> int:
  t0 = time.perf_counter()
  card_dir = Path(args.card_dir)
  card_dir.mkdir(parents=True, exist_ok=True)
  if args.workers > 1:   # processes sharing a GPU take its memory as they need it
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  kind = dispatch.device_kind()
  files = CardFiles.of(card_dir, kind)
  if args.worker is not None:
    return work(args, kind, files, t0)
  files.unpack()
  log = Log(files.log)
  items = sweep_items(args, log)
  settle_inflight(items, files, log)
  if args.workers == 1:
    args.worker = 0
    work(args, kind, files, t0, items)
  else:
    spawn_workers(args, log)
  state = read_state(files.state)
  left = sum(1 for _, p in items if identity(p) not in state["failed"]
             and not is_done(p, kind, files.cache))
  log(f"sweep: {len(items) - left - len(state['failed'])} of {len(items)} problems done, "
      f"{left} left, {len(state['failed'])} failed, after {time.perf_counter() - t0:.0f} s"
      + ("; run again to continue" if left else ""))
  files.pack()
  summarize_card(card_dir, files, items, log)
  return 0


def settle_inflight(items, files: CardFiles, log) -> None:
  """What a killed call left in flight: a problem that was alone is recorded as failed
  (it hung or crashed the process alone); a chunk's problems run alone next."""
  known = {identity(p) for _, p in items}
  with editing_state(files.state) as state:
    for worker, idents in state["inflight"].items():
      if len(idents) == 1:
        state["failed"][idents[0]] = "the process died while tuning it (hang or crash)"
        log(f"failed: {idents[0]}: the process died while tuning it alone")
      else:
        state["alone"] += [i for i in idents if i in known and i not in state["alone"]]
    state["inflight"] = {}


def spawn_workers(args, log) -> None:
  """`--workers` processes on the one GPU: each compiles its share's candidates while the
  others time theirs, and holds the device (a lock) only to run and time
  (`timing.Timer`'s device_lock). They end themselves past --limit-s (+ --grace-s)."""
  # Each takes the device's memory as it needs it and gives it back (the platform
  # allocator): XLA's pooling allocator keeps what a large problem took, and four pools
  # ran the H100 out of memory (the first 4-worker call: 58 of 98 failures).
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
         "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
  procs = [subprocess.Popen([sys.executable, __file__, *args.argv, "--worker", str(i)], env=env)
           for i in range(args.workers)]
  log(f"sweep: {args.workers} workers started")
  deadline = time.monotonic() + args.limit_s + args.grace_s + 30
  for proc in procs:
    try:
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      proc.kill()
      log(f"sweep: worker pid {proc.pid} killed {args.grace_s + 30:g} s past --limit-s")


def work(args, kind: str, files: CardFiles, t0: float, items=None) -> int:
  """One worker: its share of the problems not done nor failed, until --limit-s."""
  i, n = args.worker, args.workers
  log = Log(files.log, prefix=f"[w{i}] " if n > 1 else "")
  if items is None:
    items = sweep_items(args, log)
  # A candidate that hangs cannot be interrupted: end the process past the limit, leaving
  # its chunk in flight in the state file (the next call runs it one problem at a time).
  watchdog = threading.Timer(args.limit_s + args.grace_s, lambda: (
      log(f"watchdog: still running {args.grace_s:g} s past --limit-s; exiting"), os._exit(3)))
  watchdog.daemon = True
  watchdog.start()
  timer, device = None, DeviceLock(files.device_lock, deadline=t0 + args.limit_s)
  if n > 1:
    timer = timing.Timer(timing.platform_of(), device_lock=device.held)
  try:
    mine = [(s, p) for s, p in items if shard_of(identity(p), n) == i]
    tuned = sweep(mine, kind, files, args, log, deadline=t0 + args.limit_s - args.reserve_s,
                  timer=timer, worker=str(i))
  finally:
    watchdog.cancel()
  log(f"sweep: {tuned} problems tuned in {time.perf_counter() - t0:.0f} s"
      + (f"; the device held {device.held_s:.0f} s, waited for {device.waited_s:.0f} s"
         if n > 1 else ""))
  return 0


class DeviceTimeUp(BaseException):
  """The call's --limit-s came while a worker waited for the device: an interrupt (not an
  Exception, which the autotuner would take for the candidate's failure)."""


class DeviceLock:
  """The workers' lock on the GPU, with how long this one held it and waited for it (the
  held times summed over the workers near the call's length: the device is the limit).
  Waiting stops at `deadline`: the problem in flight is left for the next call, where six
  workers queued for the device at the limit ran past it together."""

  def __init__(self, path: Path, deadline: float):
    self.path, self.deadline, self.held_s, self.waited_s = path, deadline, 0.0, 0.0

  @contextlib.contextmanager
  def held(self):
    import fcntl  # noqa: PLC0415 (the workers run on Linux)
    t0 = time.perf_counter()
    with open(self.path, "a") as f:
      while True:
        try:
          fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
          break
        except BlockingIOError:
          if time.perf_counter() > self.deadline:
            self.waited_s += time.perf_counter() - t0
            raise DeviceTimeUp("--limit-s came while waiting for the device") from None
          time.sleep(0.02)
      t1 = time.perf_counter()
      self.waited_s += t1 - t0
      try:
        yield
      finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        self.held_s += time.perf_counter() - t1


def sweep_items(args, log):
  """The pinned problem list (`load_or_generate`), of the ops `--ops` names."""
  items = load_or_generate(Path(args.card_dir), args.seed, _counts(args), args.tiny, log)
  if args.ops:
    items = [x for x in items if x[1].op in args.ops.split(",")]
  return items


def kernel_backends(names: str | None) -> list[str]:
  """The kernel backends to time (XLA always is): the named ones ("xla" alone: none), else
  every usable one."""
  if names:
    return [b for b in (x.strip() for x in names.split(",")) if b and b != dispatch.FALLBACK]
  return list(dict.fromkeys(b for op in registry.ops() for b in registry.backends(op)
                            if b != dispatch.FALLBACK))


def sweep(items, kind: str, files: CardFiles, args, log, deadline: float, timer=None,
          worker: str = "0") -> int:
  """Tunes the problems of `items` not done (nor failed) until `deadline`, those a killed
  call left to run alone first; returns how many it finished. A chunk that raises is run
  again one problem at a time; a problem that raises alone is recorded as failed."""
  state = read_state(files.state)
  todo = [p for _, p in items if identity(p) not in state["failed"]
          and not is_done(p, kind, files.cache)]
  to_run_alone = set(state["alone"])
  alone = [p for p in todo if identity(p) in to_run_alone]
  rest = [p for p in todo if identity(p) not in to_run_alone]
  backends = kernel_backends(args.backends)
  log(f"sweep on {kind}: {len(items)} problems, {len(items) - len(todo)} done or failed, "
      f"{len(todo)} to go ({len(alone)} to run alone); backends {backends}, first "
      f"{args.max_candidates_per_backend or 'all'} candidates each; cache {files.cache}")
  tuned = 0
  while (alone or rest) and time.perf_counter() < deadline:
    if alone:
      chunk, single = [alone.pop(0)], True
    else:
      chunk, rest, single = rest[:args.chunk], rest[args.chunk:], False
    with editing_state(files.state) as state:
      state["inflight"][worker] = [identity(p) for p in chunk]
    budget = max(0.0, deadline - time.perf_counter())
    failed, retry = {}, []
    try:
      report = autotune_chunk(chunk, backends, files.cache, budget, args.iters,
                              args.max_candidates_per_backend, log, timer)
      tuned += len(report.tuned)
    except DeviceTimeUp:
      log(f"stopped at --limit-s with {len(chunk)} problems in flight; the next call runs them")
      rest, alone = [], []
    except Exception as e:  # noqa: BLE001 (one problem must not stop the sweep)
      what = f"{type(e).__name__}: {str(e)[:300]}"
      if single and is_transient(what):
        log(f"not now: {identity(chunk[0])}: {what[:160]}; a later call tries it again")
      elif single:
        failed[identity(chunk[0])] = what
        log(f"failed: {identity(chunk[0])}: {what}")
      else:
        log(f"chunk raised ({what}); its problems run alone next")
        retry = [p for p in chunk if not is_done(p, kind, files.cache)]
        alone += retry
    with editing_state(files.state) as state:
      state["inflight"].pop(worker, None)
      state["failed"].update(failed)
      if single:
        state["alone"] = [i for i in state["alone"] if i != identity(chunk[0])]
      state["alone"] += [identity(p) for p in retry]
  return tuned


def _counts(args) -> dict[str, int]:
  if args.random_per_op is None:
    return dict(RANDOM_COUNTS)
  return {op: args.random_per_op for op in RANDOM_COUNTS}


# ---------------------------------------------------------------- summarize

CSV_COLUMNS = ["device_kind", "op", "identity", "split", "source", "cache_fields",
               "dim_names", "shape", "aligned", "flops", "xla_ms", "best", "best_ms",
               "best_xla_ms", "best_speedup", "kernels", "stale"]


def _flops(op: str, dims: dict[str, int]) -> int:
  return (4 if op == "glu" else 2) * math.prod(dims.values())


def records(cache: Path) -> dict[str, dict]:
  """identity -> the problem's records in a tuning file: its kind, op, cache fields,
  dims, alignment, XLA's time, and each current kernel record's (time, XLA's around it)."""
  out: dict[str, dict] = {}
  versions: dict[tuple, str | None] = {}
  for key, shapes in tuning_cache.load(cache).items():
    parsed = tuning_cache.parse_key(key)
    if parsed is None:
      continue
    op, kind, backend, variant, rest = parsed
    *fields, bucket = rest.split("|")
    names = [part.rstrip("0123456789") for part in bucket.split(".")[:-1]]
    if (backend, op, variant) not in versions:
      try:
        versions[(backend, op, variant)] = tuning_cache.kernel_version(backend, op,
                                                                       variant=variant)
      except ValueError:   # a backend or rung this tree does not have
        versions[(backend, op, variant)] = None
    current = versions[(backend, op, variant)]
    for shape, r in shapes.items():
      ident = "|".join((op, *fields, shape))
      rec = out.setdefault(ident, {
          "device_kind": kind, "op": op, "identity": ident, "cache_fields": fields,
          "dims": dict(zip(names, (int(x) for x in shape.split("x")))),
          "aligned": bucket.endswith(".a16"), "shape": shape, "xla_ms": None,
          "kernels": {}, "stale": 0})
      if r.get("version") != current:
        rec["stale"] += 1
        continue
      if backend == "xla" and variant == xla_variant(op):   # XLA's own program; its
        rec["xla_ms"] = float(r["time_ms"])                 # others are kernels
      else:
        rec["kernels"][f"{backend}/{variant}"] = [float(r["time_ms"]), float(r["xla_time_ms"])]
  return out


def summarize_card(card_dir: Path, files: CardFiles, items, log) -> Path:
  """`<kind>.csv`: a row per problem with a current XLA record (fit.py's input)."""
  sources = {identity(p): s for s, p in items}
  rows = []
  for ident, rec in records(files.cache).items():
    if rec["xla_ms"] is None:
      continue   # unfinished, or XLA's record is stale
    best, best_ms, best_xla, best_s = "xla", rec["xla_ms"], rec["xla_ms"], 1.0
    for k, (ms, xla_ms) in rec["kernels"].items():
      if xla_ms / ms > best_s:
        best, best_ms, best_xla, best_s = k, ms, xla_ms, xla_ms / ms
    rows.append({
        "device_kind": rec["device_kind"], "op": rec["op"], "identity": ident,
        "split": split_of(ident), "source": sources.get(ident, "other"),
        "cache_fields": " | ".join(rec["cache_fields"]),
        "dim_names": ",".join(rec["dims"]), "shape": rec["shape"],
        "aligned": int(rec["aligned"]), "flops": _flops(rec["op"], rec["dims"]),
        "xla_ms": f"{rec['xla_ms']:.6g}", "best": best, "best_ms": f"{best_ms:.6g}",
        "best_xla_ms": f"{best_xla:.6g}", "best_speedup": f"{best_s:.4f}",
        "kernels": json.dumps(rec["kernels"], sort_keys=True), "stale": rec["stale"]})
  rows.sort(key=lambda r: (r["op"], r["identity"]))
  with gzip.open(files.csv, "wt", newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
    w.writeheader()
    w.writerows(rows)
  wins = sum(float(r["best_speedup"]) > 1.0 for r in rows)
  log(f"summary: {len(rows)} problems ({wins} where a kernel beat XLA) -> {files.csv}")
  return files.csv


def summarize(args) -> int:
  card_dir = Path(args.card_dir)
  path = problems_file(card_dir)
  items = ([(s, from_json(d)) for s, d in read_problems(path)["problems"]]
           if path.exists() else [])
  slugs = sorted({c.name.split(".cache.json")[0] for c in card_dir.glob("*.cache.json*")})
  if not slugs:
    raise SystemExit(f"no <kind>.cache.json.gz in {card_dir}: run the sweep first")
  for kind_slug in slugs:
    files = CardFiles.named(card_dir, kind_slug)
    files.unpack()
    summarize_card(card_dir, files, items, print)
  return 0


def list_problems(args) -> int:
  items = load_or_generate(Path(args.card_dir), args.seed, _counts(args), args.tiny, print)
  counts: dict[tuple, int] = {}
  for s, p in items:
    key = (p.op, "model" if s != "random" else "random", split_of(identity(p)))
    counts[key] = counts.get(key, 0) + 1
  for (op, source, split), n in sorted(counts.items()):
    print(f"{op:<14} {source:<7} {split:<8} {n}")
  print(f"total {len(items)}")
  if args.verbose:
    for s, p in items:
      print(f"{split_of(identity(p)):<8} {s:<44} {p.describe()}")
  return 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  for name in ("run", "summarize", "list"):
    p = sub.add_parser(name)
    p.add_argument("--card-dir", default=str(DEFAULT_DIR),
                   help="the sweep's folder: problems.json and, per device kind, "
                        "<kind>.cache.json, .state.json, .log, .csv (default: %(default)s)")
    if name == "summarize":
      continue
    p.add_argument("--seed", type=int, default=0, help="the random shapes' seed (default 0)")
    p.add_argument("--random-per-op", type=int, default=None,
                   help=f"random draws per op (default: {RANDOM_COUNTS})")
    p.add_argument("--tiny", action="store_true",
                   help="a couple of tiny problems (the CPU smoke test)")
    if name == "list":
      p.add_argument("--verbose", action="store_true", help="every problem")
      continue
    p.add_argument("--limit-s", type=float, default=540,
                   help="wall-clock budget of the call (default %(default)s: a lent "
                        "machine's 10 minutes with the install and the copy back)")
    p.add_argument("--reserve-s", type=float, default=30,
                   help="no problem starts later than this before --limit-s (default "
                        "%(default)s: a candidate started before then finishes)")
    p.add_argument("--grace-s", type=float, default=45,
                   help="the process exits this long past --limit-s if still running")
    p.add_argument("--backends", default=None,
                   help="comma-separated kernel backends (default: every usable one); XLA "
                        "is always timed ('xla' alone: no kernel backend)")
    p.add_argument("--max-candidates-per-backend", type=int, default=3,
                   help="time only the first N of each backend's tuning_candidates (what "
                        "the measuring path times; default %(default)s; 0: all)")
    p.add_argument("--chunk", type=int, default=8, help="problems per autotune call")
    p.add_argument("--iters", type=int, default=10,
                   help="timed calls per candidate (default %(default)s, as jaxgemm.measure)")
    p.add_argument("--ops", default="", help="comma-separated ops to sweep (default: all)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes sharing the GPU: each compiles while another times "
                        "(default %(default)s)")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)   # what the workers are given
  if args.cmd == "run":
    if args.max_candidates_per_backend == 0:
      args.max_candidates_per_backend = None
    return run(args)
  if args.cmd == "summarize":
    return summarize(args)
  return list_problems(args)


if __name__ == "__main__":
  sys.exit(main())
