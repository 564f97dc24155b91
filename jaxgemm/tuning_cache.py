"""Tuned kernel choices: the on-disk cache and the tables shipped in the package.

Both are the same JSON format, written by `jaxgemm.autotune`:

    {"format": 2,
     "entries": {
       "<op>|<device kind>|<backend>/<variant>|<op's fields>|<bucket>": {
         "<shape>": {"config": {...}, "time_ms": 0.61, "xla_time_ms": 0.60,
                     "version": "3f2a9c01d4e7", "timer": "cupti", ...}}}}

The key names the op ("matmul"), the device kind (``jax.Device.device_kind``,
"NVIDIA H200"), the kernel, what the op's problem says must match exactly
(`Problem.cache_fields`; for matmul: dtypes, precision, transpose flags), and a
shape bucket (`Problem.bucket`: each size rounded up to a power of two, plus
whether every operand row is 16-byte aligned, since alignment decides whether
TMA and vector loads can be used, so 4095x4097x4093 never borrows 4096^3's
choice). Within a bucket the record of the nearest tuned shape is used.

Every record carries its rung's kernel version (`kernel_version(backend, op,
variant=...)`): a hash of the code that rung runs, docstrings and comments left
out, namely the modules `Backend.kernel_modules_of(variant)` names and every
module of `jaxgemm.kernels` they import, directly or not (`hashed_modules`). A
record whose version differs from the installed rung's is stale and ignored.
So editing one rung's kernel stales only the records of the rungs that run it,
while editing a module they share (`common`, `epilogue`, a rung that another
imports) stales all of theirs. `restamp` carries records that are still right
over a change of how versions are computed (research/restamp_table.py).

The cache lives at ``$JAXGEMM_AUTOTUNE_CACHE`` (a file path; "off" disables
it), by default ``$XDG_CACHE_HOME/jaxgemm/autotune.json``
(``~/.cache/jaxgemm/autotune.json``). Writes merge under an exclusive lock and
replace the file atomically, so several processes may tune at once. A corrupt
or unreadable cache is reported (a warning) and ignored, never fatal.
Tables for device kinds this project has tuned on ship in `jaxgemm/tables/`;
``JAXGEMM_TABLES=off`` leaves them unread (every choice is then the cache's or
the heuristics': how the heuristics are measured on their own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ast
import gzip
import hashlib
import importlib.util
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator


from jaxgemm.ops.base import Problem

# Format 2 keys records by op and hashes kernel code, not bytes (format 1 files
# are ignored with a warning: every record in them is stale).
FORMAT = 2
CACHE_ENV = "JAXGEMM_AUTOTUNE_CACHE"
TABLES_ENV = "JAXGEMM_TABLES"
TABLES_DIR = Path(__file__).resolve().parent / "tables"


class TuningCacheWarning(UserWarning):
  """A tuning cache or table could not be read (it is ignored)."""


# ---------------------------------------------------------------- keys

def entry_key(device_kind: str, backend: str, variant: str, problem: Problem) -> str:
  """The cache key of `backend/variant` on `problem`'s bucket on `device_kind`."""
  return "|".join((problem.op, device_kind, f"{backend}/{variant}", *problem.cache_fields(),
                   problem.bucket()))


def parse_key(key: str) -> tuple[str, str, str, str, str] | None:
  """(op, device kind, backend, variant, rest of the key) of an entry key."""
  parts = key.split("|")
  if len(parts) < 4 or "/" not in parts[2]:
    return None
  backend, variant = parts[2].split("/", 1)
  return parts[0], parts[1], backend, variant, "|".join(parts[3:])


# ---------------------------------------------------------------- versions

class _StripDocstrings(ast.NodeTransformer):
  """Drops the docstring of every module, class and function: prose, not code."""

  def _strip(self, node):
    self.generic_visit(node)
    body = node.body
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)):
      node.body = body[1:] or [ast.Pass()]
    return node

  visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _strip


