"""Fits `backend="auto"`'s no-measure rule on the sweep's records; scores it held out.

    python3 research/sweep/fit.py                          # research/sweep/data/*.csv
    python3 research/sweep/fit.py --csv a.csv b.csv --rule-out /tmp/rule.json --doc /tmp/x.md

The rule (`decide`), for a problem that has no record of its own: take the `k` records
nearest it among those of the same device kind, op and exact-match fields
(`Problem.cache_fields()`), by `Problem.distance` (the sum over the dims of |log(a/b)|)
plus `align_penalty` where their alignment (`Problem.aligned`) differs (None: records of
the other alignment are never neighbours). For each kernel (backend/variant) with a
record on all of them, take its worst speedup over XLA among them; run the kernel whose
worst is highest if that worst is at least `margin`, else XLA.

`k`, `margin` and `align_penalty` are fitted on the fit part of the records (`split` =
fit; leave one out: each fit record is decided from the other fit records), by the
mean log speedup, each loss below `FLOOR` weighing `LOSS_WEIGHT` times more
(`objective`). The held-out part (`split` = heldout, a hash of each problem: see
research/sweep/sweep.py) is decided from the fit records alone and reported: the rule's
realised speedup over XLA (geomean, worst, count below 0.97x) and against the oracle
(the best measured, XLA included), per device kind and op.

A realised speedup is the problem's own measured record of the kernel the rule picked
(its best config there; the rule ships the nearest neighbour's config, which the
held-out bench suite, `python -m bench --suite heldout`, measures as it runs); a kernel
with no record on the problem (it failed or cannot run it) counts as XLA (1.0x), as
`auto` falls back to XLA where a kernel cannot be built.

Outputs: the rule as JSON (`--rule-out`, default jaxgemm/tables/rule.json: dispatch's
`tuning_cache.NeighbourRule`, on the cards the records came from); the cards' shipped
tables (`--tables`, default jaxgemm/tables/: each `data/<kind>.cache.json.gz` as
`<kind>.json.gz`, every problem of the sweep, the held-out ones too, each record cut to
what dispatch reads: the neighbours the rule looks among); and a Markdown block between `<!-- sweep-fit:begin -->` and `<!-- sweep-fit:end -->` in `--doc`
(default docs/sweep.md). Only the standard library: it runs where the CSVs are.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CSVS = str(ROOT / "research" / "sweep" / "data" / "*.csv.gz")
DEFAULT_RULE = ROOT / "jaxgemm" / "tables" / "rule.json"
DEFAULT_DOC = ROOT / "docs" / "sweep.md"
BEGIN, END = "<!-- sweep-fit:begin -->", "<!-- sweep-fit:end -->"

FLOOR = 0.98          # issue 44's target for `auto`'s worst held-out problem
LOSS_WEIGHT = 4.0     # a loss below FLOOR costs this many times its log more
REPORT_FLOOR = 0.97   # the count the reports give ("below 0.97x")
K_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
MARGINS = (1.0, 1.01, 1.02, 1.03, 1.05, 1.08, 1.10, 1.15, 1.20, 1.30, 1.50)
ALIGN_PENALTIES = (0.0, 0.5, 1.0, 2.0, None)


@dataclasses.dataclass(frozen=True)
class Record:
  """One problem's measurements on one device kind (a row of sweep.py's CSV)."""

  device_kind: str
  op: str
  identity: str
  split: str                          # "fit" or "heldout"
  fields: str                         # the exact-match fields, joined
  dims: tuple[int, ...]
  names: tuple[str, ...]              # the dims' names, in order ("b", "m", "n", "k")
  aligned: bool
  kernels: dict[str, float]           # backend/variant -> speedup over XLA (paired)
  source: str = ""

  @property
  def group(self) -> tuple[str, str, str]:
    return (self.device_kind, self.op, self.fields)

  @property
  def oracle(self) -> float:
    """The best measured: the fastest kernel, or XLA (1.0)."""
    return max([1.0, *self.kernels.values()])


def read_records(paths) -> list[Record]:
  """The records of sweep.py's CSVs (`summarize`)."""
  out = []
  for path in paths:
    with gzip.open(path, "rt", newline="") as f:
      for r in csv.DictReader(f):
        kernels = {k: xla / ms for k, (ms, xla) in json.loads(r["kernels"]).items()
                   if ms > 0 and xla > 0}
        out.append(Record(r["device_kind"], r["op"], r["identity"], r["split"],
                          r["cache_fields"], tuple(int(x) for x in r["shape"].split("x")),
                          tuple(r["dim_names"].split(",")), r["aligned"] in ("1", "True", "true"),
                          kernels, r.get("source", "")))
  return out


def distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
  """`Problem.distance`: the sum over the dims of |log(a / b)| (a size 0 counts as 1)."""
  return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(a, b))


@dataclasses.dataclass(frozen=True)
class Rule:
  k: int
  margin: float
  align_penalty: float | None    # None: records of the other alignment are never neighbours

  def to_json(self) -> dict:
    return {"k": self.k, "margin": self.margin, "align_penalty": self.align_penalty}


Index = dict   # Record.group -> the records of that group: what a rule looks among


def index_of(records: list[Record]) -> Index:
  """The records by device kind, op and fields (a rule's neighbours share all three)."""
  out = defaultdict(list)
  for r in records:
    out[r.group].append(r)
  return dict(out)


def ranked(query: Record, pool: Index, align_penalty: float | None) -> list[Record]:
  """The pool's records of the query's device kind, op and fields, nearest first (the
  query itself left out)."""
  out = []
  for r in pool.get(query.group, ()):
    if r.identity == query.identity:
      continue
    if r.aligned != query.aligned:
      if align_penalty is None:
        continue
      d = distance(query.dims, r.dims) + align_penalty
    else:
      d = distance(query.dims, r.dims)
    out.append((d, r.identity, r))
  out.sort(key=lambda x: x[:2])
  return [r for *_, r in out]


def best_on_all(neighbours: list[Record]) -> tuple[str | None, float]:
  """(the kernel whose worst speedup over `neighbours` is highest, that worst), among the
  kernels with a record on every one; (None, 0.0) where none has."""
  if not neighbours:
    return None, 0.0
  worst = dict(neighbours[0].kernels)
  for r in neighbours[1:]:
    worst = {k: min(s, r.kernels[k]) for k, s in worst.items() if k in r.kernels}
  if not worst:
    return None, 0.0
  k = max(sorted(worst), key=lambda k: worst[k])
  return k, worst[k]


def decide(query: Record, pool: Index, rule: Rule) -> str | None:
  """The kernel the rule runs for `query` from the records of `pool` (None: XLA)."""
  kernel, worst = best_on_all(ranked(query, pool, rule.align_penalty)[:rule.k])
  return kernel if kernel is not None and worst >= rule.margin else None


def realised(query: Record, kernel: str | None) -> float:
  """The speedup over XLA the pick gives on `query`: its record of that kernel, 1.0 for XLA
  or for a kernel with no record there (auto falls back to XLA)."""
  return 1.0 if kernel is None else query.kernels.get(kernel, 1.0)


def objective(speedups: list[float]) -> float:
  """Mean log speedup, each loss below FLOOR counting LOSS_WEIGHT times its log more."""
  if not speedups:
    return 0.0
  return sum(math.log(s) - LOSS_WEIGHT * max(0.0, math.log(FLOOR / s))
             for s in speedups) / len(speedups)


def _decisions(queries: list[Record], pool: Index) -> dict:
  """(align_penalty, k) -> [(kernel, worst) per query]: every grid point's raw decision,
  from one ranking per query and penalty."""
  out = {}
  kmax = max(K_GRID)
  for pen in ALIGN_PENALTIES:
    per_k = {k: [] for k in K_GRID}
    for q in queries:
      near = ranked(q, pool, pen)[:kmax]
      for k in K_GRID:
        per_k[k].append(best_on_all(near[:k]))
    for k in K_GRID:
      out[(pen, k)] = per_k[k]
  return out


def fit(records: list[Record]) -> tuple[Rule, float, list[tuple[Rule, float]]]:
  """The grid's best rule on `records` (leave one out), its objective, and every point's.

  Ties go to the more cautious rule: a higher margin, a higher alignment penalty, fewer
  neighbours."""
  if not records:
    raise ValueError("no fit records: run the sweep and `sweep.py summarize` first")
  decisions = _decisions(records, index_of(records))
  scored = []
  for (pen, k), ds in decisions.items():
    for margin in MARGINS:
      picks = [kern if kern is not None and worst >= margin else None for kern, worst in ds]
      s = objective([realised(q, p) for q, p in zip(records, picks)])
      scored.append((Rule(k, margin, pen), s))
  caution = lambda rs: (rs[1], rs[0].margin,
                        math.inf if rs[0].align_penalty is None else rs[0].align_penalty,
                        -rs[0].k)
  best = max(scored, key=caution)
  return best[0], best[1], scored


