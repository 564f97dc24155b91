"""The models suite's entry: ordinary models' training steps, XLA's against
`jaxgemm.accelerate(loss)` inside the step's gradient (issue 47), and its table.

The steps run in bench/models.py (`models.run_suite`). Its rows are of kinds
`model_step` (one per program) and `train_loss` (one per step, which the training plot
draws).
"""

from __future__ import annotations

from ..entry import BenchOp, Section, Suite
from ..report.csvio import REF, num
from ..report.markdown import fmt_x, table

MODELS_NOTE = (
    "Each model is written the ordinary way (`x @ w`, `jnp.einsum`, `lax.ragged_dot`, "
    "`jax.nn.dot_product_attention`; no jaxgemm call inside). XLA's row is `jax.jit(step)` and "
    "the others the same step with `jaxgemm.accelerate(loss, ...)` inside its gradient. "
    "All start from the same "
    "parameters and train on the same batches. Each is timed interleaved with XLA's step. "
    "`bench/models.py` says more.")


def models_table(run) -> list[str]:
  """A table per model: each program's step time, its ratio to XLA's, tokens per second,
  memory and losses."""
  rows = [r for r in run.rows if r["kind"] == "model_step"]
  out = []
  for problem in dict.fromkeys(r["problem"] for r in rows):
    mine = [r for r in rows if r["problem"] == problem]
    ref = next((r for r in mine if r["backend"] == REF), mine[0])
    body = []
    for r in [ref, *(r for r in mine if r is not ref)]:
      t, mem = num(r.get("time_ms_median")), num(r.get("mem_per_device_gb"))
      diff = num(r.get("loss_last_rel_diff"))
      body.append([
          "XLA (jax.jit(step))" if r["backend"] == REF else f"accelerate, {r['variant']}",
          r["status"] + (f": {r['error'][:80]}" if r.get("error") else ""),
          f"{t:.2f}" if t else "-", fmt_x(num(r.get("speedup_vs_xla"))),
          f"{num(r['tokens_per_s']):,.0f}" if num(r.get("tokens_per_s")) else "-",
          f"{mem:.1f}" if mem is not None else "-",
          (f"{num(r['loss_first']):.4f} -> {num(r['loss_last']):.4f}"
           if num(r.get("loss_first")) else "-"),
          f"{diff:.2e}" if diff is not None else "-"])
    out += [f"**`{problem}`**: {ref.get('problem_note', '')}, {ref.get('steps', '?')} steps.", "",
            *table(["program", "status", "ms/step", "vs XLA", "tokens/s", "GB planned",
                    "loss first -> last", "last loss vs XLA's"], body), ""]
  return out[:-1]


def _section(run) -> list[str]:
  rows = models_table(run)
  return [MODELS_NOTE, "", *rows] if rows else []


ENTRY = BenchOp(
    name="models", order=60, ops=("matmul",), family="models",
    suites=(
        Suite("models", "ordinary models' training steps (a Llama-3-8B-like decoder, a "
              "Qwen3-30B-A3B-like MoE) as XLA's program and with jaxgemm.accelerate(loss), bf16 "
              "and fp8='block' (issue 47)", None, runner="models",
              list_note="training steps of two models: see bench/models.py"),
    ),
    peers=("accelerate",),
    train_ref_label="XLA (jax.jit(step))",
    run_sections=(Section("Suite `models` (accelerate on ordinary models)", _section,
                          readme_title="Models: accelerate(loss) vs XLA"),),
)
