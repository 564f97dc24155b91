"""Runs a file of 8-device tests in its own process with 8 host CPU devices (XLA_FLAGS is
read once, when jax starts), with this session's seed: `tests/test_sharding.py` and
`tests/test_scaled_ragged_dot.py` call it.

The process runs on the CPU platform even on a GPU machine (JAX_PLATFORMS=cpu): there jax
would otherwise give the file the GPUs, and the file skips itself without 8 devices (the
GPU tier at 8560031 on one H100 failed `test_partitions_on_8_host_devices` so).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from conftest import SESSION_SEED


def run_on_8_host_devices(tests: pathlib.Path, timeout_s: float) -> None:
  """Runs pytest on `tests` and fails unless every test in it passed (none skipped)."""
  env = dict(os.environ, JAXGEMM_TEST_SEED=str(SESSION_SEED), TF_CPP_MIN_LOG_LEVEL="2",
             JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                              "--xla_force_host_platform_device_count=8"])))
  run = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
      cwd=tests.parent.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
  output = run.stdout + run.stderr
  summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
  print(f"{tests.name}: {summary}")
  assert run.returncode == 0, f"{tests.name} failed:\n{output[-12000:]}"
  assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary
