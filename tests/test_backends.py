"""The registry and each backend's config: listing, ladders, JSON round trips, and
which backends can run here."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm
from jaxgemm import registry
from gemm_testing import as_f64, assert_gemm_close, best_setting, random_array, tolerance

pytestmark = pytest.mark.op("matmul")


def test_backends_in_preference_order():
  names = jaxgemm.backends()
  assert isinstance(names, tuple) and names[0] == "xla"
  assert len(set(names)) == len(names)
  order = [n for n in ("xla", "triton", "pallas") if n in names]
  assert [n for n in names if n in order] == order


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_variants_ladder(backend):
  vs = jaxgemm.variants(backend)
  assert isinstance(vs, tuple) and vs and all(isinstance(v, str) and v for v in vs)
  assert len(set(vs)) == len(vs)
  b = registry.get_backend(backend)
  assert b.name == backend
  assert issubclass(b.config_cls, jaxgemm.KernelConfig) and b.config_cls.backend == backend


PROBLEMS = [
    jaxgemm.GemmProblem(1, 33, 24, 40, np.dtype(np.float32), np.dtype(np.float32),
                         np.dtype(np.float32), precision=(lax.Precision.HIGHEST,) * 2),
    jaxgemm.GemmProblem(2, 128, 256, 64, np.dtype(jnp.bfloat16), np.dtype(jnp.bfloat16),
                         np.dtype(np.float32), trans_b=True),
    jaxgemm.GemmProblem(1, 4096, 4096, 512, np.dtype(np.float16), np.dtype(np.float32),
                         np.dtype(np.float32), trans_a=True),
]


def _default_configs(backend):
  b = registry.get_backend(backend)
  configs = [b.config_cls()]
  for problem in PROBLEMS:
    for v in b.variants:
      try:
        configs.append(b.default_config(problem, v))
      except (NotImplementedError, ValueError):
        pass
  return configs


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_config_json_round_trip(backend):
  cls = registry.get_backend(backend).config_cls
  for c in _default_configs(backend):
    assert type(c) is cls
    s = c.to_json()
    d = json.loads(s)
    assert d["backend"] == backend
    back = cls.from_json(s)
    assert back == c and hash(back) == hash(c) and back.to_json() == s
    assert cls.from_dict(c.to_dict()) == c
    # Every field survives, with its type.
    for f in dataclasses.fields(cls):
      assert type(getattr(back, f.name)) is type(getattr(c, f.name))


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_config_json_partial_and_foreign(backend):
  cls = registry.get_backend(backend).config_cls
  assert cls.from_json("{}") == cls()                 # missing fields take defaults
  other = "xla" if backend != "xla" else "triton"
  with pytest.raises(ValueError, match=f"backend={other!r}"):
    cls.from_dict({"backend": other})
  with pytest.raises(ValueError, match="valid fields"):
    cls.from_dict({"backend": backend, "no_such_field": 1})


@pytest.mark.slow_for_kernels(keep=1, cpu_variants=("basic", "pipelined", "warp_specialized"))
def test_explicit_config_gives_the_default_result(kernel, rng):
  """config= the backend's default (after a JSON round trip) computes the same result."""
  dtype, precision = best_setting(kernel, (33, 40), (40, 24))
  b = registry.get_backend(kernel.backend)
  problem = jaxgemm.GemmProblem(1, 33, 24, 40, np.dtype(dtype), np.dtype(dtype),
                                 np.dtype(np.float32),
                                 precision=None if precision is None else (precision,) * 2)
  config = b.config_cls.from_json(b.default_config(problem, kernel.variant).to_json())
  x = random_array(rng, (33, 40), dtype)
  w = random_array(rng, (40, 24), dtype)
  out = jaxgemm.matmul(x, w, precision=precision, config=config, **kernel.kw)
  default = jaxgemm.matmul(x, w, precision=precision, **kernel.kw)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(default, np.float32))
  x64, w64 = as_f64(x), as_f64(w)
  assert_gemm_close(out, x64 @ w64, np.abs(x64) @ np.abs(w64),
                    tolerance(dtype, dtype, precision), str(kernel))
  # The config is a static param of matmul_p (hashable, in the jaxpr).
  jaxpr = jax.make_jaxpr(lambda x, w: jaxgemm.matmul(x, w, precision=precision, config=config,
                                                     **kernel.kw))(x, w)
  assert any(e.params.get("config") == config for e in jaxpr.eqns)


def test_xla_config_has_no_fields():
  assert dataclasses.fields(jaxgemm.XlaConfig) == ()
  assert jaxgemm.XlaConfig().to_json() == '{"backend": "xla"}'


def _large_problems():
  """Large problems in every dtype, output dtype, precision and layout the kernels take."""
  sizes = [(1, 2048, 2048, 2048), (1, 4096, 4096, 4096), (1, 8192, 14336, 4096),
           (1, 128, 14336, 4096), (1, 16, 8192, 8192), (4, 4095, 4097, 4093), (1, 1, 4096, 4096)]
  dtypes = [(jnp.bfloat16, jnp.bfloat16), (jnp.bfloat16, jnp.float32), (jnp.float16, jnp.float16),
            (jnp.float16, jnp.float32), (jnp.float32, jnp.float32), (jnp.float32, jnp.bfloat16)]
  for batch, m, n, k in sizes:
    for dtype, out in dtypes:
      precisions = [None, (lax.Precision.HIGHEST,) * 2] if dtype == jnp.float32 else [None]
      for precision in precisions:
        for trans_a in (False, True):
          for trans_b in (False, True):
            yield jaxgemm.GemmProblem(batch, m, n, k, np.dtype(dtype), np.dtype(out),
                                      np.dtype(np.float32), trans_a, trans_b, precision)


