"""jaxgemm's benchmark: every registered kernel, and jaxgemm's default, against XLA's dot.

    python -m bench                      # `run`: the default suites (GPU), or a tiny CPU run
    python -m bench --suite llm,skinny --dtype fp16
    python -m bench --backends auto      # only jaxgemm's default (backend="auto") vs XLA
    python -m bench --list               # suites, problems, backends, variants
    python -m bench report bench/results/<run>/results.csv   # report + plots, README, docs/ladders.md
    python -m bench report a/results.csv b/results.csv --out bench/results/<run>  # merge
    python -m bench tune --suite square,llm,training   # jaxgemm.autotune on these problems
    python -m bench history bench/results/<run>/results.csv  # into bench/results/history.csv

Also installed as the console script `jaxgemm-bench`. This module only picks
the subcommand; each lives in its own module (`run`, `report.make`, `tune`,
`history`) with a `main(argv)`, and none imports this one.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> the module (of this package) whose main(argv) it is
SUBCOMMANDS = {"run": "run", "report": "report.make", "tune": "tune", "history": "history"}


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  name = "run"                     # no subcommand named: options of `run`
  if argv and argv[0] in SUBCOMMANDS:
    name, argv = argv[0], argv[1:]
  return importlib.import_module(f".{SUBCOMMANDS[name]}", __package__).main(argv)


if __name__ == "__main__":
  sys.exit(main())
