"""On one GPU: a jaxgemm GEMM on a 1-device mesh, through the package's partitionable
lowering (`jaxgemm/sharding.py`), compiles to the same program and runs at the same speed
as the unsharded call, with the kernel chosen for the same (whole) problem.

  PYTHONPATH=$PWD/.gpu-site python3 research/sharding/one_gpu.py    (after `make gpu-env`)
  one_gpu.py [N [BACKEND...]]: N x N x N bf16 (default 4096); backends triton, pallas, xla.

CPU dry run (wall clock, not GPU timings): .venv/bin/python research/sharding/one_gpu.py 256 xla
"""

import difflib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm import sharding, timing


def program(text):
  """The compiled HLO without names and metadata, to compare two programs."""
  quoted = r'"(?:[^"\\]|\\.)*"'
  text = re.sub(rf",? ?(metadata|sharding|frontend_attributes)=\{{(?:{quoted}|[^{{}}\"])*\}}", "", text)
  return re.sub(r"[%\w.-]*\.\d+\b", "x", text.split("ENTRY")[-1])


TIMER = timing.Timer(timing.platform_of())


def median_ms(f, *args, iters=100):
  f(*args).block_until_ready()
  return float(np.median(TIMER.time(f, args, iters)))


print(jax.__version__, jax.devices())
mesh = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
k1, k2 = jax.random.split(jax.random.key(0))
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096                  # one_gpu.py [N [BACKEND...]]
a = jax.random.normal(k1, (n, n), jnp.bfloat16)
b = jax.random.normal(k2, (n, n), jnp.bfloat16)
for backend in sys.argv[2:] or ("triton", "pallas", "xla"):
  f = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend=backend))
  try:
    sa, sb = (jax.device_put(x, NamedSharding(mesh, s)) for x, s in ((a, P("d", None)), (b, P())))
    with sharding.recording_local_problems() as seen:
      plain = f.lower(a, b).compile()
      sharded = f.lower(sa, sb).compile()
    same = program(plain.as_text()) == program(sharded.as_text())
    equal = bool(jnp.array_equal(plain(a, b), sharded(sa, sb)))
    t_plain, t_sharded = median_ms(plain, a, b), median_ms(sharded, sa, sb)
    t_plain2 = median_ms(plain, a, b)
    print(f"{backend:7} same program: {same}, equal results: {equal}, "
          f"median ms unsharded {t_plain:.3f} / {t_plain2:.3f}, 1-device mesh {t_sharded:.3f}, "
          f"({TIMER.label}), kernels lowered for {[x.problem.describe() for x in seen]}")
    if not same:   # what differs (the H200 run of 2026-11-25 printed False, not this)
      print("\n".join(list(difflib.unified_diff(program(plain.as_text()).splitlines(),
                                                 program(sharded.as_text()).splitlines(),
                                                 lineterm=""))[:40]))
  except Exception as e:  # noqa: BLE001
    print(f"{backend:7} FAILED {type(e).__name__}: {str(e)[:400]}")