def code_fingerprint(source: str) -> str:
  """The code of a Python source without its comments, docstrings and layout.

  Two sources with the same fingerprint run the same program: a docstring or
  comment edit keeps it, any change to code (a constant, a name, an import)
  changes it. It is the same under every Python the package supports: fields
  a newer `ast` adds empty (3.12's `type_params`) are left out, where
  `ast.dump` would write them and make every shipped record stale on another
  Python (tables tuned under the GPU machine's 3.12 read stale under 3.11).
  """
  return _dump(_StripDocstrings().visit(ast.parse(source)))


def _dump(node) -> str:
  if isinstance(node, ast.AST):
    fields = ((f, getattr(node, f, None)) for f in node._fields)
    return f"{type(node).__name__}(" + ", ".join(
        f"{f}={_dump(v)}" for f, v in fields if v is not None and v != []) + ")"
  if isinstance(node, list):
    return "[" + ", ".join(map(_dump, node)) + "]"
  return repr(node)


# The package whose modules a rung's version follows through imports: the kernels.
KERNELS = "jaxgemm.kernels"


def _read_source(path: Path) -> str:
  return path.read_text()


@functools.lru_cache(maxsize=512)
def _analyse(module: str, is_package: bool, source: str) -> tuple[str, frozenset[str]]:
  """(code fingerprint, the dotted names it may import) of `module`'s source.

  Every import counts, at module level or inside a function (that code runs
  when the function does). `from a.b import c` gives a.b and a.b.c (c may be
  a module or a name in a.b: `_spec` tells), `import a.b` gives a.b; with
  their parent packages, whose `__init__` runs on the way.
  """
  tree = ast.parse(source)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:   # relative: from the module's package, up level - 1
        package = module if is_package else module.rpartition(".")[0]
        package = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
        base = f"{package}.{base}" if base else package
      names.add(base)
      names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
  parents = {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 1)}
  return code_fingerprint(source), frozenset(names | parents)


def _spec(module: str):
  """The spec of `module`, None where no such module exists. Only packages are
  imported to find it (their `__init__`), never a module itself: `from
  a.common import x` must not import a.common (a kernel module imports triton)."""
  parent = module.rpartition(".")[0]
  if parent:
    parent_spec = _spec(parent)
    if parent_spec is None or not parent_spec.submodule_search_locations:
      return None   # x is a name in a module, not a module
  try:
    return importlib.util.find_spec(module)
  except (ImportError, ValueError):
    return None


def hashed_modules(roots, follow: str = KERNELS) -> tuple[str, ...]:
  """The modules `modules_version(roots)` hashes, sorted: `roots`, and every module
  of the package `follow` they import, directly or through each other (with the
  packages on the way, whose `__init__` runs).

  Imports of modules outside `follow` are not followed: a backend names the ones
  that decide its speed among its roots (`Backend.kernel_modules_of`).

  >>> hashed_modules(["jaxgemm.kernels.triton.matmul.tensorcore"])[-2:]
  ('jaxgemm.kernels.triton.matmul.tensorcore', 'jaxgemm.kernels.triton.matmul.tiled')
  """
  inside = lambda name: name == follow or name.startswith(follow + ".")
  todo, seen = [], set()
  for root in roots:
    spec = _spec(root)
    if spec is None or spec.origin is None:
      raise ModuleNotFoundError(f"no module {root!r} (a kernel module: see "
                                f"Backend.kernel_modules_of)", name=root)
    if spec.submodule_search_locations:
      raise ValueError(f"{root!r} is a package: name the modules a rung runs, not their "
                       f"package (a package would stale every rung on any file's edit)")
    parents = (".".join(root.split(".")[:i]) for i in range(1, root.count(".") + 1))
    todo += [root, *filter(inside, parents)]
  while todo:
    module = todo.pop()
    if module in seen:
      continue
    seen.add(module)
    spec = _spec(module)
    source = _read_source(Path(spec.origin))
    _, names = _analyse(module, bool(spec.submodule_search_locations), source)
    todo += [n for n in names if inside(n) and n not in seen and _spec(n) is not None]
  return tuple(sorted(seen))


