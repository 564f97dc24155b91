"""The wheel installs whole: every module of the repository imports from the installed copy.

CI installs jaxgemm in editable mode, which finds modules in the source tree
whatever the package list says; a subpackage left out of the wheel
(`jaxgemm.kernels.pallas.scaled_matmul` once was) goes unnoticed there. This
test builds the wheel, installs it with --no-deps into a folder of its own, and
in a fresh interpreter that sees neither the source tree nor the editable
install imports every module found by walking the repository's folders, so a
new file is covered without editing this test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Each top-level folder of the repository and the package it installs as: kernels/
# and bench/ sit at the top (the design card's layout) and install under jaxgemm.
# Written here independently of setup.py, so that a change there is checked.
INSTALLED_AS = {"jaxgemm": "jaxgemm", "kernels": "jaxgemm.kernels", "bench": "jaxgemm.bench"}


def repository_modules() -> list[str]:
  """Every module under the folders of INSTALLED_AS, by its installed name."""
  names = []
  for folder, package in INSTALLED_AS.items():
    for path in sorted((REPO / folder).rglob("*.py")):
      parts = path.relative_to(REPO / folder).with_suffix("").parts
      if "__pycache__" in parts:
        continue
      if parts[-1] == "__init__":
        parts = parts[:-1]
      names.append(".".join((package, *parts)))
  return names


def _source_copy(dest: Path) -> Path:
  """The build's inputs, copied: a build in the checkout writes build/ and *.egg-info
  there, and setuptools would put a stale build/lib (modules of an older package
  list) into the wheel."""
  def skipped(folder, names):
    if Path(folder) != REPO:
      return {"__pycache__"} & set(names)
    return {n for n in names if n.startswith(".") or n.endswith(".egg-info")
            or n in ("build", "research", "docs", "tests", "__pycache__")}

  shutil.copytree(REPO, dest, ignore=skipped)
  return dest


# Run with `python -I -S`: no site module, so no .pth file runs and the editable
# install's meta-path finder (which maps `jaxgemm` to the checkout) is never
# installed; the installed wheel comes first on the path.
_IMPORT_ALL = textwrap.dedent("""
    import importlib, json, sys
    target, paths, names = json.loads(sys.argv[1])
    sys.path[:] = [target, *paths]
    found = {}
    for name in names:
      try:
        found[name] = importlib.import_module(name).__file__
      except Exception as e:  # reported by name in the parent
        found[name] = f"ERROR {type(e).__name__}: {e}"
    print(json.dumps(found))
""")


def test_wheel_imports_every_module(tmp_path):
  source = _source_copy(tmp_path / "source")
  wheels, target = tmp_path / "wheels", tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--disable-pip-version-check", "-q", "-w", str(wheels), str(source)],
                 check=True, cwd=tmp_path)
  (wheel,) = wheels.glob("jaxgemm-*.whl")
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                  "--disable-pip-version-check", "-q", "--target", str(target), str(wheel)],
                 check=True, cwd=tmp_path)

  # The package data: the tuning tables shipped per device kind.
  tables = sorted(p.name for p in (REPO / "jaxgemm" / "tables").glob("*.json"))
  assert tables and sorted(p.name for p in (target / "jaxgemm" / "tables").glob("*.json")) \
      == tables

  names = repository_modules()
  assert "jaxgemm.kernels.pallas.scaled_matmul" in names   # the walk sees subpackages
  # The interpreter's own paths (stdlib, the venv's site-packages for jax and the
  # other dependencies), less the checkout.
  paths = [p for p in sys.path if p and Path(p).resolve() != REPO]
  done = subprocess.run([sys.executable, "-I", "-S", "-c", _IMPORT_ALL,
                         json.dumps([str(target), paths, names])],
                        check=True, cwd=tmp_path, capture_output=True, text=True)
  found = json.loads(done.stdout.splitlines()[-1])

  installed = target.resolve()
  failed = {n: f for n, f in found.items() if f.startswith("ERROR")}
  elsewhere = {n: f for n, f in found.items()
               if n not in failed and not Path(f).resolve().is_relative_to(installed)}
  assert not failed, f"modules of the repository that the wheel does not import: {failed}"
  assert not elsewhere, f"modules imported from outside the installed wheel: {elsewhere}"
  assert sorted(found) == sorted(names)
