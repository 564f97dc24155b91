"""What `auto`'s measurement costs at the first compile, and what it picks, on random GEMMs.

    python research/probes/measure/probe.py --count 12 --seed 7 [--second-process]

For each problem (log-uniform M, N, K in [16, 16384], capped at 2^38 FLOPs; a random
dtype among bf16/fp16/fp32 and random transposes; drawn from --seed, which is printed):
the wall time of `jax.jit(f).lower(...).compile()` with measuring on (a fresh cache)
and, on a fresh jit, off; then auto's program timed against XLA's (CUPTI, paired).
--second-process reruns the same problems in a new process on the same cache and
reports whether anything was measured and whether the picks agree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def draw(count: int, seed: int):
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < count:
    m, n, k = (int(round(math.exp(rng.uniform(math.log(16), math.log(16384))))) for _ in range(3))
    if 2 * m * n * k > 2**38:
      continue
    dtype = str(rng.choice(["bfloat16", "float16", "float32"]))
    out.append({"m": m, "n": n, "k": k, "dtype": dtype,
                "trans_a": bool(rng.integers(2)), "trans_b": bool(rng.integers(2))})
  return out


def run(problems, report_path):
  import jax
  import jax.numpy as jnp
  from jax import lax
  import jaxgemm
  from jaxgemm import dispatch, timing

  timer = timing.Timer(timing.platform_of())
  rows = []
  for i, p in enumerate(problems):
    key = jax.random.key(i)
    ka, kb = jax.random.split(key)
    a_shape = (p["k"], p["m"]) if p["trans_a"] else (p["m"], p["k"])
    b_shape = (p["n"], p["k"]) if p["trans_b"] else (p["k"], p["n"])
    a = jax.random.normal(ka, a_shape, jnp.float32).astype(p["dtype"])
    b = jax.random.normal(kb, b_shape, jnp.float32).astype(p["dtype"])
    dims = (((0 if p["trans_a"] else 1,), (1 if p["trans_b"] else 0,)), ((), ()))
    ours = lambda a, b: jaxgemm.dot_general(a, b, dims)
    xla = lambda a, b: lax.dot_general(a, b, dims)
    t0 = time.perf_counter()
    compiled = jax.jit(ours).lower(a, b).compile()
    first_s = time.perf_counter() - t0
    os.environ["JAXGEMM_AUTOTUNE"] = "off"
    t0 = time.perf_counter()
    jax.jit(lambda a, b: ours(a, b)).lower(a, b).compile()
    off_s = time.perf_counter() - t0
    os.environ["JAXGEMM_AUTOTUNE"] = "on"
    xla_c = jax.jit(xla).lower(a, b).compile()
    jax.block_until_ready((compiled(a, b), xla_c(a, b)))
    ours_ms, xla_ms = timing.time_paired(timer, compiled, xla_c, (a, b), 20)
    ratio = float(np.median(xla_ms) / np.median(ours_ms))
    problem, = jaxgemm.problems_in(ours, a, b, backward=False)
    choice = dispatch.choose(problem, "auto")
    picked = f"{choice.backend}/{choice.variant}"
    rows.append({**p, "first_compile_s": first_s, "compile_off_s": off_s,
                 "auto_ms": float(np.median(ours_ms)), "xla_ms": float(np.median(xla_ms)),
                 "auto_vs_xla": ratio, "picked": picked})
    print(f"{i:3d} {p['m']}x{p['k']}x{p['n']} {p['dtype']} ta={p['trans_a']:d} "
          f"tb={p['trans_b']:d}: first compile {first_s:.2f} s (off: {off_s:.2f} s), "
          f"auto {ratio:.3f}x XLA ({picked})", flush=True)
  with open(report_path, "w") as f:
    json.dump(rows, f, indent=1)
  r = np.array([x["auto_vs_xla"] for x in rows])
  extra = np.array([x["first_compile_s"] - x["compile_off_s"] for x in rows])
  print(f"auto vs XLA: geomean {math.exp(np.log(r).mean()):.3f}x, worst {r.min():.3f}x, "
        f"{int((r < 0.97).sum())} of {len(r)} below 0.97x; measurement cost per problem: "
        f"median {np.median(extra):.2f} s, max {extra.max():.2f} s "
        f"(device {jax.devices()[0].device_kind})")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--count", type=int, default=12)
  ap.add_argument("--seed", type=int, default=None)
  ap.add_argument("--second-process", action="store_true")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  if args.child:
    run(json.loads(args.child), args.out)
    return
  seed = args.seed if args.seed is not None else int(time.time()) % 100000
  print(f"seed {seed}", flush=True)
  problems = draw(args.count, seed)
  out_dir = args.out or tempfile.mkdtemp(prefix="measure-probe-")
  os.makedirs(out_dir, exist_ok=True)
  env = {**os.environ, "JAXGEMM_AUTOTUNE": "on",
         "JAXGEMM_AUTOTUNE_CACHE": os.path.join(out_dir, "autotune.json")}
  runs = 2 if args.second_process else 1
  for r in range(runs):
    print(f"--- process {r + 1}", flush=True)
    res = subprocess.run([sys.executable, __file__, "--child", json.dumps(problems),
                          "--out", os.path.join(out_dir, f"run{r + 1}.json")], env=env,
                         capture_output=True, text=True)
    measured = [l for l in res.stderr.splitlines() if "jaxgemm: measured" in l]
    print(res.stdout, flush=True)
    print(f"process {r + 1}: {len(measured)} measurement lines", flush=True)
    for l in measured[:40]:
      print("  " + l)
    if res.returncode:
      print(res.stderr[-4000:])
  if runs == 2:
    a, b = (json.load(open(os.path.join(out_dir, f"run{r}.json"))) for r in (1, 2))
    same = sum(x["picked"] == y["picked"] for x, y in zip(a, b))
    print(f"second process: {same} of {len(a)} picks the same kernel")


if __name__ == "__main__":
  main()