def modules_version(roots, follow: str = KERNELS) -> str:
  """A hash of the code (not the prose) of `hashed_modules(roots, follow)`.

  >>> len(modules_version(["jaxgemm.kernels.triton.matmul.tensorcore"]))
  12
  """
  h = hashlib.sha256()
  for module in hashed_modules(roots, follow):
    spec = _spec(module)
    fingerprint, _ = _analyse(module, bool(spec.submodule_search_locations),
                              _read_source(Path(spec.origin)))
    h.update(module.encode())
    h.update(fingerprint.encode())
  return h.hexdigest()[:12]


@functools.cache
def kernel_version(backend: str, op: str = "matmul", *, variant: str) -> str:
  """The version of one rung's kernel: tuned records of another version are stale.

  It hashes the code the rung runs, `Backend.kernel_modules_of(variant)` and
  the kernel modules they import (`hashed_modules`), without docstrings and
  comments: editing prose keeps the shipped tables current, and editing one
  rung's kernel stales only the records of the rungs that run it. ValueError
  for a backend or variant this installation does not have.

  >>> len(kernel_version("triton", "matmul", variant="persistent"))
  12
  """
  from jaxgemm import registry  # noqa: PLC0415 (the registry imports the ops, which import us)
  return modules_version(registry.get_backend(backend, op).kernel_modules_of(variant))


def restamp(entries: dict[str, dict[str, dict]], old_versions: dict[str, str]
            ) -> tuple[dict[str, dict[str, dict]], dict[str, dict[str, int]]]:
  """Records current under `old_versions` stamped with today's versions; others untouched.

  For a change of how versions are computed (or of code shown not to move a
  recorded config's speed), which would otherwise stale records that are
  still right. old_versions: {"<op>/<backend>/<variant>" or "<op>/<backend>":
  the version a record of that rung (or backend) carried while current}. A
  record whose version is its rung's old one gets `kernel_version` of this
  tree; every other record keeps its version, so a stale record stays stale.
  Returns the new entries and, per "<op>/<backend>", counts of records
  "current before" (at their old version), "current after" (at today's) and
  "stale" (neither, left as they were).

  >>> entries = {"matmul|cpu|xla/dot_general|float32|x": {"1x1x1": {"version": "old"}}}
  >>> new, counts = restamp(entries, {"matmul/xla": "old"})
  >>> counts
  {'matmul/xla': {'current before': 1, 'current after': 1, 'stale': 0}}
  """
  out, counts = {}, {}
  for key, shapes in entries.items():
    parsed = parse_key(key)
    out[key] = {shape: dict(r) for shape, r in shapes.items()}
    if parsed is None:
      continue
    op, _, backend, variant, _ = parsed
    old = old_versions.get(f"{op}/{backend}/{variant}", old_versions.get(f"{op}/{backend}"))
    try:
      new = kernel_version(backend, op, variant=variant)
    except ValueError:   # a backend or rung this tree no longer has
      new = None
    count = counts.setdefault(f"{op}/{backend}",
                              {"current before": 0, "current after": 0, "stale": 0})
    for r in out[key].values():
      before = old is not None and r.get("version") == old
      if before and new is not None:
        r["version"] = new
      count["current before"] += before
      count["current after"] += new is not None and r.get("version") == new
      count["stale"] += not before and r.get("version") != new
  return out, counts


