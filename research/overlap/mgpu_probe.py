"""Issue 46 probe: does a one-kernel all-gather + GEMM (Mosaic GPU, remote TMA stores) run
on this machine's jax, and how close does it get to the local GEMM alone?

x (S, D) on tokens, W1 (D, F) on columns: y = all_gather(x) @ W1, the Megatron-SP MLP's
first GEMM. Rows, each the wall clock of back-to-back calls on every GPU (ms):
  xla        shard_map(all_gather(x) @ w): XLA's collective, then cuBLAS
  floor      the gathered x already on each device: the local GEMM alone
  jax/<cfg>  jax's own example kernel (jax.experimental.pallas.ops.gpu.collective_matmul_mgpu),
             the reference for what the kernel-level route gives here

    python research/overlap/mgpu_probe.py [--model 70b] [--iters 30]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import traceback

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgemm.bench import sharded

MODELS = {"8b": (8192, 4096, 14336), "70b": (8192, 8192, 28672)}


def wall_ms(f, args, iters: int) -> float:
  """The median of back-to-back calls in blocks of 5 (the sharded suite's timer)."""
  jax.block_until_ready(f(*args))
  return statistics.median(sharded.PipelinedWallTimer().time(f, args, 5 * iters, chunk=iters))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="70b", choices=sorted(MODELS))
  ap.add_argument("--iters", type=int, default=20)
  a = ap.parse_args()
  s, d, f = MODELS[a.model]
  n = jax.device_count()
  print(f"jax {jax.__version__}, {n} x {jax.devices()[0].device_kind}, {a.model}: "
        f"x {s}x{d}, W1 {d}x{f}; per device {s // n}x{d} @ {d}x{f // n}")
  mesh = jax.make_mesh((n,), ("x",))
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.device_put(jax.random.normal(kx, (s, d), jnp.bfloat16),
                     NamedSharding(mesh, P("x", None)))
  w = jax.device_put(jax.random.normal(kw, (d, f), jnp.bfloat16) / d ** 0.5,
                     NamedSharding(mesh, P(None, "x")))
  xg = jax.device_put(x, NamedSharding(mesh, P()))
  smap = functools.partial(jax.shard_map, mesh=mesh, out_specs=P(None, "x"),
                           check_vma=False)
  xla = jax.jit(smap(lambda x, w: lax.all_gather(x, "x", axis=0, tiled=True) @ w,
                     in_specs=(P("x", None), P(None, "x"))))
  floor = jax.jit(smap(lambda x, w: x @ w, in_specs=(P(), P(None, "x"))))
  ref = xla(x, w)
  flops = 2 * s * d * f / n
  rows = {}

  def row(name, fn, args):
    try:
      out = fn(*args)
      err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
      ms = wall_ms(fn, args, a.iters)
      rows[name] = ms
      print(f"{name:48s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s/GPU  "
            f"max|diff| vs xla {err:.3g}", flush=True)
    except Exception as e:  # noqa: BLE001 (a probe: report and go on)
      print(f"{name:48s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
      traceback.print_exc(limit=3)

  row("xla", xla, (x, w))
  row("floor", floor, (xg, w))
  try:
    from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as cm  # noqa: PLC0415
  except ImportError as e:
    print("jax's collective_matmul_mgpu: not importable:", e)
    cm = None
  if cm is not None:
    M = cm.MatmulDimension
    for tm, tn, minor, width, wg in [(128, 128, M.N, 8, M.N), (128, 128, M.M, 8, M.N),
                                     (128, 256, M.N, 8, M.M), (128, 128, M.N, 4, M.M),
                                     (256, 128, M.N, 8, M.N)]:
      cfg = cm.TuningConfig(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=4,
                            grid_minor_dim=minor, grid_tile_width=width, wg_dimension=wg)
      fn = jax.jit(smap(functools.partial(cm.all_gather_lhs_matmul, axis_name="x",
                                          config=cfg, dtype=jnp.bfloat16),
                        in_specs=(P("x", None), P(None, "x"))))
      row(f"jax/{tm}x{tn} minor={minor.name} w={width} wg={wg.name}", fn, (x, w))
  if "xla" in rows and "floor" in rows:
    for name, ms in rows.items():
      if name not in ("xla", "floor"):
        eff = (rows["xla"] - ms) / (rows["xla"] - rows["floor"])
        print(f"  {name}: {rows['xla'] / ms:.3f}x xla, overlap efficiency {eff:.2f}")


if __name__ == "__main__":
  main()
