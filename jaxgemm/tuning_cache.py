"""Tuned kernel choices: the on-disk cache and the tables shipped in the package.

Both are the same JSON format, written by `jaxgemm.autotune`:

    {"format": 1,
     "entries": {
       "<device kind>|<backend>/<variant>|<dtype>-><out dtype>|<precision>|<NN|NT|TN|TT>|<bucket>": {
         "<batch>x<m>x<n>x<k>": {"config": {...}, "time_ms": 0.61, "xla_time_ms": 0.60,
                                 "version": "3f2a9c01d4e7", "timer": "cupti", ...}}}}

The key names the device kind (``jax.Device.device_kind``, "NVIDIA H200"),
the kernel, the dtypes, the precision, the transpose flags and a shape bucket:
each of batch, M, N, K rounded up to a power of two, plus whether every
operand row is 16-byte aligned (alignment decides whether TMA and vector
loads can be used, so 4095x4097x4093 never borrows 4096^3's choice). Within a
bucket the record of the nearest tuned shape is used.

Every record carries the kernel source version (`kernel_version`: a hash of
the backend's kernel sources); a record whose version differs from the
installed kernels' is stale and ignored.

The cache lives at ``$JAXGEMM_AUTOTUNE_CACHE`` (a file path; "off" disables
it), by default ``$XDG_CACHE_HOME/jaxgemm/autotune.json``
(``~/.cache/jaxgemm/autotune.json``). Writes merge under an exclusive lock and
replace the file atomically, so several processes may tune at once. A corrupt
or unreadable cache is reported (a warning) and ignored, never fatal.
Tables for device kinds this project has tuned on ship in `jaxgemm/tables/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from jaxgemm.registry import GemmProblem

FORMAT = 1
CACHE_ENV = "JAXGEMM_AUTOTUNE_CACHE"
TABLES_DIR = Path(__file__).resolve().parent / "tables"
_PACKAGE_DIR = Path(__file__).resolve().parent


class TuningCacheWarning(UserWarning):
  """A tuning cache or table could not be read (it is ignored)."""


# ---------------------------------------------------------------- keys

def _next_pow2(x: int) -> int:
  return 1 if x <= 1 else 1 << (x - 1).bit_length()


def rows_aligned(problem: GemmProblem) -> bool:
  """Whether every operand's and the output's rows are 16-byte aligned."""
  item, out_item = np.dtype(problem.dtype).itemsize, np.dtype(problem.out_dtype).itemsize
  a_row = problem.m if problem.trans_a else problem.k
  b_row = problem.k if problem.trans_b else problem.n
  return a_row * item % 16 == 0 and b_row * item % 16 == 0 and problem.n * out_item % 16 == 0


def bucket(problem: GemmProblem) -> str:
  dims = (problem.batch, problem.m, problem.n, problem.k)
  b, m, n, k = map(_next_pow2, dims)
  return f"b{b}.m{m}.n{n}.k{k}.{'a16' if rows_aligned(problem) else 'unaligned'}"


def shape_key(problem: GemmProblem) -> str:
  return f"{problem.batch}x{problem.m}x{problem.n}x{problem.k}"


def _precision_name(problem: GemmProblem) -> str:
  if problem.fp32_precision is not None:
    return problem.fp32_precision
  return "default"


def entry_key(device_kind: str, backend: str, variant: str, problem: GemmProblem) -> str:
  """The cache key of `backend/variant` on `problem`'s bucket on `device_kind`."""
  trans = ("T" if problem.trans_a else "N") + ("T" if problem.trans_b else "N")
  dtypes = f"{np.dtype(problem.dtype).name}->{np.dtype(problem.out_dtype).name}"
  return "|".join((device_kind, f"{backend}/{variant}", dtypes, _precision_name(problem),
                   trans, bucket(problem)))


def _parse_key(key: str) -> tuple[str, str, str, str] | None:
  """(device kind, backend, variant, rest of the key) of an entry key."""
  parts = key.split("|")
  if len(parts) != 6 or "/" not in parts[1]:
    return None
  backend, variant = parts[1].split("/", 1)
  return parts[0], backend, variant, "|".join(parts[2:])


