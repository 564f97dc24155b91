"""Probe (GPU): does XLA's dot pick a different program in different processes?

The `auto` row of llama3-8b.up.t128 (128x4096x14336) read 1.03x in some default
runs and 0.95-0.96x in others; our Triton kernel's time stayed at 32.1-32.8 us
while XLA's dot read either about 31.2-32.0 us or 33.4-33.7 us, by run. This
starts CHILDREN fresh processes; each compiles XLA's dot (2-D, bf16 out, what
jnp.matmul runs) for the skinny LLM shapes, prints what the optimized HLO runs
(custom-call target, backend_config) and times it paired with jaxgemm's
table kernel (`backend="auto"`) in 10 ms blocks; then the same dot compiled with
XLA's Triton GEMM emitter off (`xla_gpu_enable_triton_gemm=False`), and with
autotuning off as well (`xla_gpu_autotune_level=0`), each timed alone.

  PYTHONPATH=$PWD/.gpu-site:$PWD python3 research/probes/xla-modes-2026-11-23k/probe_xla_modes.py [children [cold,hot]]

"hot" children first run 8192^3 GEMMs back to back for 3 s before compiling each
shape's dot (XLA autotunes it then), as the tuner and the benchmark leave the GPU;
"hotS" children then sleep S seconds before compiling; "priorN" children compile and
run one NxN dot (default 512) first, no sustained load. SHAPES=up.t128,... picks shapes.
"""
import json
import os
import re
import subprocess
import sys
import time

SHAPES = {"up.t128": (128, 4096, 14336), "gate_up.t128": (128, 4096, 28672),
          "down.t128": (128, 14336, 4096), "up.t2048": (2048, 4096, 14336),
          "sq512": (512, 512, 512), "q.t128": (128, 4096, 4096), "qkv.t128": (128, 4096, 6144)}
ITERS = 40


def program_of(line):
  """What an optimized-HLO line runs: cuBLASLt and its algorithm, or a fusion and its tiles."""
  target = re.search(r'custom_call_target="([^"]+)"', line)
  algo = re.search(r'"selected_algorithm":"?(-?\d+)', line)
  tiles = re.search(r'"triton_gemm_config":(\{[^}]*\})', line)
  name = line.strip().split("=")[0].strip()
  return " ".join(filter(None, [name, target and target.group(1), algo and f"algo={algo.group(1)}",
                                tiles and tiles.group(1)]))


def heat(seconds):
  """Back-to-back 8192^3 GEMMs for `seconds`: the GPU as the tuner leaves it."""
  import jax
  import jax.numpy as jnp
  x = jnp.ones((8192, 8192), jnp.bfloat16) * 0.01
  f = jax.jit(lambda x: x @ x)
  t0 = time.time()
  while time.time() - t0 < seconds:
    for _ in range(20):
      y = f(x)
    y.block_until_ready()


