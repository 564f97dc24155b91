"""Probe G: after the untiled-C epilogue and the cluster clamp: correctness of
single-tile / odd-tile cluster problems, and timing of ragged + aligned shapes."""
import time
import jax, jax.numpy as jnp
from jax import lax
from jaxgemm.backends import pallas as P
from research.probe_helpers import BE, guard, kernel, operands as data, prob, ref64, relerr, timeit

T0 = time.time()

print("== G0: producing a (1,4095,4093) bf16 from a (1,4096,4096) one ==", flush=True)
c = jax.random.normal(jax.random.key(0), (1, 4096, 4096), jnp.float32).astype(jnp.bfloat16)
def wall(f, x, n=200):
  jax.block_until_ready(f(x)); t0 = time.perf_counter()
  for _ in range(n): y = f(x)
  jax.block_until_ready(y); return (time.perf_counter() - t0) / n * 1e6
cands = {
  "slice": lambda c: c[:, :4095, :4093],
  "concat rows": lambda c: jnp.concatenate([c[:, :4088, :4093], c[:, 4088:4095, :4093]], axis=1),
  "concat cols": lambda c: jnp.concatenate([c[:, :4095, :4088], c[:, :4095, 4088:4093]], axis=2),
  "cols then flat prefix": lambda c: c[:, :, :4093].reshape(-1)[:4095 * 4093].reshape(1, 4095, 4093),
  "rows only": lambda c: c[:, :4095, :],
  "cols only": lambda c: c[:, :, :4093],
}
for name, fn in cands.items():
  f = jax.jit(fn)
  def go():
    try:
      cu = f"{timeit(f, c)*1e3:7.1f} us"
    except Exception as ex:  # noqa: BLE001
      cu = f"(cupti: {type(ex).__name__})"
    print(f"{name:24s} cupti {cu}  wall {wall(f, c):7.1f} us", flush=True)
  guard(name, go)

print("== G1: correctness, all variants, small / single-tile / odd tiles ==", flush=True)
bad = 0
for (bt, m, k, n) in [(1, 33, 40, 24), (1, 40, 33, 24), (1, 33, 24, 40), (3, 33, 40, 24), (1, 3, 8, 8),
                      (2, 100, 70, 50), (1, 128, 256, 64), (1, 300, 200, 260), (2, 257, 64, 65),
                      (1, 4095, 333, 517)]:
  for ta in (False, True):
    for tb in (False, True):
      p = prob(bt, m, n, k, ta, tb)
      a, b = data(p, m * 7 + k)
      ref = ref64(p, a, b)
      for v in P.VARIANTS:
        cfg = BE.default_config(p, v)
        def go():
          BE.check(p, v, cfg)
          e = relerr(kernel(p, v, cfg)(a, b), ref)
          global bad
          if e > 1e-2:
            bad += 1
            print(f"BAD {v} {bt}x{m}x{k}x{n} ta={ta:d} tb={tb:d} err={e:.1e} {cfg}", flush=True)
        guard(f"{v} {bt}x{m}x{k}x{n} {ta} {tb}", go)
print(f"G1: {bad} bad, t={time.time()-T0:.0f}s", flush=True)

print("== G2: timing (TFLOP/s, ratio vs XLA dot in this process) ==", flush=True)
for name, p in [("u4095x4097x4093", prob(1, 4095, 4093, 4097)), ("u2047x2049x2051", prob(1, 2047, 2051, 2049)),
                ("u8191x8193x8191", prob(1, 8191, 8191, 8193)), ("u127x4099x4097", prob(1, 127, 4097, 4099)),
                ("u1000^3", prob(1, 1000, 1000, 1000)), ("4096^3", prob(1, 4096, 4096, 4096)),
                ("8192^3", prob(1, 8192, 8192, 8192))]:
  a, b = data(p, 1)
  xf = jax.jit(lambda a, b: lax.dot_general(a[0], b[0], (((1,), (0,)), ((), ()))))
  tx = timeit(xf, a, b)
  print(f"{name:16s} xla              {p.flops/tx/1e9:7.1f}", flush=True)
  for v in P.VARIANTS:
    if name in ("8192^3",) and v in ("basic", "pipelined"):
      continue
    cfg = BE.default_config(p, v)
    def go():
      BE.check(p, v, cfg)
      f = kernel(p, v, cfg)
      t = timeit(f, a, b)
      print(f"{name:16s} {v:16s} {p.flops/t/1e9:7.1f} {tx/t:6.3f}x", flush=True)
    guard(f"{name} {v}", go)
print(f"done in {time.time()-T0:.0f}s", flush=True)
