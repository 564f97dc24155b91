"""Does `auto`'s grouped-GEMM pick hold when the routing changes? (issue 44: ragged_dot)

    python research/probes/measure/skew.py                 # the moe-fine layers, on a GPU
    python research/probes/measure/skew.py --tiny          # the CPU smoke run (interpreters)

`auto` measures a `ragged_dot` problem once, at its first compile, on a representative
routing (`example_group_sizes`: a Dirichlet(2) split of the rows); the group sizes are
runtime data, so the compiled program then runs whatever routing the model's router
produces. For each problem this compiles `auto`'s program (measuring, on a fresh cache),
each kernel backend's own choice (`backend=name`, measured the same way) and XLA's
`lax.ragged_dot`, then times each against XLA (`timing.time_paired`, CUPTI on a GPU) under
five routings of the same rows:

    balanced   every expert M / G rows
    dirichlet2 the routing `auto` measured on (another draw of it)
    skewed     Dirichlet(0.3): a few experts take most rows
    hot        half the rows in one expert, the rest balanced
    half-empty half the experts get no rows

and prints, per problem and routing, each program's speedup over XLA and `auto`'s against
the fastest program there. A pick that holds reads >= 0.95x of the fastest everywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxgemm  # noqa: E402
from jaxgemm import registry, timing  # noqa: E402

# (name, G, M, K, N): bench/ops/ragged_dot.py's moe-fine forward layers and a coarse one.
GPU_PROBLEMS = (
    ("qwen3-moe g128", 128, 16384, 2048, 768),
    ("deepseek-v3 ep8 g32", 32, 8192, 7168, 2048),
    ("g256 n256", 256, 8192, 7168, 256),
    ("decode g64", 64, 256, 2048, 1408),
    ("mixtral g8", 8, 16384, 4096, 14336),
)
TINY_PROBLEMS = (("tiny g4", 4, 64, 64, 128),)
ROUTINGS = ("balanced", "dirichlet2", "skewed", "hot", "half-empty")


def group_sizes(routing: str, g: int, m: int, rng) -> np.ndarray:
  """`m` rows over `g` experts as `routing` splits them (module docstring)."""
  if routing == "balanced":
    shares = np.full(g, 1.0 / g)
  elif routing in ("dirichlet2", "skewed"):
    shares = rng.dirichlet(np.full(g, 2.0 if routing == "dirichlet2" else 0.3))
  elif routing == "hot":
    shares = np.full(g, 0.5 / max(g - 1, 1))
    shares[rng.integers(g)] = 0.5
  else:   # half-empty
    live = rng.permutation(g)[: max(1, g // 2)]
    shares = np.zeros(g)
    shares[live] = 1.0 / len(live)
  sizes = np.floor(shares * m).astype(np.int32)
  sizes[np.argmax(shares)] += m - sizes.sum()   # the rounding's rows: the sizes sum to M
  return sizes


def programs(x, w, gs) -> dict:
  """name -> compiled program of (x, w, group_sizes): auto, each kernel backend, XLA."""
  out = {"xla": jax.jit(lambda x, w, gs: lax.ragged_dot(x, w, gs)).lower(x, w, gs).compile()}
  for name in ["auto", *(b for b in registry.backends("ragged_dot") if b != "xla")]:
    out[name] = jax.jit(lambda x, w, gs, name=name: jaxgemm.ragged_dot(
        x, w, gs, backend=name)).lower(x, w, gs).compile()
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--tiny", action="store_true", help="one tiny problem (CPU smoke run)")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--count", type=int, default=None, help="the first N problems only")
  args = ap.parse_args(argv)
  platform = timing.platform_of()
  timer = timing.Timer(platform)
  rng = np.random.default_rng(args.seed)
  print(f"device {jax.devices()[0].device_kind}, timer {timer.label}, seed {args.seed}")
  print("| problem | routing | " + " | ".join(("auto", "triton", "pallas")) +
        " (each vs XLA) | auto vs the fastest |")
  print("|---|---|---|---|---|---|")
  for name, g, m, k, n in (TINY_PROBLEMS if args.tiny else GPU_PROBLEMS)[:args.count]:
    key = jax.random.key(args.seed)
    x = jax.random.normal(key, (m, k), jnp.bfloat16)
    w = jax.random.normal(jax.random.fold_in(key, 1), (g, k, n), jnp.bfloat16) / k**0.5
    compiled = programs(x, w, jnp.asarray(group_sizes("dirichlet2", g, m, rng)))
    for routing in ROUTINGS:
      gs = jnp.asarray(group_sizes(routing, g, m, rng))
      args_ = (x, w, gs)
      ref = np.asarray(compiled["xla"](*args_), np.float32)
      speedups = {}
      for prog, f in compiled.items():
        if prog == "xla":
          continue
        out = np.asarray(f(*args_), np.float32)
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        if not err < 2e-2:   # bf16 outputs of one fp32 accumulation: ~2^-8 of the norm
          speedups[prog] = float("nan")
          print(f"  {prog} disagrees with XLA under {routing}: relative error {err:.3g}")
          continue
        ms, xla_ms = timing.time_paired(timer, f, compiled["xla"], args_, args.iters)
        speedups[prog] = float(np.median(xla_ms) / np.median(ms))
      best = max([1.0, *(s for s in speedups.values() if s == s)])
      cells = [f"{speedups[p]:.2f}x" if p in speedups else "-" for p in ("auto", "triton", "pallas")]
      print(f"| {name} G={g} M={m} K={k} N={n} | {routing} | " + " | ".join(cells) +
            f" | {speedups['auto'] / best:.2f}x |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
