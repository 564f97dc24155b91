"""The models suite's data x tensor parallel rows on 8 host CPU devices (issue 47): run by
tests/test_sharding.py::test_on_8_host_devices[models] in a process of its own.

The dense model trains on a (data 4, model 2) mesh, Megatron's layout
(bench/models.py's PARAM_SPECS), as XLA's step and with its loss accelerated: the losses
agree within the suite's trajectory tolerance, and the accelerated step's parameters stay
sharded as they came.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxgemm
from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import models as M
from jaxgemm.bench import runner
from jaxgemm.bench import training as T
from jaxgemm.bench.report import csvio

pytestmark = pytest.mark.skipif(jax.device_count() != 8, reason="needs 8 host devices")


def test_the_dense_model_trains_data_x_tensor_parallel(tmp_path):
  assert cli.main(["--suite", "models", "--only", "models.llama*.dp4xtp2", "--iters", "2",
                   "--out", str(tmp_path), "--run-name", "dp-tp"]) == 0
  rows = [r for r in csvio.read_csv(tmp_path / "dp-tp" / "results.csv")
          if r["kind"] == "model_step"]
  assert {r["problem"] for r in rows} == {"models.llama3-8b-like.L2.dp4xtp2"}
  mine = {r["backend"]: r for r in rows}
  assert mine[runner.REF]["status"] == "ok", mine[runner.REF].get("error")
  ours = mine[M.ACCELERATE]
  assert ours["status"] == "ok", ours.get("error")
  assert float(ours["loss_max_rel_diff"]) <= T.TRAJECTORY_TOL["bf16"]
  assert float(ours["time_ms_median"]) > 0 and float(ours["speedup_vs_xla"]) > 0


def test_the_accelerated_step_keeps_megatrons_layout():
  spec = M.data_tensor_parallel(M.SPECS["cpu"][0], 8)
  mesh = jax.make_mesh(spec.mesh_shape, ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  params = M.init_params(spec, 0)
  placement = M.shardings(params, mesh)
  params = jax.device_put(params, placement)
  cfg = T.ModelConfig(batch=spec.batch, seq=spec.seq, d_model=spec.d_model,
                      n_heads=spec.n_heads, d_ff=spec.d_ff, n_layers=spec.n_layers,
                      vocab=spec.vocab, steps=1)
  tokens, targets = jax.device_put(next(T.batches(cfg, 0)),
                                   jax.sharding.NamedSharding(mesh, M.BATCH_SPEC))
  step = jax.jit(M.make_step(spec, jaxgemm.accelerate(M.forward_loss)))
  new_params, _, loss = step(params, T.adam_init(params), tokens, targets)
  assert np.isfinite(float(loss))
  for name in ("wq", "wo", "w_gate", "w_down"):
    before, after = params["layers"][0][name], new_params["layers"][0][name]
    assert after.sharding.is_equivalent_to(before.sharding, before.ndim), name
    assert before.sharding.spec == M.PARAM_SPECS[name]
