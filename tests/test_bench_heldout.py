"""CPU tests of the held-out suites (bench/heldout.py, bench/ops/heldout.py; issue 44).

The draw (fixed by its seed, fresh without one, within its sizes and caps, every group),
and a tiny run through the CLI: every problem measured against XLA, the seed recorded in
every row and printed, the report's per-group summary, and `--seed` drawing the same
problems again.
"""

from __future__ import annotations

import math
import re

import pytest

from jaxgemm.bench import __main__ as cli
from jaxgemm.bench import heldout as H
from jaxgemm.bench.ops import heldout as HO
from jaxgemm.bench.report import csvio
from jaxgemm.ops.activations import ACTIVATIONS


def test_a_seed_fixes_the_draw_and_each_group_has_its_count():
  a = H.draw(HO.HELDOUT, 1234, HO.PER_GROUP[(False, False)], H.GPU_SIZES)
  assert a == H.draw(HO.HELDOUT, 1234, HO.PER_GROUP[(False, False)], H.GPU_SIZES)
  other = H.draw(HO.HELDOUT, 1235, HO.PER_GROUP[(False, False)], H.GPU_SIZES)
  assert not {p.name for p in a} & {p.name for p in other}
  assert len({p.name for p in a}) == len(a) == 20 * len(HO.GROUPS)
  # interleaved: a run cut short has measured every group alike
  assert [HO.group_of(p.name) for p in a[:len(HO.GROUPS)]] == list(HO.GROUPS)
  # each group's stream is its own: fewer problems are a prefix of more
  few = H.draw(HO.HELDOUT, 1234, 5, H.GPU_SIZES)
  for g in HO.GROUPS:
    assert [p for p in few if HO.group_of(p.name) == g] == \
        [p for p in a if HO.group_of(p.name) == g][:5]
  assert H.clock_seed() > 0


def test_drawn_problems_are_within_the_sizes_and_caps_and_vary():
  sizes = H.GPU_SIZES
  probs = H.draw(HO.HELDOUT, 99, 20, sizes)
  top = max(sizes.aligns) * math.ceil(sizes.hi / max(sizes.aligns))
  for p in probs:
    g = HO.group_of(p.name)
    flops, nbytes = H._cost(p)
    assert flops <= sizes.max_flops[g] and nbytes <= sizes.max_bytes, p
    assert all(sizes.lo <= x <= top for x in (p.m, p.k, p.n)), p
  by = {g: [p for p in probs if HO.group_of(p.name) == g] for g in HO.GROUPS}
  mm = by["matmul"]
  assert {p.dtype for p in mm} == set(H.DTYPES)
  assert len({p.layout for p in mm}) >= 3 and any(p.batch > 1 for p in mm)
  assert any(x % 8 for p in mm for x in (p.m, p.k, p.n))      # some sizes as drawn
  assert all(p.backward for g in ("matmul+bwd", "fused_matmul+bwd") for p in by[g])
  fused = by["fused_matmul"] + by["fused_matmul+bwd"]
  assert all(p.expression.bias and p.expression.activation in ACTIVATIONS for p in fused)
  assert len({p.expression.activation for p in fused}) >= 3
  assert all(p.expression.glu and p.op == "glu" for p in by["glu"])
  for p in by["ragged_dot"]:
    assert sizes.groups[0] <= p.groups <= sizes.groups[1]
    assert sum(p.group_sizes) == p.m and len(p.group_sizes) == p.groups
  assert {p.mode for p in by["ragged_dot"]} == {"fwd", "dgrad", "wgrad"}
  assert {p.scaling for p in by["scaled_matmul"]} == {"tensor", "block"}
  assert {p.layout for p in by["scaled_matmul"]} == {"NN", "NT", "TN"}


def test_tiny_run_measures_every_group_against_xla_and_replays(tmp_path, capsys):
  rc = cli.main(["--suite", HO.TINY, "--quick", "--backends", "auto,xla", "--iters", "2",
                 "--out", str(tmp_path), "--run-name", "cpu-a"])
  assert rc == 0
  out = capsys.readouterr().out
  seed = int(re.search(r"seed (\d+) \(drawn from the clock\)", out).group(1))
  rows = csvio.read_csv(tmp_path / "cpu-a" / "results.csv")
  gemm = [r for r in rows if r["kind"] == "gemm"]
  problems = list(dict.fromkeys(r["problem"] for r in gemm))
  assert [HO.group_of(p) for p in problems] == list(HO.GROUPS)
  assert {r["seed"] for r in gemm} == {str(seed)}
  for p in problems:
    mine = {r["backend"]: r for r in gemm if r["problem"] == p}
    assert set(mine) == {"xla_dot", "auto", "xla"}, (p, set(mine))
    assert all(r["status"] == "ok" for r in mine.values()), mine
    assert float(mine["auto"]["speedup_vs_xla"]) > 0 and mine["auto"]["chosen"]
  report = (tmp_path / "cpu-a" / "REPORT.md").read_text()
  section = report[report.index("## Held-out problems"):]
  assert f"seed {seed}" in section and "Card: **cpu" in section
  for g in HO.GROUPS:
    assert f"| {g} | 1/1 |" in section, g
  assert "| **all** | 7/7 |" in section and "xla own choice" in section
  # --seed draws the same problems again (and the replay line says it came from --seed)
  rc = cli.main(["--suite", HO.TINY, "--quick", "--backends", "auto", "--iters", "1",
                 "--seed", str(seed), "--only", "matmul.*", "--out", str(tmp_path),
                 "--run-name", "cpu-b"])
  assert rc == 0 and f"seed {seed} (from --seed)" in capsys.readouterr().out
  again = csvio.read_csv(tmp_path / "cpu-b" / "results.csv")
  assert {r["problem"] for r in again if r["kind"] == "gemm"} == {problems[0]}


@pytest.mark.parametrize("quick", [False, True])
def test_per_group_counts(quick):
  assert HO.PER_GROUP[(False, quick)] == (5 if quick else 20)
  assert len(H.draw(HO.TINY, 5, HO.PER_GROUP[(True, quick)], H.TINY_SIZES)) == \
      len(HO.GROUPS) * HO.PER_GROUP[(True, quick)]
