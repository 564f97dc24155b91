"""Which cuBLAS kernels XLA's dot runs on the issue-4 problems (names carry tile, cluster, schedule)."""
import jax
from jax.experimental.mosaic.gpu import profiler
from research.probe_helpers import operands, prob, xla2d_fn

print("jax", jax.__version__, jax.devices(), flush=True)
for name, p in [("8192^3", prob(1, 8192, 8192, 8192)), ("4096^3", prob(1, 4096, 4096, 4096)),
                ("8192x4096x14336", prob(1, 8192, 14336, 4096)),
                ("8192x14336x4096", prob(1, 8192, 4096, 14336)),
                ("bwd A^T B 4096^3", prob(1, 4096, 4096, 4096, ta=True)),
                ("bwd A B^T 4096^3", prob(1, 4096, 4096, 4096, tb=True)),
                ("128x8192x8192", prob(1, 128, 8192, 8192))]:
  a, b = operands(p)
  f = xla2d_fn(p)
  jax.block_until_ready(f(a, b))
  _, t = profiler.measure(f, aggregate=False, iterations=3)(a, b)
  for kname, ms in t[-1]:
    print(f"{name:18s} {ms * 1e3:8.1f} us  {p.flops / ms / 1e9:6.1f} TFLOP/s  {kname}", flush=True)