@pytest.mark.parametrize("backend", [b for b in jaxgemm.backends() if b != "xla"])
def test_chosen_configs_are_valid_for_large_problems(backend):
  """Every config the library can choose without a tuning record (each variant's
  default and every tuning candidate) passes the backend's own check, for large
  problems the CPU tests never run: a chooser must not hand out a config that
  overflows shared memory (as bf16 -> f32 at 128x256x64 in 3 stages once did), sized
  for the GPU and for the CPU interpreter (`Backend.for_platform`)."""
  bad = []
  for problem, b in itertools.product(_large_problems(), [
      registry.get_backend(backend).for_platform(p) for p in ("cuda", "cpu")]):
    chosen = [(v, b.default_config(problem, v)) for v in b.variants]
    chosen += b.tuning_candidates(problem) if _takes(b, problem) else []
    for variant, config in chosen:
      try:
        b.check(problem, variant, config)
      except NotImplementedError:
        continue   # the variant does not take this dtype or precision: fine
      except ValueError as e:
        bad.append(f"{problem.describe()} {variant} {config.to_json()}: {e}")
  assert not bad, f"{len(bad)} invalid configs, e.g.:\n" + "\n".join(bad[:5])


def _takes(backend, problem) -> bool:
  try:
    backend.check(problem, backend.default_variant(problem),
                  backend.default_config(problem, backend.default_variant(problem)))
  except NotImplementedError:
    return False
  return True


# ------------------------------------------------- which backends can run here


def test_the_test_tier_runs_every_backend():
  """Every registered backend of every op can run in the test environment: the test
  extra installs all that each needs, and a backend left out of `backends()` would
  silently drop its kernels from every test parametrized over it (conftest.py)."""
  missing = {f"{op}/{name}": registry.why_unavailable(b)
             for op in registry.ops() for name, b in registry._BACKENDS[op].items()
             if name not in jaxgemm.backends(op)}
  assert not missing, f"pip install -e '.[test]' installs what these need: {missing}"


@pytest.fixture
def fresh_availability(monkeypatch):
  """why_unavailable asks again (its answers are cached per process), on the CPU;
  the test's answers are dropped after it."""
  monkeypatch.setattr(registry, "_UNAVAILABLE", {})
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  return monkeypatch


def _uninstalled(monkeypatch, module):
  """`module` as if not installed: None in sys.modules fails its import and lookup."""
  monkeypatch.setitem(sys.modules, module, None)


def test_triton_on_cpu_needs_torch(fresh_availability):
  _uninstalled(fresh_availability, "torch")
  for op in registry.ops():
    assert "triton" not in jaxgemm.backends(op), op
    assert "xla" in jaxgemm.backends(op), op
  reason = registry.why_unavailable(registry.get_backend("triton"))
  assert "needs torch" in reason and "jaxgemm[cpu]" in reason
  # Named, it fails before tracing, with the reason (not in the CPU callback).
  x = jnp.ones((8, 8), jnp.float32)
  for call in (lambda: jaxgemm.matmul(x, x, backend="triton"),
               lambda: jax.jit(lambda a: jaxgemm.matmul(a, a, backend="triton"))(x),
               lambda: jaxgemm.glu(x, x, x, backend="triton")):
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: needs torch"):
      call()


def test_triton_on_gpu_needs_jax_triton_not_torch(fresh_availability):
  fresh_availability.setattr(jax, "default_backend", lambda: "gpu")
  _uninstalled(fresh_availability, "torch")
  assert registry.why_unavailable(registry.get_backend("triton")) is None
  fresh_availability.setattr(registry, "_UNAVAILABLE", {})
  _uninstalled(fresh_availability, "jax_triton")
  assert "needs jax_triton" in registry.why_unavailable(registry.get_backend("triton"))


def test_auto_considers_only_backends_that_run(fresh_availability):
  """auto runs triton's heuristic choice where triton names a structural win, and
  XLA once triton cannot run here."""
  triton = registry.get_backend("triton")
  fresh_availability.setattr(type(triton), "structural_win", lambda self, p, kind: "a test")
  problem = jaxgemm.GemmProblem(1, 64, 64, 64, np.dtype(np.float32), np.dtype(np.float32),
                                np.dtype(np.float32))
  assert jaxgemm.dispatch.choose(problem).backend == "triton"
  fresh_availability.setattr(registry, "_UNAVAILABLE", {})
  _uninstalled(fresh_availability, "torch")
  assert jaxgemm.dispatch.choose(problem).backend == "xla"


def test_missing_packages_in_a_fresh_process():
  """Without absl-py (which jax's Mosaic GPU imports) and torch, as after
  `pip install jaxgemm` alone: pallas and triton are not listed, and naming them
  raises what to install."""
  script = textwrap.dedent("""
      import sys

      class Uninstalled:   # absl and torch as if not installed
        @staticmethod
        def find_spec(name, path=None, target=None):
          if name.partition(".")[0] in ("absl", "torch"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

      sys.meta_path.insert(0, Uninstalled)
      import jax, jax.numpy as jnp, jaxgemm
      assert jax.default_backend() == "cpu", jax.default_backend()
      print(jaxgemm.backends())
      x = jnp.ones((8, 8))
      for backend in ("pallas", "triton"):
        try:
          jaxgemm.matmul(x, x, backend=backend)
        except ValueError as e:
          print(e)
  """)
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
  listed, pallas, triton = out.splitlines()
  assert listed == "('xla',)"
  assert pallas.startswith("backend='pallas' cannot run here: needs "
                           "jax.experimental.pallas.mosaic_gpu")
  assert "jaxgemm[pallas]" in pallas and "No module named 'absl'" in pallas
  assert triton.startswith("backend='triton' cannot run here: needs torch")
  assert "jaxgemm[cpu]" in triton