# ---------------------------------------------------------------- versions

_VERSION_SOURCES = {
    # The kernels and the layout preparation around them decide a config's
    # speed; a change to either makes the backend's tuned records stale.
    "triton": ("kernels/triton", "backends/triton.py", "backends/triton_call.py"),
    "pallas": ("kernels/pallas", "backends/pallas.py"),
    "xla": ("backends/xla.py",),
}


def _source_files(rel: str) -> list[Path]:
  if rel.startswith("kernels/"):
    import jaxgemm.kernels  # noqa: PLC0415 (installed under the package)
    base = Path(jaxgemm.kernels.__file__).resolve().parent / rel.split("/", 1)[1]
  else:
    base = _PACKAGE_DIR / rel
  return sorted(base.glob("*.py")) if base.is_dir() else [base]


@functools.cache
def kernel_version(backend: str) -> str:
  """A hash of `backend`'s kernel sources: tuned records of other versions are stale."""
  h = hashlib.sha256()
  for rel in _VERSION_SOURCES.get(backend, ()):
    for path in _source_files(rel):
      h.update(path.name.encode())
      h.update(path.read_bytes())
  return h.hexdigest()[:12]


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
  """The shipped table for `device_kind` ("NVIDIA H200" -> tables/nvidia-h200.json)."""
  slug = re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-")
  return TABLES_DIR / f"{slug}.json"


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
    text = path.read_text()
  except FileNotFoundError:
    return {}
  except OSError as e:
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
def _locked(path: Path) -> Iterator[None]:
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
  with _locked(path):
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


def _distance(shape: str, problem: GemmProblem) -> float:
  dims = [int(x) for x in shape.split("x")]
  want = (problem.batch, problem.m, problem.n, problem.k)
  return sum(abs(math.log(max(a, 1) / max(b, 1))) for a, b in zip(dims, want))


def _records(entries, source, device_kind, problem, backend) -> dict[tuple[str, str], Tuned]:
  out = {}
  suffix = entry_key(device_kind, "b", "v", problem).split("|", 2)[2]
  for key, shapes in entries.items():
    parsed = _parse_key(key)
    if parsed is None or parsed[0] != device_kind or parsed[3] != suffix:
      continue
    _, b, v, _ = parsed
    if backend is not None and b != backend:
      continue
    current = {s: r for s, r in shapes.items()
               if r.get("version") == kernel_version(b) and _valid_record(r)}
    if not current:
      continue   # stale (kernel sources changed since) or malformed
    shape = min(current, key=lambda s: _distance(s, problem))
    r = current[shape]
    out[(b, v)] = Tuned(b, v, dict(r["config"]), float(r["time_ms"]),
                        float(r["xla_time_ms"]), shape, source)
  return out


def _valid_record(r: dict) -> bool:
  try:
    return (isinstance(r["config"], dict) and float(r["time_ms"]) > 0
            and float(r["xla_time_ms"]) > 0)
  except (KeyError, TypeError, ValueError):
    return False


def lookup(problem: GemmProblem, device_kind: str, backend: str | None = None,
           cache_path: Path | None | str = "default") -> list[Tuned]:
  """The current tuned records for `problem` on `device_kind` (of one backend, or all).

  The cache's record for a (backend, variant) overrides the shipped table's.
  """
  path = default_cache_path() if cache_path == "default" else cache_path
  found = _records(load(table_path(device_kind)), "table", device_kind, problem, backend)
  found.update(_records(load(path), "cache", device_kind, problem, backend))
  return list(found.values())


def has_record(problem: GemmProblem, device_kind: str, backend: str, variant: str,
               path: Path | None) -> bool:
  """Whether `path` holds a current record of exactly this problem for backend/variant."""
  shapes = load(path).get(entry_key(device_kind, backend, variant, problem), {})
  r = shapes.get(shape_key(problem))
  return r is not None and r.get("version") == kernel_version(backend) and _valid_record(r)
