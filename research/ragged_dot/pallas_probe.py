"""Pallas grouped GEMM probe (GPU only): correctness of each rung and mode vs
lax.ragged_dot, and CUPTI timing of the forward on the issue-26 MoE shapes
against lax.ragged_dot and jax's example kernel (ragged_dot_mgpu).

Run from the repository root: `python3 research/ragged_dot/pallas_probe.py SECTION`
with SECTION one of check-pipelined, check-grouped (ragged-M and ragged-K),
time-g8, time-g64 (the forward), time-g8-dgrad, time-g64-wgrad, ... (the
backward GEMMs), op (through jaxgemm.ragged_dot, value and both gradients).
Its log, pallas_probe.log (in git history at a0ac978), came from this (H100 machine, jax 0.11.2;
the links stand in for the editable install's package-dir mapping), with the
sections of that day (check-pipelined:90 check-grouped:110 time-g64:130
time-g8:150 op:60):

  ln -sfn ../kernels jaxgemm/kernels; ln -sfn ../bench jaxgemm/bench;
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; nvidia-smi -L; set -o pipefail;
  (for s in check-pipelined:70 check-grouped:120 time-g64:90 time-g8:110 \
            time-g64-wgrad:70 time-g8-wgrad:70 op:40; do
     timeout ${s#*:} python3 research/ragged_dot/pallas_probe.py ${s%%:*} || echo "[${s%%:*} rc=$?]";
   done) 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" | tee $OUT/pallas_probe.log

In that run every `grouped` compile failed with a bare AssertionError; the
cause, reproduced by lowering for sm_90a on the CPU (jax 0.10.2 names it: "Failed
to infer a possible set of layouts"), was the TMA row offset `rs - rs % 8`, which
Mosaic GPU cannot prove a multiple of the row tiling; `(rs // 8) * 8` lowers.
The N = 200 case failed for both rungs (C's width not a multiple of 64); C is
now computed 64-wide and sliced there. Neither fix has run on a GPU yet.
"""
import dataclasses, sys, pathlib, time, functools
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem
from jaxgemm.ops.ragged_dot import pallas as P
from jaxgemm.timing import Timer

BE = P.PallasRaggedDot()


def impl_on_sizes(problem, variant, config, platform):
  """The backend's impl, called with (B, G) group sizes (the primitive passes bounds)."""
  from jaxgemm.ops.ragged_dot import schedule as _schedule  # noqa: PLC0415
  f = BE.impl(problem, variant, config, platform)
  return lambda l, r, s: f(l, r, _schedule.group_bounds(s, problem.m))
import os
PLATFORM = "cuda" if jax.devices()[0].platform == "gpu" else "cpu"   # cpu: a dry run of the script
DRY = PLATFORM == "cpu"
F32 = np.dtype(np.float32)
ITERS = 10
T0 = time.time()
print("jax", jax.__version__, jax.devices(), flush=True)


def prob(b, g, m, k, n, dt=jnp.bfloat16, out=None, trans=False, rk=False):
  return RaggedDotProblem(b, g, m, k, n, np.dtype(dt), np.dtype(out or dt), F32, trans_rhs=trans,
                          ragged_contracting=rk)


