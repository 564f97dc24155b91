"""No import circle in the code: jaxgemm/, kernels/ and bench/, read from the source.

A circle of imports works only in the order that happens to run first, and a module
in one cannot be read on its own: each part needs the others. The graph here is built
with `ast`, without importing anything (fast, and independent of what is installed):

* a node per module, named as it is installed (pyproject.toml's package-dir):
  `kernels/` is `jaxgemm.kernels`, `bench/` is `jaxgemm.bench`; a package is its
  `__init__.py`;
* an edge per import, at module level or inside a function (a lazy import runs
  too, only later), and per `importlib.import_module` of a literal name (an f-string
  up to its first field names a package);
* `from X import Y` imports X, and X.Y where that is a submodule;
* importing a module first runs the `__init__` of each package above it, which is an
  edge too: `from jaxgemm.ops.matmul import primitive` runs `jaxgemm/ops/matmul/__init__.py`,
  which imports the op's api and backends. Except the importer's own packages: Python
  has started those before the importer (so `jaxgemm/__init__.py`, the public API that
  imports every op, is no edge of a module inside jaxgemm), unless it takes a name
  their `__init__` defines (`from jaxgemm import matmul`), which must have run by then.

A circle is a strongly connected component of more than one module.

The layering that keeps it so (docs/architecture.md): the low layer (`config`,
`gemm`, `ragged_schedule`, `ops/base`, `registry`, `dispatch`, ...) <- the kernels
<- the ops (`jaxgemm/ops/<op>/`) <- the router (`ops/router.py`) and `jaxgemm/__init__`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it is installed as.
TREES = {"jaxgemm": ROOT / "jaxgemm", "jaxgemm.kernels": ROOT / "kernels",
         "jaxgemm.bench": ROOT / "bench"}


def find_modules(trees: dict[str, Path]) -> dict[str, Path]:
  """Module name -> file, for every .py file in a package (a folder with `__init__.py`)."""
  modules = {}
  for package, folder in trees.items():
    for path in sorted(folder.rglob("*.py")):
      parts = path.relative_to(folder).with_suffix("").parts
      folders = [folder.joinpath(*parts[:i]) for i in range(len(parts))]
      if not all((f / "__init__.py").exists() for f in folders):
        continue   # not importable (e.g. a script among run records)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      modules[".".join((package, *parts))] = path
  return modules


def _skipped(node: ast.AST) -> bool:
  """`if TYPE_CHECKING:` blocks do not run."""
  test = getattr(node, "test", None)
  return isinstance(node, ast.If) and (
      (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
      or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _statements(tree: ast.AST):
  """Every node of `tree`, function bodies included, `if TYPE_CHECKING:` blocks left out."""
  todo = [tree]
  while todo:
    node = todo.pop()
    yield node
    todo.extend(child for child in ast.iter_child_nodes(node) if not _skipped(child))


def _named(node: ast.AST, module: str, is_package: bool) -> list[tuple[str, tuple[str, ...]]]:
  """(module imported, names taken from it) for one import-like node."""
  if isinstance(node, ast.Import):
    return [(alias.name, ()) for alias in node.names]
  if isinstance(node, ast.ImportFrom):
    base = node.module or ""
    if node.level:
      package = module.split(".") if is_package else module.split(".")[:-1]
      package = package[:len(package) - (node.level - 1)]
      base = ".".join(filter(None, (*package, base)))
    return [(base, tuple(alias.name for alias in node.names))]
  if (isinstance(node, ast.Call) and node.args
      and isinstance(node.func, (ast.Attribute, ast.Name))
      and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
      return [(arg.value, ())]
    if (isinstance(arg, ast.JoinedStr) and arg.values
        and isinstance(arg.values[0], ast.Constant)):
      return [(arg.values[0].value.rstrip("."), ())]   # the package before the field
  return []


def _chain(name: str, modules, importer: str) -> set[str]:
  """What importing `name` runs: its longest prefix that is a module, and each package
  above it, except the importer's own packages (Python has started those before it)."""
  parts = name.split(".")
  while parts and ".".join(parts) not in modules:
    parts.pop()
  chain = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
  return {m for m in chain if not importer.startswith(m + ".")}


