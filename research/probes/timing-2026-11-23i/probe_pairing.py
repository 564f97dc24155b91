"""Probe (GPU): how a paired timing of two kernels should alternate them.

The -23h default run read XLA's dot against itself at 0.935x on 4096x8192x57344
(`auto` ran XLA's dot there). This records raw CUPTI times, call by call, to see
why and to choose `jaxgemm.timing.time_paired`'s block size and statistic.

A: XLA's dot (the benchmark's reference) and `jaxgemm.matmul(backend="xla")` (the
   same dot through matmul_p) on five shapes: 100 back-to-back calls of the
   reference, then `time_paired` of the two with blocks of about 1 call, 10 ms,
   25 ms and the old iters / 2 (block_ms=1e9), 40 calls a side, three reps each.
B: the table's Pallas kernels against XLA's dot, blocks of 10 ms and iters / 2,
   40 calls a side, three reps.
nvidia-smi samples clocks, power and throttle reasons every 50 ms meanwhile.
Everything raw goes to $OUT/pairing.json (the analysis is offline).

  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/timing-2026-11-23i/probe_pairing.py [A][B]
"""
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemm
from research.probe_helpers import operands, prob
from jaxgemm import dispatch
from jaxgemm.timing import Timer, time_paired

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp")
print("jax", jax.__version__, jax.devices(), flush=True)
sections = sys.argv[1] if len(sys.argv) > 1 else "AB"
SHAPES = {"4096x8192x57344": (4096, 8192, 57344), "16384^3": (16384, 16384, 16384),
          "8192^3": (8192, 8192, 8192), "8192x4096x14336": (8192, 4096, 14336),
          "8192x14336x4096": (8192, 14336, 4096)}
KERNELS = {"4096x8192x57344": "warp_specialized", "8192^3": "stream_k",
           "8192x4096x14336": "stream_k", "8192x14336x4096": "clusters"}
BLOCKS = {"1call": 1e-3, "10ms": 10.0, "25ms": 25.0, "half": 1e9}
ITERS, REPS = 40, 3
smi = subprocess.Popen(
    ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
     "clocks_throttle_reasons.active", "--format=csv,noheader", "-lms", "50"],
    stdout=open(f"{OUT}/smi.csv", "w"), stderr=subprocess.STDOUT)


class Recorder:
  """A Timer that logs every block: (who, wall start, wall end, times)."""

  def __init__(self, timer, names):
    self.timer, self.names, self.log = timer, names, []
    self.label = timer.label

  def time(self, f, args, iters):
    t0 = time.time()
    out = self.timer.time(f, args, iters)
    self.log.append((self.names[id(f)], t0, time.time(), [round(x, 5) for x in out]))
    return out


timer = Timer("gpu")
data = {"jax": jax.__version__, "records": []}


def xla_ref(a, b):
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())))


def run_pairs(shape, what, kernel, ref, args, blocks):
  for bname in blocks:
    for rep in range(REPS):
      rec = Recorder(timer, {id(kernel): "kernel", id(ref): "ref"})
      k, r = time_paired(rec, kernel, ref, args, ITERS, block_ms=BLOCKS[bname])
      ratio = float(np.median(r) / np.median(k))
      data["records"].append({"shape": shape, "what": what, "blocks": bname, "rep": rep,
                              "log": rec.log, "ratio": ratio})
      print(f"{shape:16s} {what:28s} {bname:5s} rep {rep}: ratio {ratio:.4f} "
            f"(ref {np.median(r):.4f} ms, kernel {np.median(k):.4f} ms, "
            f"{len(rec.log)} blocks)", flush=True)


for shape, (m, k, n) in SHAPES.items():
  a, b = operands(prob(1, m, n, k))
  args = (a[0], b[0])
  ref = jax.jit(xla_ref).lower(*args).compile()
  jax.block_until_ready(ref(*args))
  if "A" in sections:
    rec = Recorder(timer, {id(ref): "ref"})
    rec.time(ref, args, 100)
    data["records"].append({"shape": shape, "what": "back-to-back", "log": rec.log})
    t = rec.log[0][3]
    print(f"{shape:16s} back-to-back 100: min {min(t):.4f} median {np.median(t):.4f} "
          f"max {max(t):.4f} ms; first 10 {t[:10]}", flush=True)
    twin = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="xla")).lower(*args).compile()
    jax.block_until_ready(twin(*args))
    run_pairs(shape, "xla-vs-xla", twin, ref, args, BLOCKS)
  if "B" in sections and shape in KERNELS:
    variant = KERNELS[shape]
    p = prob(1, m, n, k)
    cfg = dispatch.choose(p, "pallas", variant).config
    kern = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="pallas", variant=variant,
                                               config=cfg)).lower(*args).compile()
    out = kern(*args)
    err = float(jnp.linalg.norm((out.astype(jnp.float32) - ref(*args).astype(jnp.float32)))
                / jnp.linalg.norm(ref(*args).astype(jnp.float32)))
    print(f"{shape:16s} pallas/{variant} {cfg.to_json()} relerr vs XLA {err:.2e}", flush=True)
    run_pairs(shape, f"pallas/{variant}", kern, ref, args, ("10ms", "half"))
  del a, b, args
  print(f"t={time.time() - T0:.0f}s", flush=True)

smi.terminate()
json.dump(data, open(f"{OUT}/pairing.json", "w"))
print(f"done t={time.time() - T0:.0f}s", flush=True)
