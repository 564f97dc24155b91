"""The shared test base: one mechanism parametrizes every test over every kernel.

A test that takes a `kernel` argument runs once per (op, backend, variant) of
the op its module names, `pytestmark = pytest.mark.op("matmul")`, times
`jaxgemm.backends(op)` x `jaxgemm.variants(backend, op)` (ids like
`matmul-xla-dot_general`), so each kernel that registers itself is covered by
the whole base at once.

    @pytest.mark.cases(COMMON, xla=WIDE)
    def test_x(kernel, case): ...

runs every kernel on the COMMON cases and the xla backend (fast, the
reference) also on WIDE; cases are values or `pytest.param(value, id=...)`.
`@pytest.mark.kernel_backends` limits a test to the non-xla backends.

Inputs are random with a fresh seed per test case, derived from the test id
and a session seed (printed in the header; set JAXGEMM_TEST_SEED to replay).
"""

from __future__ import annotations

import faulthandler
import os
import random
import threading
import zlib

# Before jax starts its CPU backend. The Mosaic GPU interpreter blocks XLA:CPU
# threads in its barrier callbacks; with XLA:CPU's concurrency-optimized
# scheduler on 2 cores (CI's machine), the persistent Pallas kernels' forced
# stream-K test finished in 1 run of 5 and hung in the others, and in 5 of 5
# with it off (the cuBLAS-kernels and TMA-ring probe at 0834948).
os.environ["XLA_FLAGS"] = " ".join(filter(None, [
    os.environ.get("XLA_FLAGS"), "--xla_cpu_enable_concurrency_optimized_scheduler=false"]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jaxgemm  # noqa: E402
from jaxgemm import registry  # noqa: E402
from gemm_testing import Kernel, all_kernels  # noqa: E402

# A test that runs longer than this (an interpreted kernel that deadlocks)
# ends the run with every thread's traceback instead of hanging CI.
TEST_TIMEOUT_S = float(os.environ.get("JAXGEMM_TEST_TIMEOUT", 600))

# Backends whose interpreted kernels are too slow for the heavy tests on CPU:
# the Mosaic GPU interpreter ran one 20-step MLP test on pallas for over 120 s,
# while all 24 heavy tests of the 6 Triton rungs took 26 s together.
SLOW_INTERPRETERS = {"pallas"}
# Kernels whose every case a file of their own checks on the CPU, so the shared base
# runs them in the GPU tier only: scaled_matmul's xla "dequantize_bf16"
# (tests/test_scaled_matmul_xla.py), which took 51 s of CI's CPU in the shared base
# (at 949dcdc).
OWN_FILE_KERNELS = {("scaled_matmul", "xla", "dequantize_bf16")}


def sampled_on_cpu(kernel) -> bool:
  """Whether the shared base's heavy products (`slow_for_kernels`) leave most of
  `kernel`'s cases to the GPU tier: a slow interpreter's kernel."""
  return kernel.backend in SLOW_INTERPRETERS

# A user's tuning cache must not change which kernels the tests run: off,
# unless a test points JAXGEMM_AUTOTUNE_CACHE at its own file. (The tables
# shipped for a device kind still apply: they are part of the package.)
os.environ["JAXGEMM_AUTOTUNE_CACHE"] = "off"
# Nor may measuring at lowering (`jaxgemm.measure`, on a GPU): each new problem would
# cost seconds and make the kernel a test runs depend on the GPU's timings. The
# tests of measuring turn it on (tests/test_measure.py).
os.environ["JAXGEMM_AUTOTUNE"] = "off"

SESSION_SEED = int(os.environ.get("JAXGEMM_TEST_SEED", random.SystemRandom().randrange(2**31)))


def has_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


def pytest_configure(config):
  config.addinivalue_line("markers", "op(name): the op whose kernels `kernel` runs over")
  config.addinivalue_line(
      "markers", "cases(common, xla=()): test cases for every kernel, plus xla-only ones")
  config.addinivalue_line("markers", "kernel_backends: only the non-xla backends' kernels")
  config.addinivalue_line(
      "markers", "slow_for_kernels(keep=0, variants=None, cpu_variants=None, rotate=False): "
                 "mark `slow` on slow interpreters (all cases but the first `keep`; only the "
                 "named variants if given; every variant but `cpu_variants`; with rotate, "
                 "each case on one kernel in turn)")


def pytest_report_header(config):
  lines = [f"jaxgemm test seed: JAXGEMM_TEST_SEED={SESSION_SEED}",
           f"jax {jax.__version__}, devices: {jax.devices()}"]
  for op in registry.ops():
    for b in jaxgemm.backends(op):
      lines.append(f"jaxgemm {op} backend {b!r}: variants {list(jaxgemm.variants(b, op))}")
  return lines


def _as_param(case):
  if isinstance(case, type(pytest.param(None))):
    return case
  return pytest.param(case, id=str(case))


def pytest_generate_tests(metafunc):
  if "kernel" not in metafunc.fixturenames:
    return
  op_marker = metafunc.definition.get_closest_marker("op")
  if op_marker is None:
    raise pytest.UsageError(f"{metafunc.definition.nodeid} takes `kernel`: name its op with "
                            f"pytestmark = pytest.mark.op(name), one of {registry.ops()}")
  kernels = all_kernels(op_marker.args[0])
  if metafunc.definition.get_closest_marker("kernel_backends") is not None:
    kernels = [k for k in kernels if not k.is_xla]
  # Heavy chains of GEMMs (a 20-step training run is ~100 kernel launches) are
  # `slow` on backends whose CPU interpreter is slow, so `-m "not slow"` keeps
  # the CPU run short; they run compiled in the GPU tier (`make gpu-test`).
  # With keep=N, a slow interpreter runs the first N cases on the CPU and leaves
  # the rest of the product (every layout of every rung) to the GPU tier.
  # With variants=(...), only those variants' cases are marked (a variant whose
  # other cases the kernel's own tests or another variant's already run).
  # With cpu_variants=(...), a slow interpreter's other variants run wholly in the GPU
  # tier (the costly persistent rungs, whose every case the cheap ones also check).
  # With rotate=True, each case runs on the CPU on one slow-interpreter kernel in turn
  # (case i on the i-th, modulo their number): every case and every kernel stays on
  # the CPU once, and the rest of the product goes to the GPU tier.
  heavy = metafunc.definition.get_closest_marker("slow_for_kernels")
  keep = heavy.kwargs.get("keep", 0) if heavy is not None else None
  only = heavy.kwargs.get("variants") if heavy is not None else None
  on_cpu = heavy.kwargs.get("cpu_variants") if heavy is not None else None
  rotate = heavy.kwargs.get("rotate", False) if heavy is not None else False
  slow_kernels = [k for k in kernels if sampled_on_cpu(k)
                  and (on_cpu is None or k.variant in on_cpu)]

  def marks_of(k, case_index=0):
    if (op_marker.args[0], k.backend, k.variant) in OWN_FILE_KERNELS:
      return [pytest.mark.slow]
    if heavy is None or not sampled_on_cpu(k):
      return []
    if on_cpu is not None and k.variant not in on_cpu:
      slow = True
    elif rotate:
      slow = slow_kernels.index(k) != case_index % len(slow_kernels)
    else:
      slow = case_index >= keep and (only is None or k.variant in only)
    return [pytest.mark.slow] if slow else []
  marker = metafunc.definition.get_closest_marker("cases")
  if marker is None:
    metafunc.parametrize("kernel", [pytest.param(k, id=str(k), marks=marks_of(k))
                                    for k in kernels])
    return
  common = [_as_param(c) for c in marker.args[0]]
  xla_only = [_as_param(c) for c in marker.kwargs.get("xla", ())]
  params = []
  for k in kernels:
    for i, case in enumerate(common + (xla_only if k.is_xla else [])):
      (value,) = case.values
      params.append(pytest.param(k, value, id=f"{k}-{case.id}",
                                 marks=[*case.marks, *marks_of(k, i)]))
  metafunc.parametrize(("kernel", "case"), params)


def pytest_collection_modifyitems(config, items):
  if has_gpu():
    return
  skip = pytest.mark.skip(reason=f"needs a GPU; jax.devices() = {jax.devices()}")
  for item in items:
    if item.get_closest_marker("gpu") is not None:
      item.add_marker(skip)


_REAL_STDERR = None


def _watchdog_fire(nodeid):
  _REAL_STDERR.write(f"\n\n*** {nodeid} ran longer than JAXGEMM_TEST_TIMEOUT="
                     f"{TEST_TIMEOUT_S:g} s; ending the test run. Threads:\n")
  _REAL_STDERR.flush()
  faulthandler.dump_traceback(_REAL_STDERR, all_threads=True)
  _REAL_STDERR.flush()
  os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  global _REAL_STDERR
  if TEST_TIMEOUT_S <= 0:
    yield
    return
  if _REAL_STDERR is None:
    capman = item.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
      _REAL_STDERR = os.fdopen(os.dup(2), "w")
  timer = threading.Timer(TEST_TIMEOUT_S, _watchdog_fire, (item.nodeid,))
  timer.daemon = True
  timer.start()
  # Backstop should the hung code hold the GIL: the C-level watchdog.
  faulthandler.dump_traceback_later(TEST_TIMEOUT_S + 30, exit=True, file=_REAL_STDERR)
  try:
    yield
  finally:
    timer.cancel()
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def seed(request) -> int:
  return zlib.crc32(request.node.nodeid.encode()) ^ SESSION_SEED


@pytest.fixture
def rng(seed) -> np.random.Generator:
  return np.random.default_rng(seed)


@pytest.fixture
def x64():
  """Enables float64 for the test (jax.enable_x64 context)."""
  with jax.enable_x64(True):
    yield


__all__ = ["Kernel"]


@pytest.fixture
def fresh_measurement(tmp_path, monkeypatch):
  """`auto` measuring from nothing: a private cache file (its path), no shipped tables,
  nothing remembered by this process, measuring on (the tiers run with it off)."""
  from jaxgemm import measure, tuning_cache  # noqa: PLC0415
  path = tmp_path / "autotune.json"
  monkeypatch.setenv(tuning_cache.CACHE_ENV, str(path))
  monkeypatch.setenv(tuning_cache.TABLES_ENV, "off")
  monkeypatch.setenv(measure.ENABLED_ENV, "on")
  monkeypatch.setattr(measure, "_failed", set())
  monkeypatch.setattr(measure, "_instead", {})
  tuning_cache.forget()
  yield path
  tuning_cache.forget()
