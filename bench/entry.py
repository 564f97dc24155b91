"""What one op's entry in the benchmark holds: `BenchOp`, its `Suite`s and report `Section`s.

Each module of bench/ops/ defines one `ENTRY = BenchOp(...)`: the op's suites (their
problems, help line and runner), the report's table of each of its suites, its
targets, and how the shared tables label its rows. `bench.suites` collects the entries;
the CLI (`python -m bench`, `--list`, `--help`) and the report (`bench.report.tables`)
read them from there. So a new op adds its module to bench/ops/ (and, where its suites
run code of their own, that runner module) and edits no shared file.

This module imports nothing of the benchmark's: every other module may import it.

>>> s = Suite("tiny", "small shapes", problems=[], runner="runner", cpu_default=True)
>>> op = BenchOp("matmul", order=10, ops=("matmul",), suites=(s,))
>>> [x.name for x in op.suites], op.op
(['tiny'], 'matmul')
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

# A function of a run (`bench.report.view.Run`) that makes Markdown lines; [] (or no
# lines) leaves its section out.
RunLines = Callable[[Any], list[str]]


@dataclasses.dataclass(frozen=True, eq=False)   # one object per suite: compared by identity
class Suite:
  """One named suite: what `--suite NAME` runs.

  `problems`: the suite's problems (each with `.name`, `.default`, `.quick`), or None
  for a suite that is not a table of problems (a training step, programs on a mesh).
  `runner`: the module of bench whose `run_suite(ctx, suite, problems, backends,
  variants_policy, options)` runs it (`runner.SuiteOptions` says what `options` holds).
  """

  name: str
  help: str                       # one line, for --help and --list
  problems: Sequence | None
  runner: str
  gpu_default: bool = False       # in `--suite default` on a GPU
  cpu_default: bool = False       # in `--suite default` without a GPU
  list_note: str = ""             # --list: what runs besides the problems (or instead)


@dataclasses.dataclass(frozen=True)
class Section:
  """A section of the report that is not one suite's table: a targets table, the defaults.

  In REPORT.md it is `## {title}` then `body(run)`; in README_TABLES.md (the results
  page's block) `#### {readme_title}` then `readme_body(run)` (default `body`), where
  `readme_title` is given. A title may be a function of the run. An empty body leaves
  the section out.
  """

  title: str | Callable[[Any], str]
  body: RunLines
  readme_title: str | Callable[[Any], str] | None = None
  readme_body: RunLines | None = None

  def heading(self, run, readme: bool = False) -> str:
    title = self.readme_title if readme else self.title
    return title(run) if callable(title) else title

  def lines(self, run, readme: bool = False) -> list[str]:
    fn = (self.readme_body or self.body) if readme else self.body
    return fn(run)


@dataclasses.dataclass(frozen=True, eq=False)   # one object per op: compared by identity
class BenchOp:
  """One op's entry: its suites, how they run, and its part of the report."""

  name: str                       # its module's name in bench/ops/
  order: int                      # its place among the entries: suites, --list, report sections
  ops: tuple[str, ...]            # the jaxgemm ops whose backends its suites run; ops[0]
                                  # is the op each of its suites measures (`suites.SUITE_OP`)
  suites: tuple[Suite, ...]
  family: str = ""                # how messages name its suites ("moe" -> "the moe suites")
  # A GPU run of only this op's suites, with no --time-budget, takes this one (seconds):
  # each runs its problems, then a training step, within a lent machine's 10 minutes.
  gpu_time_budget_s: float | None = None
  # --variants names it accepts besides the backends' (its training step's recipes).
  extra_variants: tuple[str, ...] = ()
  # Values of the CSV's `backend` column that its rows hold beside XLA's reference and
  # jaxgemm's kernels (programs measured for comparison, not jaxgemm backends).
  peers: tuple[str, ...] = ()

  # ---- the report
  # One suite's table: (run, suite) -> lines (a note, a blank line, the table).
  suite_table: Callable[[Any, str], list[str]] | None = None
  suite_title: str = "Suite `{suite}`"      # REPORT.md's heading of it
  readme_suite_title: str | None = None     # README_TABLES.md's; None: only in REPORT.md
  # Its targets (and for matmul the default's summary): after the headline in REPORT.md,
  # before its suites' tables in README_TABLES.md.
  targets: tuple[Section, ...] = ()
  # Sections of rows that are not its suites' problems (the sharded programs): after the
  # training table.
  run_sections: tuple[Section, ...] = ()
  # The training table: what XLA's row of its model is called, and columns of its own
  # ((header, row -> cell)), before the step-0 gradient's.
  train_ref_label: str = "XLA dot"
  step_columns: tuple[tuple[str, Callable[[dict], str]], ...] = ()
  # What `python -m bench` prints of it at the end of a run (after the headline).
  console: RunLines | None = None

  @property
  def op(self) -> str:
    """The op its suites measure."""
    return self.ops[0]

  def suite_names(self) -> list[str]:
    return [s.name for s in self.suites]