def operands(p, seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  lhs = jax.random.normal(k1, p.lhs_shape, jnp.float32).astype(p.dtype)
  rhs = jax.random.normal(k2, p.rhs_shape, jnp.float32).astype(p.dtype)
  return lhs, rhs


def reference(p, lhs, rhs, gs):
  outs = []
  hi = lax.Precision.HIGHEST
  for b in range(p.batch):
    l, r = lhs[b].astype(jnp.float32), rhs[b].astype(jnp.float32)
    if p.ragged_contracting:   # out[g] = l[rows g]^T r[rows g]: the vjp of ragged_dot wrt rhs
      w0 = jnp.zeros((p.groups, p.k, p.n), jnp.float32)
      _, vjp = jax.vjp(lambda w: lax.ragged_dot(l, w, gs[b], precision=hi), w0)
      outs.append(vjp(r)[0])
      continue
    if p.trans_rhs:
      r = jnp.swapaxes(r, 1, 2)
    outs.append(lax.ragged_dot(l, r, gs[b], precision=hi))
  return jnp.stack(outs)


def relerr(out, ref):
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def row_err(out, ref):
  """Worst row error relative to the reference's scale (catches a wrong/unstored row)."""
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  scale = np.abs(ref).mean() + 1e-30
  return float(np.abs(out - ref).max() / scale)


def dirichlet_sizes(m, g, seed=0, batch=1):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(batch):
    s = np.floor(rng.dirichlet([2.0] * g) * m).astype(np.int32)
    s[-1] += m - s.sum()
    out.append(s)
  return jnp.asarray(np.stack(out), jnp.int32)


def check(variant):
  print(f"== correctness: {variant} vs lax.ragged_dot (f32 HIGHEST) ==", flush=True)
  C = P.RaggedDotPallasConfig
  cases = [
      (prob(1, 4, 1000, 256, 384), [[300, 0, 1, 500]]),                 # empty, 1 row, tail
      (prob(1, 4, 1000, 256, 384, trans=True), [[300, 0, 1, 500]]),
      (prob(2, 5, 777, 320, 200, jnp.float16), [[100, 250, 0, 7, 420], [0, 0, 777, 0, 0]]),
      (prob(1, 8, 4096, 1024, 512, out=jnp.float32), None),
      (prob(1, 8, 4096, 1024, 512, trans=True), None),
      (prob(1, 16, 2048, 768, 1408), None),
      (prob(1, 4, 1000, 256, 384, rk=True), [[300, 0, 1, 500]]),
      (prob(2, 5, 777, 320, 200, jnp.float16, out=jnp.float32, rk=True),
       [[100, 250, 0, 7, 420], [0, 0, 777, 0, 0]]),
      (prob(1, 16, 2048, 768, 1408, rk=True), None),
  ]
  for p, gs in [cases[0], cases[6]] if DRY else cases:
    if p.ragged_contracting and variant != "grouped":
      continue
    lhs, rhs = operands(p)
    gs = dirichlet_sizes(p.m, p.groups, batch=p.batch) if gs is None else jnp.asarray(gs, jnp.int32)
    ref = reference(p, lhs, rhs, gs)
    d = BE.default_config(p, variant)
    cfgs = [d, dataclasses.replace(d, group_aligned=not d.group_aligned)]
    if variant == "grouped":
      cfgs.append(P._fit(p, "grouped", C(tile_m=256, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                         group_aligned=True)))
      cfgs.append(P._fit(p, "grouped", C(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4,
                                         group_aligned=True)))
    if p.ragged_contracting:
      cfgs = cfgs[:1] + cfgs[2:]
    for cfg in cfgs:
      try:
        BE.check(p, variant, cfg)
        t = time.time()
        out = jax.jit(impl_on_sizes(p, variant, cfg, PLATFORM))(lhs, rhs, gs)
        out = jax.block_until_ready(out)
        e, r = relerr(out, ref), row_err(out, ref)
        ok = e < 1e-2 and r < 0.1
        print(f"{'OK ' if ok else 'BAD'} {variant} {p.describe()} gs={np.asarray(gs).tolist() if p.groups <= 5 else '...'} "
              f"{cfg_name(cfg)} relerr={e:.2e} rowerr={r:.2e} ({time.time() - t:.1f}s)", flush=True)
        if not ok:
          dd = np.abs(np.asarray(out, np.float64) - np.asarray(ref, np.float64))
          if p.ragged_contracting:
            print("   per-group max err:", dd[0].max(axis=(1, 2)).tolist(), flush=True)
          else:
            print("   bad rows:", np.nonzero(dd[0].max(-1) > 0.1 * np.abs(np.asarray(ref)).mean())[0][:40].tolist(), flush=True)
      except Exception as ex:
        print(f"ERR {variant} {p.describe()} {cfg_name(cfg)}: {type(ex).__name__}: {str(ex)[:2000]}", flush=True)


def cfg_name(cfg):
  return (f"{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}/{cfg.max_concurrent_steps} gg={cfg.grid_group} "
          f"epi={cfg.epi_tile_n} {'group-aligned' if cfg.group_aligned else 'tile-aligned'}")


TIMER = Timer("gpu")


def timeit(f, *args):
  f = jax.jit(f)
  jax.block_until_ready(f(*args))
  ts = TIMER.time(f, args, ITERS)
  return float(np.median(ts))


def time_problem(name, g, m, k, n, mode="fwd"):
  """mode: fwd (rhs (G, K, N)), dgrad (rhs (G, N, K)) or wgrad (ragged-K, out (G, K, N))."""
  p = prob(1, g, m, k, n, trans=mode == "dgrad", rk=mode == "wgrad")
  lhs, rhs = operands(p, 1)
  gs = dirichlet_sizes(m, g, seed=1)
  name = f"{name}-{mode}"
  print(f"== {name}: {p.describe()} sizes min/max {int(gs.min())}/{int(gs.max())} ==", flush=True)
  ref = None
  tf = lambda ms: p.flops / (ms * 1e-3) / 1e12

  def report(label, f, *args):
    nonlocal ref
    try:
      ms = timeit(f, *args)
      out = jax.jit(f)(*args)
      e = relerr(out.reshape(ref.shape), ref) if ref is not None else 0.0
      print(f"{name} {label:56s} {ms * 1e3:9.1f} us {tf(ms):7.1f} TFLOP/s relerr={e:.1e}", flush=True)
      return out
    except Exception as ex:
      print(f"{name} {label:56s} ERR {type(ex).__name__}: {str(ex)[:600]}", flush=True)

  if mode == "fwd":
    try:
      dense = jax.jit(lambda a, b: a @ b)
      print(f"{name} {'(dense XLA GEMM, same FLOPs)':56s} {tf(timeit(dense, lhs[0], rhs[0, 0])):7.1f} TFLOP/s", flush=True)
    except Exception as ex:
      print("dense ERR", ex, flush=True)
  if mode == "fwd":
    xla = lambda l, r, s: lax.ragged_dot(l[0], r[0], s[0], preferred_element_type=jnp.bfloat16)
  elif mode == "dgrad":
    xla = lambda l, r, s: lax.ragged_dot(l[0], jnp.swapaxes(r[0], 1, 2), s[0],
                                         preferred_element_type=jnp.bfloat16)
  else:   # XLA's weight gradient: the vjp of ragged_dot wrt rhs, as jax.grad runs it
    def xla(l, d, s):
      w0 = jnp.zeros((g, k, n), l.dtype)
      _, vjp = jax.vjp(lambda w: lax.ragged_dot(l[0], w, s[0]), w0)
      return vjp(d[0])[0]
  ref = report("xla lax.ragged_dot" + ("" if mode == "fwd" else f" ({mode})"), xla, lhs, rhs, gs)
  ref = None if ref is None else ref.reshape(p.out_shape)
  if mode == "fwd":
    from jaxgemm.kernels.pallas.ragged_dot import grouped as K
    tbl = lambda s: K.schedule.row_tiles(K.schedule.group_bounds(s, m), m, 128, K.ROW_ALIGN)
    try:
      print(f"{name} {'(slot table alone)':56s} {timeit(tbl, gs) * 1e3:9.1f} us", flush=True)
    except Exception as ex:
      print("table ERR", ex, flush=True)
    try:
      from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as J
      for bm, bn, bk, st, gbn in [(128, 128, 64, 4, 8), (192, 128, 64, 4, 4)]:
        f = functools.partial(J.ragged_dot, block_m=bm, block_n=bn, block_k=bk,
                              max_concurrent_steps=st, grid_block_n=gbn)
        report(f"jax ragged_dot_mgpu {bm}x{bn}x{bk}/{st} gbn={gbn}",
               lambda l, r, s, f=f: f(l[0], r[0], group_sizes=s[0]), lhs, rhs, gs)
    except Exception as ex:
      print("jax example ERR", ex, flush=True)
  C = P.RaggedDotPallasConfig
  cands = []
  if mode != "wgrad":
    pd = BE.default_config(p, "pipelined")
    cands += [("pipelined", pd), ("pipelined", dataclasses.replace(pd, group_aligned=True))]
  ga = mode != "wgrad"
  cands += [("grouped", BE.default_config(p, "grouped")),
            ("grouped", C(tile_m=256, tile_n=128, tile_k=64, max_concurrent_steps=4, group_aligned=ga)),
            ("grouped", C(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=6, group_aligned=ga)),
            ("grouped", C(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4, group_aligned=ga)),
            ("grouped", C(tile_m=256, tile_n=128, tile_k=64, max_concurrent_steps=4, grid_group=16,
                          group_aligned=ga))]
  seen = set()
  cands = [c for c in cands if not (c in seen or seen.add(c))]
  for v, cfg in cands:
    try:
      BE.check(p, v, cfg)
    except Exception as ex:
      print(f"{name} {v} {cfg} refused: {ex}", flush=True)
      continue
    report(f"{v} {cfg_name(cfg)}", impl_on_sizes(p, v, cfg, "cuda"), lhs, rhs, gs)


def op_check():
  """Through the op (if the lead's primitive takes backend='pallas'): value and grads."""
  import jaxgemm
  p = prob(1, 8, 2048, 512, 768)
  lhs, rhs = operands(p)
  gs = dirichlet_sizes(p.m, p.groups)
  try:
    f = lambda l, r: jaxgemm.ragged_dot(l, r, gs[0], backend="pallas")
    out = jax.jit(f)(lhs[0], rhs[0])
    print("op fwd relerr", relerr(out[None], reference(p, lhs, rhs, gs)), flush=True)
    # d lhs: ragged-M with rhs transposed (pipelined); d rhs: ragged-K (grouped)
    g = jax.jit(jax.grad(lambda l, r: jnp.sum(f(l, r).astype(jnp.float32) ** 2), (0, 1)))(lhs[0], rhs[0])
    gr = jax.grad(lambda l, r: jnp.sum(lax.ragged_dot(l, r, gs[0], preferred_element_type=jnp.float32) ** 2), (0, 1))(lhs[0], rhs[0])
    print("op grad relerr lhs", relerr(g[0], gr[0]), "rhs", relerr(g[1], gr[1]), flush=True)
  except Exception as ex:
    print("op ERR", type(ex).__name__, str(ex)[:1500], flush=True)


SHAPES = {"g8": (8, 16384, 4096, 14336), "g64": (64, 16384, 2048, 1408)}
section = sys.argv[1]
if section.startswith("check-"):
  check(section[len("check-"):])
elif section.startswith("time-"):   # time-g8, time-g64-dgrad, time-g64-wgrad, ...
  shape, _, mode = section[len("time-"):].partition("-")
  time_problem(shape.upper(), *SHAPES[shape], mode=mode or "fwd")
elif section == "op":
  op_check()
print(f"[{section} done in {time.time() - T0:.0f}s]", flush=True)