def child(tag):
  import jax
  import jax.numpy as jnp
  from jax import lax

  import jaxgemm
  from jaxgemm.timing import Timer, summarize, time_paired

  timer = Timer("gpu")
  mode = tag.split("-")[0]
  settle_s = float(mode[3:] or 0) if mode.startswith("hot") else 0.0
  shapes = os.environ.get("SHAPES", ",".join(SHAPES)).split(",")
  for name, (m, k, n) in ((s, SHAPES[s]) for s in shapes):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (k, n), jnp.float32).astype(jnp.bfloat16)
    if mode.startswith("hot"):
      heat(3.0)
      time.sleep(settle_s)
    elif mode.startswith("prior") and name == shapes[0]:
      # One earlier dot of another shape, compiled and run once: no sustained load.
      size = int(mode[5:] or 512)
      x = jnp.ones((size, size), jnp.bfloat16)
      jax.block_until_ready(jax.jit(lambda x: x @ x)(x))
    t0 = time.perf_counter()
    xla = jax.jit(lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                               preferred_element_type=jnp.bfloat16))
    xla_c = xla.lower(a, b).compile()
    compile_s = time.perf_counter() - t0
    hlo = xla_c.as_text()
    calls = [program_of(ln) for ln in hlo.splitlines()
             if "custom_call_target" in ln or "kind=kCustom" in ln]
    # The same dot with XLA's Triton GEMM emitter off: its autotuner picks among
    # cuBLAS(Lt) algorithms only.
    cublas_c = xla.lower(a, b).compile({"xla_gpu_enable_triton_gemm": False})
    cublas_calls = [program_of(ln) for ln in cublas_c.as_text().splitlines()
                    if "custom_call_target" in ln or "kind=kCustom" in ln]
    # ...and with autotuning off too: cuBLAS with its heuristic's algorithm.
    cublas0_c = xla.lower(a, b).compile({"xla_gpu_enable_triton_gemm": False,
                                         "xla_gpu_autotune_level": 0})
    cublas0_calls = [program_of(ln) for ln in cublas0_c.as_text().splitlines()
                     if "custom_call_target" in ln or "kind=kCustom" in ln]
    auto = jax.jit(lambda a, b: jaxgemm.matmul(a, b)).lower(a, b).compile()
    jax.block_until_ready((xla_c(a, b), auto(a, b), cublas_c(a, b)))
    solo = summarize(timer.time(xla_c, [a, b], ITERS))["median_ms"]
    cublas_ms = summarize(timer.time(cublas_c, [a, b], ITERS))["median_ms"]
    jax.block_until_ready(cublas0_c(a, b))
    cublas0_ms = summarize(timer.time(cublas0_c, [a, b], ITERS))["median_ms"]
    k_ms, x_ms = time_paired(timer, auto, xla_c, [a, b], ITERS)
    rec = dict(proc=tag, shape=name, compile_s=round(compile_s, 2), xla_solo_us=solo * 1e3,
               xla_us=summarize(x_ms)["median_ms"] * 1e3,
               auto_us=summarize(k_ms)["median_ms"] * 1e3, calls=calls,
               cublas_only_us=cublas_ms * 1e3, cublas_calls=cublas_calls,
               cublas_untuned_us=cublas0_ms * 1e3, cublas_untuned_calls=cublas0_calls)
    rec["auto_vs_xla"] = rec["xla_us"] / rec["auto_us"]
    print("REC", json.dumps(rec), flush=True)


if __name__ == "__main__":
  if len(sys.argv) > 2 and sys.argv[1] == "child":
    child(sys.argv[2])
    sys.exit()
  children = int(sys.argv[1]) if len(sys.argv) > 1 else 5
  modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["cold"]
  out = os.environ.get("OUT", "/tmp")
  recs = []
  for i in [f"{m}-{j}" for j in range(children) for m in modes]:
    t0 = time.time()
    p = subprocess.run([sys.executable, __file__, "child", str(i)], capture_output=True, text=True)
    for ln in p.stdout.splitlines():
      if ln.startswith("REC "):
        r = json.loads(ln[4:])
        recs.append(r)
        print(f"proc {i} {r['shape']:13s} xla solo {r['xla_solo_us']:7.1f} us  paired: xla "
              f"{r['xla_us']:7.1f} auto {r['auto_us']:7.1f} ({r['auto_vs_xla']:.3f}x)", flush=True)
        for c in r["calls"]:
          print("    ", re.sub(r"\s+", " ", c)[:300], flush=True)
        if "cublas_only_us" in r:
          print(f"     Triton GEMM off: {r['cublas_only_us']:7.1f} us", " | ".join(r["cublas_calls"]),
                flush=True)
        if "cublas_untuned_us" in r:
          print(f"     and autotuning off: {r['cublas_untuned_us']:7.1f} us",
                " | ".join(r["cublas_untuned_calls"]), flush=True)
    if p.returncode:
      print("child failed", p.returncode, p.stderr[-3000:], flush=True)
    print(f"proc {i} took {time.time() - t0:.1f} s", flush=True)
  json.dump(recs, open(f"{out}/xla_modes_{'_'.join(modes)}.json", "w"), indent=1)
