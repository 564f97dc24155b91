"""Everything made from a run's CSV, and the `python -m bench report` command.

    csvio     provenance, the CSV's columns, writing, reading and merging CSVs
    view      `Run`: the rows indexed for tables and plots
    markdown  the pieces of every table (cells, formats, the default's stats, verdicts)
    tables    REPORT.md, README_TABLES.md, the ladder guide's blocks, the tables no one
              op owns (each op's own come from its entry, bench/ops/*.py), and putting
              generated blocks between a document's markers
    plots     the PNG plots
    make      `generate()` (all of the above from a CSV) and `python -m bench report`

Everything after the CSV is generated from the CSV alone, so a committed CSV
reproduces its report, docs/results.md's tables and docs/ladders.md's tables.

This package's own module imports nothing: the ops' entries use csvio and markdown,
and the tables use the entries.
"""
