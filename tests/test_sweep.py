"""research/sweep/sweep.py on the CPU (issue 44): the problems (model shapes, random
shapes fixed by a seed, under the caps, stored and read back), the fit/held-out split, and
a tiny run that resumes, isolates a problem whose tuning raises and skips one that killed
its process. XLA alone is timed (`--backends xla`), so it takes seconds."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxgemm import registry

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
  spec = importlib.util.spec_from_file_location(f"research_sweep_{name}",
                                                ROOT / "research" / "sweep" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


W = _load("sweep")


def _text(path: Path) -> str:
  with gzip.open(path, "rt") as f:
    return f.read()
FEW = {op: 3 for op in W.RANDOM_COUNTS}


def test_random_problems_are_fixed_by_the_seed_and_under_the_caps():
  a = W.random_problems(1, FEW)
  assert [W.identity(p) for ps in a.values() for p in ps] == \
      [W.identity(p) for ps in W.random_problems(1, FEW).values() for p in ps]
  b = W.random_problems(2, FEW)
  assert {W.identity(p) for p in a["matmul"]} != {W.identity(p) for p in b["matmul"]}
  for op, ps in a.items():
    assert ps and all(p.op == op or op in ("glu", "fused_matmul") for p in ps), op
    assert all(W._cost_ok(p, W.RANDOM_MAX_BYTES) for p in ps)
  # a layer's draw brings the forms its gradient runs (gated GEMMs, the forward saving Z)
  many = W.random_problems(3, {"fused_matmul": 12, "ragged_dot": 12})
  assert any(p.gate for p in many["fused_matmul"] if p.op == "fused_matmul")
  assert {p.mode for p in many["ragged_dot"]} == {"ragged-M", "ragged-K"}


def test_model_problems_hold_the_issues_shapes_in_every_form():
  probs = [p for _, p in W.model_problems()]
  ragged = {(p.groups, p.k, p.n) for p in probs if p.op == "ragged_dot"}
  assert {(128, 2048, 768), (256, 7168, 2048), (32, 7168, 2048), (8, 4096, 14336)} <= ragged
  llama = [p for p in probs if p.op == "matmul" and {p.k, p.n} == {4096, 6144}]
  assert {p.layout for p in llama} == {"NN", "NT", "TN"}
  assert {16, 256, 16384} <= {p.m for p in llama if p.layout == "NN"}
  assert {p.scale_kind for p in probs if p.op == "scaled_matmul"} == {"tensor", "block"}
  assert {"glu", "fused_matmul"} <= {p.op for p in probs}
  assert all(W._cost_ok(p, W.MODEL_MAX_BYTES) for p in probs)


def test_problems_round_trip_through_json_and_the_split_is_a_stable_fifth():
  items = [p for _, p in W.tiny_problems()] + [
      p for ps in W.random_problems(4, FEW).values() for p in ps]
  for p in items:
    q = W.from_json(json.loads(json.dumps(W.to_json(p))))
    assert q == p and W.identity(q) == W.identity(p)
  splits = [W.split_of(f"matmul|x|{i}") for i in range(2000)]
  assert splits == [W.split_of(f"matmul|x|{i}") for i in range(2000)]
  assert 0.17 < splits.count("heldout") / len(splits) < 0.23


def _run(card_dir, *extra):
  return W.main(["run", "--tiny", "--card-dir", str(card_dir), "--backends", "xla",
                 "--limit-s", "120", *extra])


def test_a_tiny_run_resumes_and_summarizes(tmp_path, capsys):
  assert _run(tmp_path) == 0
  files = W.CardFiles.of(tmp_path, "cpu")
  rows = _text(files.csv).splitlines()
  assert rows[0].split(",")[:5] == W.CSV_COLUMNS[:5] and len(rows) == 3
  assert "2 to go" in capsys.readouterr().out
  assert _run(tmp_path) == 0                      # a second call finds everything done
  assert "0 to go" in capsys.readouterr().out
  items = [p for _, p in W.tiny_problems()]
  assert all(W.is_done(p, "cpu", files.cache) for p in items)
  assert W.main(["summarize", "--card-dir", str(tmp_path)]) == 0


def test_workers_share_the_problems_and_the_files(tmp_path):
  """Two worker processes (each its hash share) fill one tuning file, log and state."""
  assert _run(tmp_path, "--workers", "2") == 0
  files = W.CardFiles.of(tmp_path, "cpu")
  items = [p for _, p in W.tiny_problems()]
  assert all(W.is_done(p, "cpu", files.cache) for p in items)
  assert {W.shard_of(W.identity(p), 2) for p in items} == {0, 1}   # both had work
  log = _text(files.log)
  assert "[w0] sweep: 1 problems tuned" in log and "[w1] sweep: 1 problems tuned" in log
  assert W.read_state(files.state) == {"failed": {}, "alone": [], "inflight": {}}
  files.cache.unlink()                  # the committed, gzipped tuning file restores it
  files.unpack()
  assert all(W.is_done(p, "cpu", files.cache) for p in items)


def test_a_worker_waiting_for_the_device_stops_at_the_limit(tmp_path):
  import fcntl
  import time
  lock = W.DeviceLock(tmp_path / "gpu.device", deadline=time.perf_counter() + 0.2)
  with lock.held():                       # free: taken at once, and the hold is counted
    pass
  with open(tmp_path / "gpu.device", "a") as other:
    fcntl.flock(other, fcntl.LOCK_EX)     # another worker holds the device past the limit
    with pytest.raises(W.DeviceTimeUp):
      with lock.held():
        pass
  assert lock.waited_s >= 0.1 and lock.held_s >= 0.0


def test_a_raising_problem_is_isolated_and_one_that_killed_its_process_skipped(
    tmp_path, monkeypatch):
  fused = next(p for _, p in W.tiny_problems() if p.op == "fused_matmul")
  gemm = next(p for _, p in W.tiny_problems() if p.op == "matmul")
  real = W.jaxgemm.autotune

  def autotune(**kw):
    if fused in kw["problems"]:
      raise RuntimeError("a compiler crash")
    return real(**kw)
  monkeypatch.setattr(W.jaxgemm, "autotune", autotune)
  assert _run(tmp_path) == 0
  files = W.CardFiles.of(tmp_path, "cpu")
  state = W.read_state(files.state)
  assert list(state["failed"]) == [W.identity(fused)] and state["inflight"] == {}
  assert "a compiler crash" in state["failed"][W.identity(fused)]
  assert W.is_done(gemm, "cpu", files.cache) and len(_text(files.csv).splitlines()) == 2
  monkeypatch.setattr(W.jaxgemm, "autotune", real)
  assert _run(tmp_path) == 0                      # a failed problem is not tried again
  assert not W.is_done(fused, "cpu", files.cache)

  other = tmp_path / "killed"
  other.mkdir()
  files = W.CardFiles.of(other, "cpu")
  W.write_state(files.state, {"failed": {}, "inflight": [W.identity(gemm)]})
  assert _run(other) == 0
  state = W.read_state(files.state)
  assert list(state["failed"]) == [W.identity(gemm)] and "died" in state["failed"][W.identity(gemm)]
  assert W.is_done(fused, "cpu", files.cache)
  # a chunk in flight when its process died runs one problem at a time
  third = tmp_path / "chunk"
  third.mkdir()
  files = W.CardFiles.of(third, "cpu")
  W.write_state(files.state, {"failed": {}, "inflight": [W.identity(gemm), W.identity(fused)]})
  assert _run(third) == 0
  assert W.read_state(files.state)["failed"] == {}
  assert all(W.is_done(p, "cpu", files.cache) for p in (gemm, fused))
  with gzip.open(files.csv, "rt", newline="") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2 and all(np.isfinite(float(r["xla_ms"])) and r["best"] == "xla"
                                for r in rows)
