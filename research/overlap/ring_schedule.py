"""Issue 46 probe: does XLA run a ring's collective-permute under the chunk's GEMM?

The Megatron-SP MLP forward (Llama-3-8B sizes by default) on every GPU of the machine,
jaxgemm.matmul with overlap=None, False and True, the ring's compute alone and the floor,
each compiled with the XLA option sets of OPTION_SETS;
writes each program's scheduled HLO (the entry computation's op order) to --out and
prints the wall time of back-to-back calls (bench/sharded.py's PipelinedWallTimer).

    python research/overlap/ring_schedule.py --out /tmp/rings [--model 70b] [--form fwd+bwd]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import pathlib
import statistics

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding

import jaxgemm
from jaxgemm.bench import sharded as S

# At f2f08dd on 2 x H100 (8B fwd) the latency-hiding scheduler's flag and a parallel
# collective overlap limit of 2 moved nothing beyond the run-to-run spread (1.80-1.93 ms).
OPTION_SETS = {"default": None,
               # collective-permutes between local devices by the copy engines (cudaMemcpy),
               # not NCCL's kernels: no SMs taken from the GEMM beside them.
               "memcpy-p2p": {"xla_gpu_use_memcpy_local_p2p": True}}


class _NoPermute:
  """The ring's compute alone: ppermute returns its operand negated (wrong results; its
  time is the ring's GEMMs, slices and sums with no communication, plus one elementwise
  pass over each chunk). Not the identity: XLA would merge the two GEMMs of one chunk
  (on 2 GPUs that read 1.15 ms, below the floor's 1.46 ms). On 4 GPUs a chunk passes
  two permutes, whose negations XLA cancels (70B read 2.30 ms, below the floor's 2.93):
  trust it on 2 GPUs only."""

  def __enter__(self):
    self.saved = jax.lax.ppermute
    jax.lax.ppermute = lambda x, axis_name, perm: jax.tree.map(jnp.negative, x)

  def __exit__(self, *exc):
    jax.lax.ppermute = self.saved


def timeline(compiled, xs, path: pathlib.Path):
  """GPU 0's kernels of the third of three calls, per stream (a line of the profile):
  start and end in microseconds from the call's first kernel, and the name."""
  import glob  # noqa: PLC0415
  import tempfile  # noqa: PLC0415
  with tempfile.TemporaryDirectory() as d:
    jax.block_until_ready(compiled(*xs))
    with jax.profiler.trace(d):
      for _ in range(3):
        jax.block_until_ready(compiled(*xs))
    data = jax.profiler.ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
  plane = next(p for p in data.planes if p.name.startswith("/device:GPU:0"))
  events = [(line.name, e.start_ns, e.end_ns, e.name) for line in plane.lines
            if "stream" in line.name.lower() for e in line.events]
  events.sort(key=lambda e: e[1])
  # The last call: events after the largest gap between consecutive starts.
  starts = [e[1] for e in events]
  gaps = [(b - a, i + 1) for i, (a, b) in enumerate(zip(starts, starts[1:]))]
  cut = sorted(gaps)[-1][1] if gaps else 0
  last = events[cut:]
  t0 = last[0][1] if last else 0
  rows = [f"{line:>24} {(a - t0) / 1e3:9.1f} {(b - t0) / 1e3:9.1f} {(b - a) / 1e3:8.1f}  "
          f"{name[:90]}" for line, a, b, name in last]
  path.write_text("stream start_us end_us dur_us kernel\n" + "\n".join(rows) + "\n")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--model", default="8b", choices=["8b", "70b"])
  ap.add_argument("--form", default=S.MLP_FORWARD)
  ap.add_argument("--backend", default=None)
  ap.add_argument("--iters", type=int, default=30)
  ap.add_argument("--trace", default="overlap=None,overlap=True,xla_dot",
                  help="programs whose GPU timeline (one call, every stream) is written")
  args = ap.parse_args()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  cfg = {c.model.split("-")[-1].lower(): c for c in S.MLPS["llm"]}[args.model]
  mesh = jax.make_mesh((jax.device_count(),), ("tp",), axis_types=(AxisType.Auto,))
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  normal = lambda k, shape, spec, scale=1.0: S._normal(k, shape, jnp.bfloat16, spec, mesh, scale)
  xs = (normal(keys[0], (cfg.tokens, cfg.d_model), S.MLP_SPECS["x"]),
        normal(keys[1], (cfg.d_model, cfg.d_ff), S.MLP_SPECS["w1"], 1 / math.sqrt(cfg.d_model)),
        normal(keys[2], (cfg.d_ff, cfg.d_model), S.MLP_SPECS["w2"], 1 / math.sqrt(cfg.d_ff)))
  if args.form == S.MLP_TRAINING:
    xs += (normal(keys[3], (cfg.tokens, cfg.d_model), S.MLP_SPECS["out"]),)
  kw = {} if args.backend is None else {"backend": args.backend}
  programs = {"xla_dot": S.mlp_program(jnp.matmul, args.form)}
  for overlap in (None, False, True):
    programs[f"overlap={overlap}"] = S.mlp_program(
        lambda a, b, o=overlap: jaxgemm.matmul(a, b, overlap=o, **kw), args.form)
  ring = programs["overlap=True"]
  programs["ring-compute-only"] = lambda *a: ring(*a)   # its own trace and compile
  programs["floor"] = S.floor_program(args.form, mesh)
  sh = {name: NamedSharding(mesh, spec) for name, spec in S.MLP_SPECS.items()}
  out_sh = (sh["out"] if args.form == S.MLP_FORWARD
            else (sh["out"], sh["x"], sh["w1"], sh["w2"]))
  timer = S.PipelinedWallTimer()
  results = {}
  with jax.set_mesh(mesh):
    for opt_name, options in OPTION_SETS.items():
      for name, fn in programs.items():
        if options and name in ("xla_dot", "floor", "ring-compute-only"):
          continue   # no permutes to change
        try:
          with _NoPermute() if name == "ring-compute-only" else contextlib.nullcontext():
            compiled = jax.jit(fn, out_shardings=None if name == "floor" else out_sh).lower(
                *xs).compile(compiler_options=options)
        except Exception as e:  # noqa: BLE001
          print(f"{opt_name:>22} {name:>14}: {type(e).__name__}: {str(e)[:200]}")
          continue
        safe = f"{args.model}.{args.form}.{name}.{opt_name}".replace("=", "-").replace("+", "-")
        (out / f"{safe}.hlo.txt").write_text(compiled.as_text())
        compiled(*xs)
        times = timer.time(compiled, xs, args.iters, chunk=5)
        results[f"{opt_name} {name}"] = statistics.median(times)
        if name in args.trace.split(","):
          timeline(compiled, xs, out / f"{safe}.timeline.txt")
        permutes = compiled.as_text().count("collective-permute-start(")
        print(f"{opt_name:>10} {name:>18}: {statistics.median(times):.3f} ms "
              f"({permutes} permutes)")
  times_file = out / f"{args.model}.{args.form.replace('+', '-')}.times.json"
  times_file.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
