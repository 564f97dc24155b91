"""Carries the tuning table's current records over to per-rung kernel versions (issue 43, item 4).

Until c3e0863 a record's version hashed its whole backend's kernel modules
(`Backend.kernel_modules`, packages meaning all their files: one version per
op and backend); now it hashes only the code its rung runs
(`tuning_cache.kernel_version(backend, op, variant=...)`). This script takes
the table as it was at a base commit, computes that commit's per-backend
versions from its sources (read with git, nothing imported), and stamps each
record that was current there (its version is its backend's at the base) with
the per-rung version of the tree it runs in (`tuning_cache.restamp`). A record
that was already stale keeps its version and stays stale. It prints, per op
and backend, the records current before and after: the two must be equal,
else it writes nothing and exits 1 (unless --force).

From the repository root, with the tree to stamp for checked out. It reads the
table as it was at --base, not the one in the tree (already stamped, perhaps by
an earlier tree), so it can be re-run after merging anything that changes a
kernel's code or imports, and gives the same table as one run on the final tree:

    .venv/bin/python research/restamp_table.py --base c3e0863            # writes the table
    .venv/bin/python research/restamp_table.py --base c3e0863 --check    # counts only
    .venv/bin/python research/restamp_table.py --base c3e0863 --print-old-versions

Other inputs: `--old-versions FILE.json` ({"<op>/<backend>": version}, or
"<op>/<backend>/<variant>" keys, e.g. for a later restamp of rungs whose
change was shown not to move a record's speed) instead of computing them at
--base; `--input FILE` (e.g. a user's ~/.cache/jaxgemm/autotune.json, with
`--table` the same file) instead of the table at --base.

At c3e0863 the per-backend versions were (kernel_version(backend, op) there):
matmul xla 1662de0fca30, triton 0fcda76b446b, pallas 0a281d2ca3fc; the
table's 493 records, all matmul, were all current.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxgemm import tuning_cache  # noqa: E402

TABLE = "jaxgemm/tables/nvidia-h200.json"


def _git(*args: str) -> str:
  return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                        text=True).stdout


def _module_path(module: str) -> str:
  """The module's path in the repository (pyproject's package-dir: jaxgemm.kernels -> kernels/)."""
  parts = module.split(".")
  if parts[:2] == ["jaxgemm", "kernels"]:
    parts = ["kernels", *parts[2:]]
  return "/".join(parts)


def _old_modules_version(commit: str, modules, files: set[str]) -> str:
  """The per-backend scheme's `modules_version` at `commit`: each module in order, a
  package meaning every .py file directly in its folder, in sorted order."""
  h = hashlib.sha256()
  for module in modules:
    path = _module_path(module)
    if f"{path}/__init__.py" in files:
      found = sorted(f for f in files if f.startswith(f"{path}/") and f.endswith(".py")
                     and "/" not in f[len(path) + 1:])
      members = [(f"{module}.{pathlib.PurePath(f).stem}", f) for f in found]
    elif f"{path}.py" in files:
      members = [(module, f"{path}.py")]
    else:
      raise FileNotFoundError(f"{module} is not in the tree of {commit}")
    for name, f in members:
      h.update(name.encode())
      h.update(tuning_cache.code_fingerprint(_git("show", f"{commit}:{f}")).encode())
  return h.hexdigest()[:12]


def old_versions_at(commit: str) -> dict[str, str]:
  """{"<op>/<backend>": version} of the per-backend scheme at `commit`.

  Each registered backend class of jaxgemm/ops/*/*.py there, read with `ast`:
  its `op`, `name` and `kernel_modules` (literal strings, as they were).
  """
  files = set(_git("ls-tree", "-r", "--name-only", commit).split())
  out = {}
  for f in sorted(files):
    if not (f.startswith("jaxgemm/ops/") and f.endswith(".py")):
      continue
    for node in ast.walk(ast.parse(_git("show", f"{commit}:{f}"))):
      if not isinstance(node, ast.ClassDef):
        continue
      attrs = {t.id: stmt.value for stmt in node.body if isinstance(stmt, ast.Assign)
               for t in stmt.targets if isinstance(t, ast.Name)}
      if {"op", "name", "kernel_modules"} <= attrs.keys():
        op, name, modules = (ast.literal_eval(attrs[k]) for k in ("op", "name", "kernel_modules"))
        out[f"{op}/{name}"] = _old_modules_version(commit, modules, files)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--base", help="the commit whose per-backend versions the records carry")
  parser.add_argument("--old-versions", help="a JSON file of {op/backend[/variant]: version}")
  parser.add_argument("--input", help="the table to restamp (default: --table at --base)")
  parser.add_argument("--table", default=TABLE, help=f"where to write (default {TABLE})")
  parser.add_argument("--check", action="store_true", help="print the counts, write nothing")
  parser.add_argument("--force", action="store_true", help="write even if counts differ")
  parser.add_argument("--print-old-versions", action="store_true")
  args = parser.parse_args(argv)
  if not (args.base or args.old_versions):
    parser.error("give --base COMMIT or --old-versions FILE")
  old = (json.loads(pathlib.Path(args.old_versions).read_text()) if args.old_versions
         else old_versions_at(args.base))
  if args.print_old_versions:
    print(json.dumps(old, indent=1, sort_keys=True))
    return 0
  if args.input:
    text = pathlib.Path(args.input).read_text()
  elif args.base:
    text = _git("show", f"{args.base}:{args.table}")
  else:
    parser.error("give --input FILE (or --base COMMIT to read the table there)")
  data = json.loads(text)
  if data.get("format") != tuning_cache.FORMAT:
    raise SystemExit(f"{args.input or args.table}: format {data.get('format')!r}, "
                     f"not {tuning_cache.FORMAT}")
  entries, counts = tuning_cache.restamp(data["entries"], old)
  print(f"{'op/backend':<22} {'current before':>15} {'current after':>14} {'stale':>6}")
  for name, c in sorted(counts.items()):
    print(f"{name:<22} {c['current before']:>15} {c['current after']:>14} {c['stale']:>6}")
  same = all(c["current before"] == c["current after"] for c in counts.values())
  if not same:
    print("current before != current after: a rung is gone or was renamed", file=sys.stderr)
  if args.check or not (same or args.force):
    return 0 if same else 1
  out = pathlib.Path(args.table)
  out.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": entries}, indent=1,
                            sort_keys=True) + "\n")
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