@dataclasses.dataclass
class Stats:
  n: int
  geomean: float | None
  worst: float | None
  worst_identity: str
  below: int
  picked: int                # problems where the rule ran a kernel
  missing: int               # ... a kernel the problem has no record of (counted 1.0x)
  oracle_geomean: float | None
  vs_oracle_geomean: float | None
  vs_oracle_worst: float | None


def _geomean(xs):
  return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def evaluate(queries: list[Record], pool: Index, rule: Rule) -> Stats:
  """The rule's realised speedups on `queries`, decided from `pool`."""
  got, oracle, ratio, picked, missing = [], [], [], 0, 0
  worst, worst_id = None, ""
  for q in queries:
    kernel = decide(q, pool, rule)
    s = realised(q, kernel)
    picked += kernel is not None
    missing += kernel is not None and kernel not in q.kernels
    got.append(s)
    oracle.append(q.oracle)
    ratio.append(s / q.oracle)
    if worst is None or s < worst:
      worst, worst_id = s, q.identity
  return Stats(len(got), _geomean(got), worst, worst_id, sum(s < REPORT_FLOOR for s in got),
               picked, missing, _geomean(oracle), _geomean(ratio), min(ratio, default=None))


# ---------------------------------------------------------------- problem classes

def problem_class(r: Record) -> str:
  """A coarse class of the problem (the first that applies), for 'where no kernel wins'."""
  dims = dict(zip(r.names, r.dims))
  if "float32" in r.fields:
    return "fp32"
  if min(dims.get("m", 2**30), dims.get("n", 2**30)) <= 16:
    return "GEMV-like (M or N <= 16)"
  if dims.get("k", 2**30) <= 64:
    return "skinny K (K <= 64)"
  if not r.aligned:
    return "unaligned (a row not 16-byte aligned)"
  if math.prod(r.dims) < 2**28:
    return "small (b*M*N*K < 2^28)"
  return "aligned, large"


# ---------------------------------------------------------------- the report

def _x(s) -> str:
  return "-" if s is None else f"{s:.3f}x"


def _label(ident: str) -> str:
  """A problem's identity for a Markdown cell (its `|` would split the cell)."""
  return " ".join(part.strip() for part in ident.split("|"))


def _table(header, rows) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
          *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def report(records: list[Record], rule: Rule, fit_score: float) -> tuple[list[str], dict]:
  """The Markdown block and the held-out summary (per device kind) of the fitted rule."""
  fit_part = index_of([r for r in records if r.split == "fit"])
  held = [r for r in records if r.split == "heldout"]
  cards = sorted({r.device_kind for r in records})
  lines = [
      f"Generated by `python3 research/sweep/fit.py` from {len(records)} problems on "
      f"{', '.join(cards)} ({len(records) - len(held)} fit, {len(held)} held out by a hash of each "
      "problem). Fitted rule: "
      f"k = {rule.k}, margin = {rule.margin:g}, alignment penalty = "
      f"{'none (same alignment only)' if rule.align_penalty is None else rule.align_penalty}"
      f" (leave-one-out objective on the fit part {fit_score:.4f}).", "",
      "On the held-out problems only (neighbours from the fit part): the rule's realised "
      "speedup over XLA, and against the oracle (the best measured, XLA included). `picked`: "
      "problems where it ran a kernel of ours; `no record`: ... one the problem has no record "
      "of (counted as XLA).", ""]
  rows, summary = [], {}
  for card in cards:
    for op in [*sorted({r.op for r in held if r.device_kind == card}), None]:
      mine = [r for r in held if r.device_kind == card and (op is None or r.op == op)]
      if not mine:
        continue
      st = evaluate(mine, fit_part, rule)
      label = "**all**" if op is None else op
      rows.append([card, label, st.n, _x(st.geomean),
                   f"{_x(st.worst)} ({_label(st.worst_identity)})", st.below, _x(st.oracle_geomean),
                   _x(st.vs_oracle_geomean), _x(st.vs_oracle_worst), st.picked, st.missing])
      if op is None:
        summary[card] = {"n": st.n, "geomean": st.geomean, "worst": st.worst,
                         "below_0.97": st.below, "oracle_geomean": st.oracle_geomean,
                         "vs_oracle_geomean": st.vs_oracle_geomean}
  lines += _table(["card", "op", "held out", "rule vs XLA (geomean)", "worst",
                   "below 0.97x", "oracle vs XLA", "rule vs oracle (geomean)",
                   "rule vs oracle (worst)", "picked", "no record"], rows) if rows else [
      "No held-out problem has a record yet."]
  lines += ["", "Where no kernel of ours wins (every problem, both parts): per class, the share "
            "of problems where the best kernel beat XLA by 2% or more; where it is low, `auto` "
            "runs XLA.", ""]
  crow = []
  by = defaultdict(list)
  for r in records:
    by[(r.device_kind, r.op, problem_class(r))].append(r)
  for (card, op, cls), rs in sorted(by.items()):
    wins = sum(r.oracle >= 1.02 for r in rs)
    crow.append([card, op, cls, len(rs), f"{wins / len(rs):.0%}", _x(_geomean([r.oracle for r in rs]))])
  lines += _table(["card", "op", "class", "problems", "a kernel wins (>= 1.02x)",
                   "oracle vs XLA (geomean)"], crow)
  return lines, summary


