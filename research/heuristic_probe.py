"""Issue 23's heuristic probe: each backend's no-record choice on a suite, with alternatives.

For every problem of a suite (default: `random`), in one process and through the
benchmark's own runner (checked against XLA, timed paired with XLA's dot):

* `<backend>/pick`: what `variant=None` runs with no tuning record;
* `triton/pick~align`: that config with `align_operands` flipped;
* `triton/<rung>` and `pallas/<rung>` at their heuristic configs, for the rungs
  named on the command line.

    PYTHONPATH=.gpu-site:. python3 research/heuristic_probe.py OUT_DIR [SUITE] [RUNGS] [BUDGET_S]

RUNGS: comma-separated `backend/variant`; no new problem starts after BUDGET_S
(default 530). GPU only (on a CPU the interpreters
would take hours). Rows land in OUT_DIR/results.csv in the benchmark's format.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax

import jaxgemm
from bench import problems as P
from bench import runner
from bench.report import csvio
from jaxgemm import dispatch
from jaxgemm.timing import Timer, platform_of

PICK, FLIP = "pick", "pick~align"


def make_fn(bp, dtype_name, backend, label):
  """A jitted-able f(a, b) for the row's (backend, label)."""
  problem = runner.gemm_problem(bp, dtype_name)
  if label in (PICK, FLIP):
    chosen = dispatch.choose(problem, backend)
    variant, config = chosen.variant, chosen.config
    if label == FLIP:
      config = dataclasses.replace(config, align_operands=not config.align_operands)
  else:
    variant = label
    config = jaxgemm.registry.get_backend(backend).default_config(problem, variant)
  dims = bp.dimension_numbers()

  def gemm(a, b):
    return jaxgemm.dot_general(a, b, dims, backend=backend, variant=variant, config=config)
  return gemm


def main(out_dir: str, suite: str = "random", rungs: str = "", budget_s: str = "530") -> None:
  platform = platform_of()
  runner.setup_triton_cache()
  timer = Timer(platform)
  out = Path(out_dir)
  writer = csvio.CsvWriter(out / "results.csv")
  ctx = runner.Context(platform=platform, device_kind=jax.devices()[0].device_kind,
                       timer=timer, iters=20, dtype_name="bf16",
                       provenance=csvio.provenance(), emit=writer, run_id=out.name)
  kernels = [("triton", PICK, ""), ("triton", FLIP, ""), ("pallas", PICK, "")]
  kernels += [(*r.split("/"), "") for r in rungs.split(",") if r]
  t0 = time.perf_counter()
  try:
    for bp in P.SUITES[suite]:
      if time.perf_counter() - t0 > float(budget_s):
        print(f"time budget of {budget_s} s spent: stopped before {bp.name}")
        break
      rows = runner.run_problem(ctx, bp, kernels, make_fn)
      for r in rows:
        chosen = ""
        if r["backend"] != runner.REF and r["variant"] in (PICK, FLIP):
          try:
            c = dispatch.choose(runner.gemm_problem(bp, bp.dtype or "bf16"), r["backend"])
            chosen = f"{c.variant} {c.config.to_json()}"
          except Exception as e:  # noqa: BLE001
            chosen = f"{type(e).__name__}"
        print(f"{bp.name:34s} {r['backend']:8s} {r['variant']:22s} {r['status']:6s} "
              f"{r.get('speedup_vs_xla') or '':>8} {chosen[:150]}", flush=True)
      print(f"-- {time.perf_counter() - t0:.0f} s", flush=True)
  finally:
    writer.close()


if __name__ == "__main__":
  main(*sys.argv[1:])
