"""`backend="auto"` measuring on a real GPU (`jaxgemm.measure`): CUPTI, nested compiles.

Marked `gpu`: skipped cleanly without one. The CPU tests (tests/test_measure.py) drive
the same path with a fake timer; here the lowering really compiles and times the
candidates on the device, while the user's program is being compiled. No time is
asserted: what a measurement cost is printed (run with -s) and measured by
research/probes/measure/probe.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import assert_gemm_close, matmul_reference, random_array, tolerance
from jaxgemm import dispatch, measure, tuning_cache

pytestmark = pytest.mark.gpu
BF16 = np.dtype(jnp.bfloat16)


def test_auto_measures_while_the_program_compiles(fresh_measurement, rng, capfd):
  a = random_array(rng, (1000, 700), BF16)
  b = random_array(rng, (700, 1500), BF16)
  out = jax.jit(lambda a, b: jaxgemm.matmul(a, b))(a, b)
  ref, bound = matmul_reference(a, b)
  assert_gemm_close(out, ref, bound, tolerance(BF16), "measured auto")
  err = capfd.readouterr().err
  assert "jaxgemm: measured 1x(1000x700 @ 700x1500)" in err, err
  print(err)
  entries = json.loads(fresh_measurement.read_text())["entries"]
  timers = {r["timer"] for shapes in entries.values() for r in shapes.values()}
  assert timers == {"cupti"}


def test_each_op_and_each_gemm_of_a_gradient_is_measured(fresh_measurement, rng, capfd):
  x = random_array(rng, (512, 384), BF16)
  w = random_array(rng, (384, 640), BF16)
  bias = random_array(rng, (640,), BF16)
  loss = lambda x, w, bias: (jaxgemm.matmul(x, w, bias=bias, activation="gelu")
                             .astype(jnp.float32) ** 2).sum()
  jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w, bias))
  group_sizes = jnp.array([100, 0, 300, 112], jnp.int32)
  ws = random_array(rng, (4, 384, 640), BF16)
  out = jax.jit(lambda x, w, g: jaxgemm.ragged_dot(x, w, g))(x, ws, group_sizes)
  ref = np.concatenate([np.asarray(x[s:e], np.float64) @ np.asarray(ws[i], np.float64)
                        for i, (s, e) in enumerate(zip([0, 100, 100, 400], [100, 100, 400, 512]))])
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=2e-2,
                             atol=2e-2 * np.abs(ref).max())
  lines = [l for l in capfd.readouterr().err.splitlines() if "jaxgemm: measured" in l]
  print("\n".join(lines))
  assert len(lines) >= 4, lines   # the epilogue forward, two gradient GEMMs, the ragged_dot


def test_a_second_process_measures_nothing_and_picks_the_same(fresh_measurement, rng):
  script = textwrap.dedent("""
      import jax, jax.numpy as jnp, numpy as np, jaxgemm
      from jaxgemm import dispatch
      a = jnp.ones((2000, 300), jnp.bfloat16); b = jnp.ones((300, 1200), jnp.bfloat16)
      jax.block_until_ready(jax.jit(lambda a, b: jaxgemm.matmul(a, b))(a, b))
      p = jaxgemm.GemmProblem(1, 2000, 1200, 300, np.dtype(jnp.bfloat16),
                              np.dtype(jnp.bfloat16), np.dtype(jnp.bfloat16))
      c = dispatch.choose(p, "auto")
      print("CHOICE", c.backend, c.variant, c.config.to_json())
  """)
  env = {**os.environ, tuning_cache.CACHE_ENV: str(fresh_measurement), tuning_cache.TABLES_ENV: "off",
         measure.ENABLED_ENV: "on"}
  runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=600) for _ in range(2)]
  for r in runs:
    assert r.returncode == 0, r.stderr[-3000:]
  assert "jaxgemm: measured" in runs[0].stderr
  assert "jaxgemm: measured" not in runs[1].stderr, runs[1].stderr
  choice = lambda r: [l for l in r.stdout.splitlines() if l.startswith("CHOICE")]
  assert choice(runs[0]) == choice(runs[1]) != []
