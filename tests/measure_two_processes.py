"""One process of `test_measure.py::test_two_processes_run_process_0s_kernel` (not a test file).

    python tests/measure_two_processes.py PORT PROCESS_ID CACHE_FILE

Two CPU processes joined by `jax.distributed` (gloo collectives). Each reads its own
tuning cache: process 0's names the triton kernel for the problem, process 1's names
XLA. Both lower the same program; `jaxgemm.measure.agree` broadcasts process 0's
choice at the decision, inside the lowering, so both must run triton. Prints
"CHOICE <backend>/<variant>" and the result's checksum.
"""

from __future__ import annotations

import os
import sys

port, process_id, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["JAXGEMM_AUTOTUNE_CACHE"] = cache
os.environ["JAXGEMM_TABLES"] = "off"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxgemm  # noqa: E402
from jaxgemm import measure  # noqa: E402

decided = []
original = measure.agree


def recording(choice, problem):
  agreed = original(choice, problem)
  decided.append(agreed)
  return agreed


measure.agree = recording
rng = np.random.default_rng(0)
a = jnp.asarray(rng.standard_normal((48, 32)), jnp.float32)
b = jnp.asarray(rng.standard_normal((32, 40)), jnp.float32)
out = jax.jit(lambda a, b: jaxgemm.matmul(a, b))(a, b)
c, = decided
print(f"CHOICE {c.backend}/{c.variant}", flush=True)
print(f"SUM {float(np.asarray(out, np.float64).sum()):.6f}", flush=True)
jax.distributed.shutdown()
