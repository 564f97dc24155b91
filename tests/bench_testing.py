"""Helpers of the benchmark's CPU tests (tests/test_bench*.py)."""

from __future__ import annotations

from jaxgemm import timing
from jaxgemm.bench import runner


def cpu_context(rows: list, **kw) -> runner.Context:
  """A benchmark run's context on the CPU whose rows go to `rows`, logging nothing (bf16
  unless `dtype_name=` says otherwise).

  >>> rows = []
  >>> cpu_context(rows).dtype_name
  'bf16'
  """
  kw.setdefault("dtype_name", "bf16")
  return runner.Context(platform="cpu", device_kind="cpu", timer=timing.Timer("cpu"), iters=3,
                        provenance={"platform": "cpu"}, emit=rows.append,
                        log=lambda s: None, run_id="cpu-test", **kw)