@functools.cache
def library_versions() -> dict[str, str]:
  """The versions of the libraries a kernel's speed depends on, as records carry them.

  A cache record written under other versions is stale (`lookup` ignores it): a
  new jaxlib changes XLA's programs, a new Triton the kernels' code.

  >>> sorted(library_versions())
  ['jax', 'jaxlib', 'triton']
  """
  from importlib import metadata  # noqa: PLC0415 (only when a record is written or read)
  out = {}
  for name in ("jax", "jaxlib", "triton"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = "none"
  return out


# ---------------------------------------------------------------- files

def default_cache_path() -> Path | None:
  """Where the cache lives: $JAXGEMM_AUTOTUNE_CACHE, else ~/.cache/jaxgemm/autotune.json.

  None when the variable is "off" (or "0", "none"): no cache is read or written.
  """
  env = os.environ.get(CACHE_ENV)
  if env is not None and env.strip().lower() in ("off", "0", "none", ""):
    return None
  if env:
    return Path(env).expanduser()
  root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(root) / "jaxgemm" / "autotune.json"


def table_path(device_kind: str) -> Path:
  """The shipped table for `device_kind` ("NVIDIA H200" -> tables/nvidia-h200.json, or
  its gzipped form .json.gz where that is shipped: a sweep's table of thousands)."""
  slug = re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-")
  packed = TABLES_DIR / f"{slug}.json.gz"
  return packed if packed.exists() else TABLES_DIR / f"{slug}.json"


def _validate(data: Any) -> dict[str, dict[str, dict]]:
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ValueError(f"not a jaxgemm tuning file of format {FORMAT} "
                     f"(format={data.get('format') if isinstance(data, dict) else None!r})")
  entries = data.get("entries")
  if not isinstance(entries, dict) or not all(
      isinstance(v, dict) and all(isinstance(r, dict) for r in v.values())
      for v in entries.values()):
    raise ValueError("'entries' must map keys to {shape: record} objects")
  return entries


_warned: set = set()


def _read(path: Path) -> dict[str, dict[str, dict]]:
  """The file's entries; {} if it is missing, and {} with a warning if it is unreadable."""
  try:
    text = (gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz"
            else path.read_text())
  except FileNotFoundError:
    return {}
  except (OSError, EOFError) as e:   # gzip.BadGzipFile is an OSError
    _warn_once(path, f"cannot be read ({e})")
    return {}
  try:
    return _validate(json.loads(text))
  except ValueError as e:   # json.JSONDecodeError is a ValueError
    _warn_once(path, f"is corrupt ({e})")
    return {}


def _warn_once(path: Path, what: str) -> None:
  try:
    stamp = path.stat().st_mtime_ns
  except OSError:
    stamp = None
  if (path, stamp) not in _warned:
    _warned.add((path, stamp))
    warnings.warn(f"jaxgemm: ignoring the tuning file {path}: it {what}. "
                  f"Delete it or run jaxgemm.autotune again to rewrite it.",
                  TuningCacheWarning, stacklevel=3)


@functools.lru_cache(maxsize=32)
def _read_cached(path: Path, stamp) -> dict[str, dict[str, dict]]:
  return _read(path)


def load(path: Path | None) -> dict[str, dict[str, dict]]:
  """The entries of a tuning file, re-read only when it changes on disk."""
  if path is None:
    return {}
  try:
    st = path.stat()
  except OSError:
    return {}
  return _read_cached(path, (st.st_mtime_ns, st.st_size, st.st_ino))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
  """An exclusive lock beside `path` (advisory; no-op where fcntl is missing)."""
  try:
    import fcntl  # noqa: PLC0415 (POSIX only)
  except ImportError:
    yield
    return
  with open(path.with_name(path.name + ".lock"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def store(path: Path, records: dict[str, dict[str, dict]]) -> None:
  """Merges {key: {shape: record}} into the file at `path`, atomically.

  Under an exclusive lock: read what is there (a corrupt file is reported and
  replaced), merge, write a temporary file in the same folder and rename it
  over the original, so readers never see a partial file.
  """
  path.parent.mkdir(parents=True, exist_ok=True)
  with locked(path):
    entries = _read(path)
    for key, shapes in records.items():
      entries.setdefault(key, {}).update(shapes)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
      with os.fdopen(fd, "w") as f:
        json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise


# ---------------------------------------------------------------- lookup

@dataclasses.dataclass(frozen=True)
class Tuned:
  """One tuned record that applies to a problem."""

  backend: str
  variant: str
  config: dict
  time_ms: float
  xla_time_ms: float
  shape: str            # the shape it was tuned on (nearest in the bucket)
  source: str           # "cache" or "table"

  @property
  def speedup_vs_xla(self) -> float:
    return self.xla_time_ms / self.time_ms


# Records measured in this process (`remember`): `backend="auto"` uses them even where
# no cache file is written (JAXGEMM_AUTOTUNE_CACHE=off, or one that cannot be written).
_SESSION: dict[str, dict[str, dict]] = {}


def remember(records: dict[str, dict[str, dict]]) -> None:
  """Keeps {key: {shape: record}} (what `jaxgemm.autotune` stores) for this process."""
  for key, shapes in records.items():
    _SESSION.setdefault(key, {}).update(shapes)


def forget() -> None:
  """Drops what `remember` kept (tests start from a clean process state)."""
  _SESSION.clear()


def _records(entries, source, device_kind, problem, backend) -> dict[tuple[str, str], Tuned]:
  out = {}
  suffix = parse_key(entry_key(device_kind, "b", "v", problem))[4]
  for key, shapes in entries.items():
    parsed = parse_key(key)
    if parsed is None or parsed[:2] != (problem.op, device_kind) or parsed[4] != suffix:
      continue
    _, _, b, v, _ = parsed
    if backend is not None and b != backend:
      continue
    version = _current_version(b, problem.op, v)
    current = {s: r for s, r in shapes.items() if _is_current(r, version, source)}
    if not current:
      continue   # stale (kernel code changed since), malformed, or no such backend
    shape = min(current, key=problem.distance)
    out[(b, v)] = _as_tuned(current[shape], b, v, shape, source)
  return out


def _is_current(r: dict, version: str | None, source: str) -> bool:
  """Whether record `r` from layer `source` counts: its rung's current code version, well
  formed, and (but in a shipped table) measured under the installed libraries."""
  return (version is not None and r.get("version") == version and _valid_record(r)
          and (source == "table" or _same_libraries(r)))


def _as_tuned(r: dict, backend: str, variant: str, shape: str, source: str) -> Tuned:
  return Tuned(backend, variant, dict(r["config"]), float(r["time_ms"]),
               float(r["xla_time_ms"]), shape, source)


def _layers(device_kind: str, cache_path) -> list[tuple[dict, str]]:
  """The record layers, each later one overriding the earlier: the shipped table (unless
  JAXGEMM_TABLES=off), the cache file, this process's measurements."""
  path = default_cache_path() if cache_path == "default" else cache_path
  layers = [(load(path), "cache"), (_SESSION, "measured")]
  if os.environ.get(TABLES_ENV, "").lower() != "off":
    layers.insert(0, (load(table_path(device_kind)), "table"))
  return layers


def _current_version(backend: str, op: str, variant: str) -> str | None:
  try:
    return kernel_version(backend, op, variant=variant)
  except ValueError:   # a backend or rung this installation does not have
    return None


def _same_libraries(r: dict) -> bool:
  """Whether a cache record was measured under the installed libraries (records written
  before they carried them count as current: `jaxgemm.autotune` run by hand). A shipped
  table's records are priors measured under the project's versions and always count."""
  libs = r.get("libs")
  return libs is None or libs == library_versions()


def _valid_record(r: dict) -> bool:
  try:
    return (isinstance(r["config"], dict) and float(r["time_ms"]) > 0
            and float(r["xla_time_ms"]) > 0)
  except (KeyError, TypeError, ValueError):
    return False


def lookup(problem: Problem, device_kind: str, backend: str | None = None,
           cache_path: Path | None | str = "default") -> list[Tuned]:
  """The current tuned records for `problem` on `device_kind` (of one backend, or all).

  The cache's record for a (backend, variant) overrides the shipped table's.
  """
  found = {}
  for entries, source in _layers(device_kind, cache_path):
    found.update(_records(entries, source, device_kind, problem, backend))
  return list(found.values())


def measured_backends(problem: Problem, device_kind: str, xla_variant: str,
                      cache_path: Path | None | str = "default") -> set[str] | None:
  """The backends measured on exactly `problem` on `device_kind`, by the XLA record that
  every measurement writes (in this process, the cache or the shipped table); None where
  the problem was never measured. A record from before the list was kept measured all.
  """
  key = entry_key(device_kind, "xla", xla_variant, problem)
  version = _current_version("xla", problem.op, xla_variant)
  found = None
  for entries, source in _layers(device_kind, cache_path):
    r = entries.get(key, {}).get(problem.shape_key())
    if r is None or not _is_current(r, version, source):
      continue
    measured = set(r.get("measured", ("*",)))
    found = measured if found is None else found | measured
  return found


def has_record(problem: Problem, device_kind: str, backend: str, variant: str,
               path: Path | None) -> bool:
  """Whether `path` holds a current record of exactly this problem for backend/variant."""
  shapes = load(path).get(entry_key(device_kind, backend, variant, problem), {})
  r = shapes.get(problem.shape_key())
  return (r is not None and r.get("version") == _current_version(backend, problem.op, variant)
          and _valid_record(r))


# ---------------------------------------------------------------- the no-measure rule

RULE_FILE = "rule.json"


@dataclasses.dataclass(frozen=True)
class NeighbourRule:
  """`backend="auto"`'s decision for a problem with no record of its own, fitted on a
  sweep and scored on problems it never saw (research/sweep/fit.py; docs/sweep.md): the
  `k` measured problems nearest it (same op and exact-match fields, by
  `Problem.distance`, plus `align_penalty` where their alignment differs; None: never
  the other alignment); the kernel whose worst speedup over XLA among them is highest
  runs if that worst is at least `margin`, else XLA."""
  k: int
  margin: float
  align_penalty: float | None
  device_kinds: tuple[str, ...]   # the cards its sweep measured: it decides only there


def rule_for(device_kind: str) -> NeighbourRule | None:
  """The shipped rule (tables/rule.json) if its sweep measured `device_kind`, else None."""
  if os.environ.get(TABLES_ENV, "").lower() == "off":
    return None
  path = TABLES_DIR / RULE_FILE
  try:
    st = path.stat()
  except OSError:
    return None
  rule = _read_rule(path, (st.st_mtime_ns, st.st_size))
  return rule if rule is not None and device_kind in rule.device_kinds else None


@functools.lru_cache(maxsize=4)
def _read_rule(path: Path, stamp) -> NeighbourRule | None:
  try:
    d = json.loads(path.read_text())
    return NeighbourRule(int(d["k"]), float(d["margin"]),
                         None if d["align_penalty"] is None else float(d["align_penalty"]),
                         tuple(d["records"]["device_kinds"]))
  except (OSError, ValueError, KeyError, TypeError) as e:
    _warn_once(path, f"is not a rule ({type(e).__name__}: {e})")
    return None


def neighbours(problem: Problem, device_kind: str, k: int, align_penalty: float | None,
               cache_path: Path | None | str = "default") -> list[dict[tuple[str, str], Tuned]]:
  """The `k` measured problems nearest `problem` (`NeighbourRule`), nearest first, each
  as its current records by (backend, variant), XLA's included; the problem's own shape
  is left out. A measured problem is one with an XLA record (every measurement writes
  one). Layers as in `lookup`: the shipped table, the cache, this process."""
  fields = "|".join(problem.cache_fields())
  aligned = problem.bucket().endswith(".a16")
  own = problem.shape_key()
  shapes: dict[str, dict[tuple[str, str], Tuned]] = {}
  away: dict[str, float] = {}
  versions: dict[tuple[str, str], str | None] = {}
  for entries, source in _layers(device_kind, cache_path):
    for key, records in entries.items():
      parsed = parse_key(key)
      if parsed is None or parsed[:2] != (problem.op, device_kind):
        continue
      _, _, b, v, rest = parsed
      rest_fields, _, bucket = rest.rpartition("|")
      if rest_fields != fields:
        continue
      same_alignment = bucket.endswith(".a16") == aligned
      if not same_alignment and align_penalty is None:
        continue
      if (b, v) not in versions:
        versions[(b, v)] = _current_version(b, problem.op, v)
      for shape, r in records.items():
        if shape == own or not _is_current(r, versions[(b, v)], source):
          continue
        shapes.setdefault(shape, {})[(b, v)] = _as_tuned(r, b, v, shape, source)
        away[shape] = problem.distance(shape) + (0.0 if same_alignment else align_penalty)
  measured = [s for s, recs in shapes.items() if any(b == "xla" for b, _ in recs)]
  measured.sort(key=lambda s: (away[s], s))
  return [shapes[s] for s in measured[:k]]
