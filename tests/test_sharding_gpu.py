"""Sharded GEMMs on several GPUs with the real kernels: the GPU tier of the sharding rules.

Marked `gpu`: skipped cleanly without a GPU (conftest.py), and skipped here with fewer
than two. The CPU tests (tests/sharding_on_8_devices.py) run `backend="xla"` only: the
interpreters cannot run inside a partitioned program on the CPU. Here each backend's
compiled kernels run on their shards, through the benchmark's `sharded` suite at its
test size (bench/sharded.py: every layout and a (data, model) training step, each
against XLA's program of the same expression on the same mesh). No timing is asserted.
"""

from __future__ import annotations

import jax
import pytest

from jaxgemm.bench import runner, sharded as S
from jaxgemm.timing import Timer

pytestmark = pytest.mark.gpu

if jax.devices()[0].platform == "gpu" and jax.device_count() < 2:
  pytest.skip(f"needs several GPUs, has {jax.devices()}", allow_module_level=True)


@pytest.mark.parametrize("backend", ["triton", "pallas", "auto"])
def test_every_layout_and_the_step_run_their_shards_like_xla(backend):
  rows = []
  ctx = runner.Context(platform="gpu", device_kind=jax.devices()[0].device_kind,
                       timer=Timer("gpu"), iters=20, dtype_name="bf16",
                       provenance={"platform": "gpu"}, emit=rows.append, log=print,
                       run_id="gpu-test")
  S.run_sharded_suite(ctx, [backend], size="test")
  # The user's call (auto's row "default", a named backend's "(default)"); XLA's one row.
  default = {backend: "default" if backend == "auto" else "(default)"}
  every = {(r["problem"], r["backend"], r["variant"]): r for r in rows}
  by = {(r["problem"], r["backend"]): r for r in rows
        if r["variant"] == default.get(r["backend"], r["variant"])}
  names = [lay.name for lay in S.layouts("test")] + [S.STEP_NAME]
  assert sorted({r["problem"] for r in rows}) == sorted(names + S.mlp_names("test"))
  for name in S.mlp_names("test"):   # the Megatron-SP MLP: no more bytes than jnp's
    r = by[name, backend]
    assert r["status"] == "ok", (name, r.get("error"), r.get("note"))
    assert r["collective_mb"] <= by[name, runner.REF]["collective_mb"], (name, r["collectives"])
    ring = every[name, backend, "overlap=True"]   # issue 46: the rings, with the kernels
    assert ring["status"] == "ok", (name, ring.get("error"), ring.get("note"))
    assert ring["collectives"].startswith("collective-permute"), ring["collectives"]
  for name in names:
    r = by[name, backend]
    assert r["status"] == "ok", (name, r.get("error"), r.get("note"))
    assert "all-gather" not in r["collectives"], (name, r["collectives"])
    if name == "sharded.row.K-scatter":
      assert r["collectives"].startswith("reduce-scatter")
      assert r["collective_mb"] <= by[name, runner.REF]["collective_mb"]
    else:
      assert r["same_collectives"] == 1, (name, r["collectives"], by[name, runner.REF])
  tokens, d, ff, _ = S.SIZES["test"]
  n = jax.device_count()
  assert f"1x({tokens // n}x{d} @ {d}x{ff})" in by["sharded.data.M", backend]["local_problems"]
  assert f"1x({tokens}x{d} @ {d}x{ff // n})" in by["sharded.column.N", backend]["local_problems"]
  assert by[S.STEP_NAME, backend]["agree"] == 1
  # the named backend's kernels are what ran (custom calls of the compiled programs)
  kernel = {"triton": "triton_kernel_call", "pallas": "mosaic_gpu"}.get(backend)
  if kernel:
    for name in names:
      assert kernel in by[name, backend]["custom_calls"], (name, by[name, backend]["custom_calls"])
