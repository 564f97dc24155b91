"""Run 2: where the epilogue's time goes, bias+residual's ring and GLU's tile shape.

bias+residual's tile slots cost a stage at 256x128x64 (3 instead of 4); with
epi_tile_n=32 the slots halve and 4 stages fit. Timed paired with XLA's bf16
program as in probe.py; the plain matmul at 3 stages isolates the ring's cost.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import timing
from probe import BF16, F32, FUSED, GLU, MATMUL, err, log, operands
from jaxgemm.ops.fused_matmul import pallas as fp
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.glu import pallas as gp
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul.problem import GemmProblem

timer = timing.Timer("gpu")
log(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
for m, k, n in [(4096, 4096, 4096), (8192, 4096, 14336)]:
  x, w, w2, r = operands([(1, m, k), (1, k, n), (1, k, n), (1, m, n)], BF16)
  bias = operands([(n,)], BF16, seed=1)[0]
  flops = 2 * m * n * k
  runs = []
  g = GemmProblem(1, m, n, k, BF16, BF16, F32)
  base = MATMUL.default_config(g, "clusters")
  runs.append(("matmul 3 stages", MATMUL, g, "clusters",
               dataclasses.replace(base, max_concurrent_steps=3), (x, w), lambda x, w: x @ w))
  pr = FusedMatmulProblem(1, m, n, k, BF16, BF16, F32, bias="shared", residual=True)
  d = FUSED.default_config(pr, "clusters")
  user = lambda x, w, b, r: x @ w + b + r
  runs.append(("bias+res default", FUSED, pr, "clusters", d, (x, w, bias, r), user))
  runs.append(("bias+res epi32/4", FUSED, pr, "clusters",
               dataclasses.replace(d, epi_tile_n=32, max_concurrent_steps=4), (x, w, bias, r), user))
  pg = FusedMatmulProblem(1, m, n, k, BF16, BF16, F32, activation="gelu", bias="shared")
  dg = FUSED.default_config(pg, "clusters")
  runs.append(("gelu+bias epi32", FUSED, pg, "clusters", dataclasses.replace(dg, epi_tile_n=32),
               (x, w, bias), lambda x, w, b: jax.nn.gelu(x @ w + b)))
  runs.append(("gelu+bias ws", FUSED, pg, "warp_specialized",
               FUSED.default_config(pg, "warp_specialized"),
               (x, w, bias), lambda x, w, b: jax.nn.gelu(x @ w + b)))
  pl_ = GluProblem(1, m, n, k, BF16, BF16, F32, activation="silu")
  dl = GLU.default_config(pl_, "dual_clusters")
  glu_user = lambda x, w, v: jax.nn.silu(x @ w) * (x @ v)
  runs.append(("glu 256x64", GLU, pl_, "dual_clusters",
               dataclasses.replace(dl, tile_m=256, tile_n=64), (x, w, w2), glu_user))
  runs.append(("glu m-minor", GLU, pl_, "dual_clusters",
               dataclasses.replace(dl, grid_minor_m=True), (x, w, w2), glu_user))
  for name, backend, p, variant, cfg, args, user_fn in runs:
    try:
      backend.check(p, variant, cfg)
      kern = jax.jit(backend.impl(p, variant, cfg, "cuda"))
      xla = jax.jit(user_fn)
      out, ref = jax.block_until_ready((kern(*args), xla(*args)))
      e = err(out, ref)
      kt, xt = timing.time_paired(timer, kern, xla, args, 20)
      km, xm = float(np.median(kt)), float(np.median(xt))
      f = flops * (2 if backend is GLU else 1)
      log(f"  {m}x{k}x{n} {name:18s} {km * 1e3:8.1f} us ({f / km / 1e9:6.1f} TFLOP/s) | "
          f"XLA bf16 {xm * 1e3:8.1f} us ({xm / km:.3f}x) | rel err vs XLA bf16 {e:.1e} | "
          f"{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}/{cfg.max_concurrent_steps} epi {cfg.epi_tile_n}")
    except Exception as ex:  # noqa: BLE001
      log(f"  FAIL {m}x{k}x{n} {name}: {type(ex).__name__}: {str(ex)[:800]}")