def import_graph(trees: dict[str, Path]) -> dict[str, set[str]]:
  """Module -> the modules (of `trees`) that importing it runs directly."""
  modules = find_modules(trees)
  graph = {}
  for module, path in modules.items():
    is_package = path.name == "__init__.py"
    edges = set()
    for node in _statements(ast.parse(path.read_text(), str(path))):
      for base, names in _named(node, module, is_package):
        edges |= _chain(base, modules, module)
        for n in names:
          if f"{base}.{n}" in modules:
            edges |= _chain(f"{base}.{n}", modules, module)
          elif base in modules:
            edges.add(base)   # a name its __init__ defines: it must have run, even above us
    edges.discard(module)
    graph[module] = edges
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def describe(graph, components) -> str:
  lines = []
  for component in components:
    members = set(component)
    lines.append(f"circle of {len(component)} modules:")
    lines += [f"  {v} -> {', '.join(sorted(graph[v] & members))}" for v in component]
  return "\n".join(lines)


@functools.cache
def repository_graph() -> dict[str, set[str]]:
  return import_graph(TREES)


def _circles_where(bench: bool) -> list[list[str]]:
  return [c for c in circles(repository_graph())
          if any(m.startswith("jaxgemm.bench") for m in c) == bench]


def test_the_graph_sees_every_kind_of_import(tmp_path):
  """On a made-up package: a lazy import, `from X import submodule`, a parent's
  `__init__`, a relative import and import_module each close a circle."""
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  files = {
      "__init__.py": "",
      "low.py": "def f():\n  from pkg import high\n",          # lazy, submodule
      "high.py": "import pkg.low\n",
      "sub/__init__.py": "from pkg.sub import leaf\n",
      "sub/leaf.py": "from .. import rel\n",
      "rel.py": "from pkg.sub.other import g\n",                  # runs sub/__init__
      "sub/other.py": "",
      "dyn.py": "import importlib\nimportlib.import_module(f'pkg.sub.{0}')\n",
    "sub/sibling.py": "from pkg.sub.other import g\n",   # its own package: no edge
    "up.py": "",
    "sub/named.py": "from pkg import up, name_of_init\n",
      "typing_only.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  import pkg.dyn\n",
  }
  for name, text in files.items():
    (pkg / name).write_text(text)
  graph = import_graph({"pkg": pkg})
  assert graph["pkg.dyn"] == {"pkg.sub"}
  assert graph["pkg.typing_only"] == set()
  assert graph["pkg.rel"] == {"pkg.sub", "pkg.sub.other"}
  assert graph["pkg.sub.sibling"] == {"pkg.sub.other"}
  assert graph["pkg.sub.named"] == {"pkg", "pkg.up"}
  assert sorted(circles(graph)) == [["pkg.high", "pkg.low"],
                                    ["pkg.rel", "pkg.sub", "pkg.sub.leaf"]]


def test_the_repository_graph_is_complete():
  """The real graph has the edges it must have (a parser that sees nothing finds no circle)."""
  graph = repository_graph()
  assert {"jaxgemm.gemm", "jaxgemm.ops.matmul.primitive"} <= graph["jaxgemm.ops.matmul.api"]
  # a lazy import, and import_module of an f-string naming the rungs' package
  assert {"jaxgemm.kernels.triton.matmul.persistent",
          "jaxgemm.kernels.triton.matmul"} <= graph["jaxgemm.ops.matmul.triton"]
  # `from jaxgemm.ops.matmul import primitive` runs the matmul package's __init__
  assert "jaxgemm.ops.matmul" in graph["jaxgemm.ops.fused_matmul.primitive"]
  assert "jaxgemm.ops.router" in graph["jaxgemm"]
  assert len(graph) > 100


def test_no_import_circle_in_the_library():
  found = _circles_where(bench=False)
  assert not found, "import circles in jaxgemm/ and kernels/:\n" + describe(
      repository_graph(), found)


def test_no_import_circle_in_bench():
  found = _circles_where(bench=True)
  assert not found, "import circles in bench/:\n" + describe(repository_graph(), found)


def test_kernels_do_not_import_the_ops():
  """The kernels sit below the ops: what both need lives in the low layer
  (`jaxgemm.gemm`, `jaxgemm.ragged_schedule`, `jaxgemm.config`, ...)."""
  graph = repository_graph()
  upward = {module: sorted(m for m in edges if m == "jaxgemm.ops" or m.startswith("jaxgemm.ops."))
            for module, edges in graph.items() if module.startswith("jaxgemm.kernels")}
  upward = {module: ops for module, ops in upward.items() if ops}
  assert not upward, f"kernel modules importing jaxgemm.ops: {upward}"
