"""The sharded suite's entry: jaxgemm on a mesh of every device against XLA's dot on the
same mesh (issue 25), and its table.

Its layouts and training step run in bench/sharded.py (`sharded.run_suite`); its rows
(kinds `sharded_gemm`, `sharded_step`) are not a table of one device's problems, so the
report shows them after the training table.
"""

from __future__ import annotations

from ..entry import BenchOp, Section, Suite
from ..report.csvio import REF, num
from ..report.markdown import fmt_x, table

SHARDED_NOTE = (
    "Each row: one program on a mesh of every device, jaxgemm's call against jnp's on the same "
    "inputs and shardings, timed interleaved by the wall clock (a program on several GPUs has no "
    "one kernel time). Collectives are read off each compiled HLO (per kind: ops, MB of results "
    "on one device); memory is what XLA plans per device (arguments + outputs + temporaries - "
    "aliased); TFLOP/s counts the program's GEMM FLOPs over its time, all devices together. "
    "`bench/sharded.py` says more.")


def _local_problems(text: str) -> str:
  """One or two local problems as they are; more (a training step's) as a count."""
  problems = [p for p in text.split("; ") if p]
  return "; ".join(problems) if len(problems) <= 2 else f"{len(problems)} (in the CSV)"


def sharded_table(run) -> list[str]:
  """The sharded suite: each layout's and the training step's rows (bench/sharded.py)."""
  rows = [r for r in run.rows if r["kind"] in ("sharded_gemm", "sharded_step")]
  if not rows:
    return []
  out = []
  for problem in dict.fromkeys(r["problem"] for r in rows):
    mine = [r for r in rows if r["problem"] == problem]
    ref = next((r for r in mine if r["backend"] == REF), mine[0])
    body = []
    for r in [*(r for r in mine if r["backend"] != REF), ref]:
      t, mem = num(r.get("time_ms_median")), num(r.get("mem_per_device_gb"))
      losses = (f"{num(r['loss_first']):.4f} -> {num(r['loss_last']):.4f}"
                if num(r.get("loss_first")) else "")
      diff = num(r.get("loss_max_rel_diff"))
      body.append([
          "XLA (jnp)" if r["backend"] == REF else f"{r['backend']}/{r['variant']}",
          r["status"] + (f": {r['error'][:80]}" if r.get("error") else ""),
          f"{t:.3f}" if t else "-", fmt_x(num(r.get("speedup_vs_xla"))),
          f"{num(r['tflops']):.0f}" if num(r.get("tflops")) else "-",
          f"{mem:.2f}" if mem is not None else "-", r.get("collectives") or "-",
          {"1": "same", "0": "differ"}.get(r.get("same_collectives", ""), ""),
          losses + (f" (max rel diff {diff:.1e})" if diff is not None else ""),
          _local_problems(r.get("local_problems", "")), r.get("custom_calls") or "-"])
    note = ref.get("problem_note", "")
    out += [f"**`{problem}`**: {note} (mesh {ref.get('mesh', '?')}).", "",
            *table(["GEMMs", "status", "ms (median)", "vs XLA", "TFLOP/s", "GB/device",
                     "collectives", "vs XLA's", "loss first -> last",
                     "local problems", "custom calls"], body), ""]
  return out[:-1]



def _section(run) -> list[str]:
  rows = sharded_table(run)
  return [SHARDED_NOTE, "", *rows] if rows else []


ENTRY = BenchOp(
    name="sharded", order=50, ops=("matmul",), family="sharded",
    suites=(
        Suite("sharded", "sharded GEMMs on a mesh of every device (issue 25): data (M), column "
              "(N), row (K: all-reduce, or reduce-scatter), experts (batch) at Llama-3-8B MLP "
              "sizes, and a data x tensor parallel training step, vs XLA's dot on the same "
              "mesh: time, collectives, memory per device", None, runner="sharded",
              list_note="GEMM layouts and a training step on a mesh: see bench/sharded.py"),
    ),
    run_sections=(Section(
        "Suite `sharded` (a mesh of every device)", _section,
        readme_title=lambda run: (f"Sharded: {run.first.get('device_count', '?')} x "
                                  f"{run.first.get('device', '?')}")),),
)
