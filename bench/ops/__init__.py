"""One module per op of the benchmark, each defining `ENTRY = entry.BenchOp(...)`: its
suites (problems, help, runner), its tables and targets in the report.

`bench.suites` imports every module here and collects the entries; nothing else lists
them, so a new op is a new module here. These modules hold data and report code only
(no jax at import): the code that runs a suite is in the module its `Suite.runner`
names (`runner`, `training`, `moe`, `epilogue`, `fp8`, `fp8_moe`, `sharded`).
"""
