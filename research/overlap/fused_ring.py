"""Issue 46 probe: the Megatron-SP MLP as ONE ring that carries x's chunk and the running
sum together, so no operand is sliced and no result is placed.

The op-level rings (jaxgemm/collective_matmul.py) lost to XLA's collectives on 2 and 4
H100s. Their timelines (docs/overlap.md) put the loss in copies a ring at the level of
XLA's ops makes: the gather ring writes each chunk's rows into the gathered h, and the
scatter ring slices h's rows for each step (55-58 us a step).

Here device d of n holds x's chunk d and its W1 columns and W2 rows. At step s it holds
x's chunk j = d + s (mod n), received from device d + 1, and the partial sum of y's rows
j that devices j .. d + 1 have added. It computes

    acc = gelu(x_j @ W1_d) @ W2_d + acc_in          (gelu and the add fused in the kernels)

and passes x_j and acc on to device d - 1. After n steps device d holds y's rows d - 1,
complete, and one last permute takes them home. Per step the permute of the sum runs
under the next step's first GEMM, and x's permute under the whole step. Nothing is
sliced; the only exposed transfer is the last one (one chunk of y). jax.vjp of the ring
is a ring too (a ppermute's transpose is the reverse permute), so the backward comes out
as reverse rings of the gradient GEMMs.

Rows (wall clock of back-to-back calls, ms): XLA's program, jaxgemm without a ring, the
op-level rings (overlap=True), this fused ring with each backend, the floor.

    python research/overlap/fused_ring.py --model 70b --form fwd   # on every GPU
    python research/overlap/fused_ring.py --check                  # CPU, 8 devices, float64
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

if "--check" in sys.argv:   # before jax is imported
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + \
      " --xla_force_host_platform_device_count=8"
  os.environ["JAX_ENABLE_X64"] = "1"

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm.bench import sharded

MODELS = {"8b": (8192, 4096, 14336), "70b": (8192, 8192, 28672)}
SPECS = dict(x=P("tp", None), w1=P(None, "tp"), w2=P("tp", None), out=P("tp", None))


def fused_ring_local(x, w1, w2, *, axis: str, n: int, mm):
  """Device d's share: x (S/n, D) its chunk, w1 (D, F/n), w2 (F/n, D); returns y's rows d.

  mm(a, b, activation=None, residual=None): the local GEMM with its epilogue."""
  to_left = [(i, (i - 1) % n) for i in range(n)]   # device i sends to i - 1
  x_cur, acc_in = x, None
  for s in range(n):
    x_next = lax.ppermute(x_cur, axis, to_left) if s < n - 1 else None
    h = mm(x_cur, w1, activation="gelu")
    acc = mm(h, w2) if acc_in is None else mm(h, w2, residual=acc_in)
    if s < n - 1:
      acc_in, x_cur = lax.ppermute(acc, axis, to_left), x_next
  return lax.ppermute(acc, axis, to_left)   # y's rows d - 1, done here, go home


def fused_ring(mesh, mm):
  n = mesh.shape["tp"]
  return jax.shard_map(functools.partial(fused_ring_local, axis="tp", n=n, mm=mm), mesh=mesh,
                       in_specs=(SPECS["x"], SPECS["w1"], SPECS["w2"]),
                       out_specs=SPECS["out"], check_vma=False)


def reference(x, w1, w2):
  return jax.nn.gelu(x @ w1) @ w2


def jaxgemm_mm(backend):
  def mm(a, b, activation=None, residual=None):
    return jaxgemm.matmul(a, b, activation=activation, residual=residual, backend=backend)
  return mm


def training(forward):
  def step(x, w1, w2, dy):
    y, vjp = jax.vjp(forward, x, w1, w2)
    return (y, *vjp(dy))
  return step


def wall_ms(f, args, iters: int) -> float:
  """The median of back-to-back calls in blocks of 5 (the sharded suite's timer)."""
  jax.block_until_ready(f(*args))
  return statistics.median(sharded.PipelinedWallTimer().time(f, args, 5 * iters, chunk=iters))


def check():
  """Every backend the CPU runs, forward and jax.vjp, against float64 on 8 devices."""
  n = jax.device_count()
  mesh = jax.make_mesh((n,), ("tp",), axis_types=(AxisType.Auto,))
  s, d, f = 8 * n, 32, 16 * n
  ks = jax.random.split(jax.random.key(1), 4)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
  x = put(jax.random.normal(ks[0], (s, d), jnp.float64), SPECS["x"])
  w1 = put(jax.random.normal(ks[1], (d, f), jnp.float64) / d ** 0.5, SPECS["w1"])
  w2 = put(jax.random.normal(ks[2], (f, d), jnp.float64) / f ** 0.5, SPECS["w2"])
  dy = put(jax.random.normal(ks[3], (s, d), jnp.float64), SPECS["out"])
  want = jax.jit(training(reference))(x, w1, w2, dy)
  for backend in ("xla", "triton"):
    f32 = lambda t: t.astype(jnp.float32)
    got = jax.jit(training(fused_ring(mesh, jaxgemm_mm(backend))))(
        *map(f32, (x, w1, w2, dy)))
    for name, g, w in zip(("y", "dx", "dW1", "dW2"), got, want):
      err = float(jnp.linalg.norm(g.astype(jnp.float64) - w) / jnp.linalg.norm(w))
      print(f"{backend:7s} {name:4s} relative error {err:.2e}")
      # float32 operands and sums of <= 128 terms: u * sqrt(K) ~ 6e-8 * 11; 1e-5 is loose
      # enough for the gelu's float32 evaluation and catches any wrong chunk (error ~1).
      assert err < 1e-5, (backend, name, err)
  print("check: ok")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="70b", choices=sorted(MODELS))
  ap.add_argument("--form", default="fwd", choices=["fwd", "fwd+bwd"])
  ap.add_argument("--backends", default="xla,auto,triton,pallas")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--check", action="store_true")
  a = ap.parse_args()
  if a.check:
    return check()
  s, d, f = MODELS[a.model]
  n = jax.device_count()
  mesh = jax.make_mesh((n,), ("tp",), axis_types=(AxisType.Auto,))
  print(f"jax {jax.__version__}, {n} x {jax.devices()[0].device_kind}, {a.model} {a.form}: "
        f"S={s} D={d} F={f}", flush=True)
  ks = jax.random.split(jax.random.key(0), 4)
  mk = lambda k, shape, spec, scale=1.0: jax.jit(
      lambda k: (scale * jax.random.normal(k, shape, jnp.float32)).astype(jnp.bfloat16),
      out_shardings=NamedSharding(mesh, spec))(k)
  args = (mk(ks[0], (s, d), SPECS["x"]), mk(ks[1], (d, f), SPECS["w1"], d ** -0.5),
          mk(ks[2], (f, d), SPECS["w2"], f ** -0.5))
  form = (lambda fwd: fwd) if a.form == "fwd" else training
  if a.form != "fwd":
    args += (mk(ks[3], (s, d), SPECS["out"]),)
  sh = NamedSharding(mesh, SPECS["out"])
  out_sh = sh if a.form == "fwd" else (sh, NamedSharding(mesh, SPECS["x"]),
                                       NamedSharding(mesh, SPECS["w1"]),
                                       NamedSharding(mesh, SPECS["w2"]))

  def floor_local(x, w1, w2, *dy):   # the local GEMMs alone: x tiled to every token
    tile = lambda t: jnp.concatenate([t] * n, axis=0)
    return form(reference)(tile(x), w1, w2, *map(tile, dy))
  floor_specs = (SPECS["x"], SPECS["w1"], SPECS["w2"]) + ((SPECS["out"],) if a.form != "fwd" else ())
  floor = jax.shard_map(floor_local, mesh=mesh, in_specs=floor_specs, check_vma=False,
                        out_specs=(P("tp", None) if a.form == "fwd" else
                                   (P("tp", None), P("tp", None), SPECS["w1"], SPECS["w2"])))
  programs = {"xla": (form(reference), out_sh)}
  for backend in a.backends.split(","):
    mm = lambda x, w, o, b=backend: jaxgemm.matmul(x, w, backend=b, overlap=o)
    prog = lambda x, w1, w2, mm=mm, o=None: mm(jax.nn.gelu(mm(x, w1, o)), w2, o)
    programs[f"{backend} no ring"] = (form(prog), out_sh)
    programs[f"{backend} fused ring"] = (form(fused_ring(mesh, jaxgemm_mm(backend))), out_sh)
  programs["floor"] = (floor, None)
  want = None
  rows = {}
  with jax.set_mesh(mesh):
    for name, (fn, shardings) in programs.items():
      try:
        compiled = jax.jit(fn, out_shardings=shardings).lower(*args).compile()
        out = compiled(*args)
        first = out if a.form == "fwd" else out[0]
        if name == "xla":
          want = first
        err = "" if name == "floor" else (
            f"  rel err of y vs xla {float(jnp.linalg.norm((first - want).astype(jnp.float32)) / jnp.linalg.norm(want.astype(jnp.float32))):.2e}")
        permutes = compiled.as_text().count("collective-permute-start(")
        rows[name] = wall_ms(compiled, args, a.iters)
        print(f"{name:24s} {rows[name]:8.3f} ms  ({permutes} permutes){err}", flush=True)
      except Exception as e:  # noqa: BLE001 (a probe: report and go on)
        print(f"{name:24s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
  if "xla" in rows and "floor" in rows:
    for name, ms in rows.items():
      if name not in ("xla", "floor"):
        eff = (rows["xla"] - ms) / (rows["xla"] - rows["floor"])
        print(f"  {name}: {rows['xla'] / ms:.3f}x XLA, overlap efficiency {eff:.2f}")


if __name__ == "__main__":
  main()
