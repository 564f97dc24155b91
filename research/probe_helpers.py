"""What the Pallas development probes share: problems, inputs, references, CUPTI timing.

Used by `research/pallas_probe.py` and the probes under `research/probes/`
(`from research.probe_helpers import ...`, run from the repository root with it on
PYTHONPATH; GPU only; not the benchmark).
Factored out of those scripts after their GPU runs, whose logs came from
copies of these functions.
"""
import importlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.mosaic.gpu import profiler

import jaxgemm
from jaxgemm import GemmProblem

ITERS = 20
BE = jaxgemm.registry.get_backend("pallas")


def prob(b, m, n, k, ta=False, tb=False, dt=jnp.bfloat16, out=None):
  """A GemmProblem with float32 accumulation (output in `out`, default the operand dtype)."""
  dt = np.dtype(dt)
  return GemmProblem(b, m, n, k, dt, np.dtype(out or dt), np.dtype(np.float32), ta, tb)


def operands(p, seed=0):
  """Standard normal A and B of `p`, rounded to its dtype."""
  ka, kb = jax.random.split(jax.random.key(seed))
  return (jax.random.normal(ka, p.a_shape, jnp.float32).astype(p.dtype),
          jax.random.normal(kb, p.b_shape, jnp.float32).astype(p.dtype))


def ref64(p, a, b):
  """op(A) @ op(B) in float64."""
  A, B = np.asarray(a, np.float64), np.asarray(b, np.float64)
  A = A.transpose(0, 2, 1) if p.trans_a else A
  B = B.transpose(0, 2, 1) if p.trans_b else B
  return A @ B


def relerr(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.abs(x - ref).max() / np.abs(ref).max())


def kernel(p, variant, cfg):
  """The variant's kernel function called directly (no matmul_p, no check)."""
  fn = getattr(importlib.import_module(f"jaxgemm.kernels.pallas.matmul.{variant}"), variant)
  return jax.jit(lambda a, b: fn(a, b, p, cfg))


def pallas_fn(p, variant, cfg):
  """The variant through matmul_p, as jaxgemm.matmul runs it."""
  return jax.jit(lambda a, b: jaxgemm.matmul_p.bind(
      a, b, trans_a=p.trans_a, trans_b=p.trans_b, out_dtype=p.out_dtype,
      acc_dtype=p.acc_dtype, precision=None, backend="pallas", variant=variant, config=cfg))


def xla_fn(p):
  """XLA's batched dot with f32 results: the accuracy reference on the GPU."""
  dims = (((1 if p.trans_a else 2,), (2 if p.trans_b else 1,)), ((0,), (0,)))
  return jax.jit(lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=jnp.float32))


def xla2d_fn(p):
  """The timing baseline: XLA's dot on 2-D operands, output in the operand dtype."""
  dims = (((0 if p.trans_a else 1,), (1 if p.trans_b else 0,)), ((), ()))
  return jax.jit(lambda a, b: lax.dot_general(a[0], b[0], dims))


def timeit(f, *args):
  """Median CUPTI kernel time (ms) over ITERS calls, after a warm-up call."""
  jax.block_until_ready(f(*args))
  _, t = profiler.measure(f, iterations=ITERS)(*args)
  t = [sum(x[1] for x in y) if isinstance(y, (list, tuple)) else y for y in t]
  return statistics.median(t)


def guard(label, fn):
  """Runs fn, printing an error line instead of stopping the probe."""
  try:
    fn()
  except Exception as ex:  # noqa: BLE001
    print(f"{label} ERR {type(ex).__name__}: {str(ex)[:600]}", flush=True)
