"""research/sweep/fit.py on synthetic records (CPU, no jax work): the no-measure rule's
decision, its fit, and its held-out report and JSON (issue 44)."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxgemm

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
  """research/sweep/<name>.py as a module (research/ is not a package)."""
  spec = importlib.util.spec_from_file_location(f"research_sweep_{name}",
                                                ROOT / "research" / "sweep" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module   # dataclasses look their module up while they are made
  spec.loader.exec_module(module)
  return module


F = _load("fit")
FIELDS = "bfloat16->bfloat16 | default | NN"
TP, PK = "triton/persistent", "pallas/clusters"


def rec(ident, dims, kernels, aligned=True, split="fit", fields=FIELDS, kind="H100"):
  return F.Record(kind, "matmul", ident, split, fields, dims, ("b", "m", "n", "k"), aligned,
                  kernels)


def test_distance_is_problem_distance():
  p = jaxgemm.GemmProblem(2, 100, 300, 7, np.dtype("float32"), np.dtype("float32"),
                          np.dtype("float32"))
  for other in ("1x128x256x8", "4x1x5000x7", "2x100x300x7"):
    dims = tuple(int(x) for x in other.split("x"))
    assert F.distance(tuple(p.dims.values()), dims) == pytest.approx(p.distance(other))


def test_decide_runs_the_kernel_best_on_all_neighbours_only_past_the_margin():
  q = rec("q", (1, 1000, 1000, 1000), {})
  pool = F.index_of([
      rec("a", (1, 1000, 1000, 1024), {TP: 1.30, PK: 1.10}),
      rec("b", (1, 1024, 1000, 1000), {TP: 1.04, PK: 1.12}),
      rec("c", (1, 900, 1000, 1000), {TP: 1.50}),          # no PK record: PK is out at k=3
      rec("far", (1, 16, 16, 16), {TP: 0.5}),
      rec("q", (1, 1000, 1000, 1000), {TP: 0.1}),          # the query's own: never used
      rec("other-fields", (1, 1000, 1000, 1000), {TP: 9.0}, fields="float16"),
  ])
  assert [r.identity for r in F.ranked(q, pool, 0.0)][:3] == ["a", "b", "c"]
  # k=2: PK's worst 1.10 beats TP's 1.04
  assert F.decide(q, pool, F.Rule(2, 1.05, 0.0)) == PK
  assert F.decide(q, pool, F.Rule(2, 1.11, 0.0)) is None      # 1.10 < margin: XLA
  # k=3: only TP has a record on all three; its worst is 1.04
  assert F.decide(q, pool, F.Rule(3, 1.03, 0.0)) == TP
  assert F.decide(q, pool, F.Rule(3, 1.05, 0.0)) is None
  assert F.decide(q, pool, F.Rule(4, 1.0, 0.0)) is None       # "far" loses: 0.5
  # the realised speedup is the query's own record; none -> XLA
  assert F.realised(rec("x", (1, 1, 1, 1), {TP: 1.2}), TP) == 1.2
  assert F.realised(rec("x", (1, 1, 1, 1), {}), TP) == F.realised(q, None) == 1.0


def test_alignment_penalty_and_same_alignment_only():
  q = rec("q", (1, 1000, 1000, 1000), {}, aligned=False)
  pool = F.index_of([rec("aligned", (1, 1024, 1024, 1024), {TP: 1.5}),
                     rec("unaligned-far", (1, 2000, 1000, 1000), {TP: 0.8}, aligned=False)])
  assert [r.identity for r in F.ranked(q, pool, 0.0)] == ["aligned", "unaligned-far"]
  assert [r.identity for r in F.ranked(q, pool, 2.0)] == ["unaligned-far", "aligned"]
  assert [r.identity for r in F.ranked(q, pool, None)] == ["unaligned-far"]
  assert F.decide(q, pool, F.Rule(1, 1.0, 0.0)) == TP
  assert F.decide(q, pool, F.Rule(1, 1.0, None)) is None


def test_objective_weighs_losses_below_the_floor():
  assert F.objective([1.0, 1.0]) == 0.0
  assert F.objective([1.1]) == pytest.approx(math.log(1.1))
  assert F.objective([0.9]) == pytest.approx(math.log(0.9) - F.LOSS_WEIGHT * math.log(0.98 / 0.9))
  assert F.objective([1.1, 0.9]) < 0   # one loss outweighs a gain of the same size


def synthetic_rows(n=500, seed=0):
  """sweep.py's CSV rows: TP wins 1.3x on large aligned problems and loses (0.75x)
  elsewhere; PK wins 1.08x where K >= 2048 and aligned, else 0.9x."""
  rng = random.Random(seed)
  rows = []
  for i in range(n):
    aligned = rng.random() < 0.6
    m, nn, k = (int(2 ** rng.uniform(4, 14)) for _ in range(3))
    if aligned:
      m, nn, k = (-(-x // 64) * 64 for x in (m, nn, k))
    big = m * nn >= 2**22 and aligned
    tp, pk = (1.3 if big else 0.75), (1.08 if k >= 2048 and aligned else 0.9)
    xla = rng.uniform(0.1, 10)
    kernels = {TP: [xla / tp, xla], PK: [xla / pk, xla]}
    rows.append({
        "device_kind": "NVIDIA H100", "op": "matmul", "identity": f"matmul|{FIELDS}|1x{m}x{nn}x{k}",
        "split": "heldout" if i % 5 == 0 else "fit", "source": "random",
        "cache_fields": FIELDS, "dim_names": "b,m,n,k", "shape": f"1x{m}x{nn}x{k}",
        "aligned": int(aligned), "flops": 2 * m * nn * k, "xla_ms": xla, "best": "",
        "best_ms": "", "best_xla_ms": "", "best_speedup": "", "kernels": json.dumps(kernels),
        "stale": 0})
  return rows


def test_fit_on_synthetic_records_generalizes_to_the_held_out_part(tmp_path):
  path = tmp_path / "nvidia-h100.csv.gz"
  rows = synthetic_rows()
  with gzip.open(path, "wt", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
  doc = tmp_path / "sweep.md"
  doc.write_text("# Sweep\n\nhand-written\n\n<!-- sweep-fit:begin -->\nold\n<!-- sweep-fit:end -->\ntail\n")
  rule_path = tmp_path / "rule.json"
  assert F.main(["--csv", str(path), "--rule-out", str(rule_path), "--doc", str(doc)]) == 0
  rule = json.loads(rule_path.read_text())
  assert rule["k"] in F.K_GRID and rule["margin"] in F.MARGINS
  assert rule["records"] == {"fit": 400, "heldout": 100, "device_kinds": ["NVIDIA H100"]}
  held = rule["heldout"]["NVIDIA H100"]
  # the rule takes the large aligned wins and none of the losses: always-TP would read
  # 0.75x at worst with most problems below, never-a-kernel 1.00x geomean
  assert held["n"] == 100 and held["below_0.97"] == 0 and held["worst"] >= 0.97
  assert held["geomean"] >= 1.02 and held["vs_oracle_geomean"] >= 0.97
  text = doc.read_text()
  assert text.startswith("# Sweep\n\nhand-written\n") and text.endswith("<!-- sweep-fit:end -->\ntail\n")
  assert "old" not in text and "| NVIDIA H100 | **all** | 100 |" in text
  assert "Where no kernel of ours wins" in text
  # held-out problems are decided from the fit part only
  records = F.read_records([path])
  fit_pool = F.index_of([r for r in records if r.split == "fit"])
  assert all(r.split == "fit" for q in records if q.split == "heldout"
             for r in F.ranked(q, fit_pool, 0.0))