def replace_block(path: Path, body: list[str]) -> None:
  """Writes `body` between the markers in `path` (appended, with them, where absent)."""
  text = path.read_text() if path.exists() else ""
  block = "\n".join([BEGIN, *body, END])
  if BEGIN in text and END in text:
    head, rest = text.split(BEGIN, 1)
    text = head + block + rest.split(END, 1)[1]
  else:
    text = text + ("\n" if text and not text.endswith("\n") else "") + block + "\n"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def _shown(path) -> str:
  """A path relative to the repository where it is inside it."""
  p = Path(path).resolve()
  return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


TABLE_FIELDS = ("config", "time_ms", "xla_time_ms", "version", "timer", "measured",
                "finished")


def write_table(cache: Path, out_dir: Path) -> Path:
  """The card's shipped table from the sweep's tuning file: every record, cut to the
  fields dispatch reads, gzipped (deterministic bytes)."""
  with gzip.open(cache, "rt") as f:
    data = json.load(f)
  entries = {key: {shape: {k: r[k] for k in TABLE_FIELDS if k in r}
                   for shape, r in shapes.items()}
             for key, shapes in data["entries"].items()}
  out = out_dir / cache.name.replace(".cache.json.gz", ".json.gz")
  text = json.dumps({"format": data["format"], "entries": entries}, sort_keys=True,
                    separators=(",", ":"))
  with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
    f.write(text.encode())
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--csv", nargs="+", default=None,
                  help=f"sweep.py's per-card CSVs (default: {DEFAULT_CSVS})")
  ap.add_argument("--rule-out", default=str(DEFAULT_RULE),
                  help="where the fitted rule's JSON goes (default: %(default)s)")
  ap.add_argument("--tables", default=str(DEFAULT_RULE.parent),
                  help="where each card's table goes, from the CSV's <kind>.cache.json.gz "
                       "beside it ('' for none; default: %(default)s)")
  ap.add_argument("--doc", default=str(DEFAULT_DOC),
                  help="the Markdown file whose sweep-fit block is replaced (default: %(default)s)")
  args = ap.parse_args(argv)
  paths = args.csv or sorted(glob.glob(DEFAULT_CSVS))
  if not paths:
    raise SystemExit(f"no CSVs ({DEFAULT_CSVS}): run research/sweep/sweep.py run, then summarize")
  records = read_records(paths)
  rule, score, _ = fit([r for r in records if r.split == "fit"])
  lines, summary = report(records, rule, score)
  out = {**rule.to_json(), "format": 1,
         "how": "research/sweep/fit.py's docstring (`decide`): the k nearest records of the "
                "same device kind, op and cache_fields by Problem.distance + align_penalty "
                "where alignment differs (null: same alignment only); the kernel whose worst "
                "speedup over them is highest runs if that worst >= margin, else XLA",
         "objective": {"floor": FLOOR, "loss_weight": LOSS_WEIGHT, "fit": score},
         "records": {"fit": sum(r.split == "fit" for r in records),
                     "heldout": sum(r.split == "heldout" for r in records),
                     "device_kinds": sorted({r.device_kind for r in records})},
         "heldout": summary, "csvs": [_shown(p) for p in paths]}
  Path(args.rule_out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.rule_out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
  replace_block(Path(args.doc), lines)
  print("\n".join(lines))
  print(f"\nrule: {args.rule_out}\ndoc:  {args.doc}")
  for path in map(Path, paths if args.tables else ()):
    cache = path.with_name(path.name.replace(".csv.gz", ".cache.json.gz"))
    if cache.exists():
      print(f"table: {write_table(cache, Path(args.tables))}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
