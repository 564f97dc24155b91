"""Mosaic GPU kernel (and the XLA program around it) of every Pallas record of the
shipped H200 table's, hashed without source locations.

    python pallas_identity.py OUT.json [--dump DIR]

Run once per source tree (PYTHONPATH=<tree>), in separate processes, and
compare the two JSONs (`compare`, below); the structure follows ptx_identity.py.
For every Pallas record of jaxgemm/tables/nvidia-h200.json it rebuilds the
record's problem from its key and shape, takes the record's config, and lowers
the backend's own `PallasMatmul().impl(problem, variant, config, "cuda")` for
cuda (`jax.jit(fn).trace(ShapeDtypeStructs).lower(lowering_platforms=("cuda",))`,
which needs no GPU). Every record is lowered on its own: the kernel's grid,
padding and static dims depend on the shape.

The lowered StableHLO holds each Mosaic GPU kernel as a `stablehlo.custom_call
@mosaic_gpu_v2` whose `mhlo.backend_config` carries the kernel module as MLIR
bytecode (`module`, after Mosaic GPU's serde pass) and `kernel_hash`, the
sha256 of those bytes. The bytes include source locations (file names, line
numbers, the Python scopes' names), which move when code is added to the
kernels' files even where no operation changes. So:

* kernel: the bytecode is parsed with jax's bundled MLIR bindings (the context
  jax lowers with, `mlir.make_ir_context()`, plus the mosaic_gpu dialect), and
  printed with `get_asm(enable_debug_info=False)` (no `loc(...)`); `kernel_sha`
  is the sha256 of that text. The sha of the raw bytes is kept too
  (`kernel_bytes_sha`; it differs whenever a line moves).
* program: in the lowered module each mosaic custom call's backend_config has
  `module` replaced by "kernel <i>" (its index) and `kernel_hash` dropped;
  the module is then printed without debug info and hashed (`program_sha`):
  the padding, transposes and slicing around the kernel, the custom call's
  operands, results, layouts and aliases.

`python pallas_identity.py --compare OLD.json NEW.json` prints the comparison;
`--dump DIR` writes every distinct kernel text (gzip, named by its sha) and
every program text, for diffs.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.abc
import importlib.util
import json
import pathlib
import subprocess
import sys
import time


def _root() -> pathlib.Path:
  """The source tree being probed: the one whose jaxgemm/ comes first on sys.path."""
  spec = importlib.util.find_spec("jaxgemm")
  return pathlib.Path(spec.origin).resolve().parent.parent


class _KernelsFinder(importlib.abc.MetaPathFinder):
  """Maps `jaxgemm.kernels` to <root>/kernels (the editable install would map it to
  the installed checkout's kernels/, whichever tree is on PYTHONPATH)."""

  def __init__(self, root):
    self.root = root

  def find_spec(self, fullname, path=None, target=None):
    if fullname != "jaxgemm.kernels":
      return None
    folder = self.root / "kernels"
    return importlib.util.spec_from_file_location(
        fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


ROOT = _root()
sys.meta_path.insert(0, _KernelsFinder(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jax._src.lib import mosaic_gpu_dialect  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402

from jaxgemm import tuning_cache  # noqa: E402
from jaxgemm.ops.matmul.pallas import PallasConfig, PallasMatmul  # noqa: E402
from jaxgemm.ops.matmul.problem import GemmProblem  # noqa: E402

TABLE = "NVIDIA H200"
PRECISIONS = {"default": None, "tf32": None}
MOSAIC_TARGET = "mosaic_gpu_v2"


def sha(data) -> str:
  return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


def records():
  """(record id, variant, problem, config) of each Pallas record of the shipped table."""
  data = json.loads(tuning_cache.table_path(TABLE).read_text())
  for key, shapes in sorted(data["entries"].items()):
    op, kind, backend, variant, rest = tuning_cache.parse_key(key)
    if backend != "pallas":
      continue
    assert op == "matmul", key
    dtypes, precision, layout, _bucket = rest.split("|")
    dtype, out_dtype = map(np.dtype, dtypes.split("->"))
    for shape, record in sorted(shapes.items()):
      b, m, n, k = map(int, shape.split("x"))
      problem = GemmProblem(b, m, n, k, dtype, out_dtype, np.dtype(np.float32),
                            layout[0] == "T", layout[1] == "T", PRECISIONS[precision])
      # The problem rebuilt must key to the same entry and shape.
      assert tuning_cache.entry_key(kind, backend, variant, problem) == key, (key, problem)
      assert problem.shape_key() == shape, (shape, problem.shape_key())
      yield f"{key}@{shape}", variant, problem, PallasConfig.from_dict(record["config"])


def _ops(op):
  for region in op.regions:
    for block in region.blocks:
      for child in block.operations:
        yield child.operation
        yield from _ops(child.operation)


def kernel_text(blob: bytes) -> str:
  """The Mosaic GPU module serialized in `blob`, printed without locations."""
  ctx = jax_mlir.make_ir_context()
  mosaic_gpu_dialect.register_dialect(ctx)
  ctx.allow_unregistered_dialects = True
  with ctx:
    module = ir.Module.parse(blob)
    text = module.operation.get_asm(enable_debug_info=False)
  assert "loc(" not in text and "/kernels/" not in text, "locations left in the kernel text"
  return text


def lower(variant, problem, config):
  """(kernels: [(text, raw bytes, custom call attributes)], program text)."""
  fn = PallasMatmul().impl(problem, variant, config, "cuda")
  a = jax.ShapeDtypeStruct(problem.a_shape, problem.dtype)
  b = jax.ShapeDtypeStruct(problem.b_shape, problem.dtype)
  lowered = jax.jit(fn).trace(a, b).lower(lowering_platforms=("cuda",))
  module = lowered.compiler_ir("stablehlo")
  kernels = []
  with module.context:
    for op in _ops(module.operation):
      if op.name != "stablehlo.custom_call":
        continue
      target = ir.StringAttr(op.attributes["call_target_name"]).value
      assert target == MOSAIC_TARGET, f"an unexpected custom call {target}"
      config_attr = ir.DictAttr(op.attributes["mhlo.backend_config"])
      fields = {config_attr[i].name: config_attr[i].attr for i in range(len(config_attr))}
      blob = ir.StringAttr(fields["module"]).value_bytes
      assert sha(blob) == ir.StringAttr(fields["kernel_hash"]).value_bytes.hex()
      text = kernel_text(blob)
      kernels.append((text, blob))
      # The program around the kernel: the module's bytes stand as the kernel's index
      # (the kernels are compared on their own).
      fields["module"] = ir.StringAttr.get(f"kernel {len(kernels) - 1}")
      del fields["kernel_hash"]
      op.attributes["mhlo.backend_config"] = ir.DictAttr.get(fields)
    program = module.operation.get_asm(enable_debug_info=False)
  assert "loc(" not in program and "/kernels/" not in program
  return kernels, program


def probe(out_path, limit=None, dump=None):
  import jaxgemm  # noqa: F401, PLC0415
  if dump:
    dump = pathlib.Path(dump)
    (dump / "kernels").mkdir(parents=True, exist_ok=True)
    (dump / "programs").mkdir(parents=True, exist_ok=True)
  results, t0 = {}, time.time()
  for i, (rid, variant, problem, config) in enumerate(records()):
    if limit is not None and i >= limit:
      break
    kernels, program = lower(variant, problem, config)
    entry = {"variant": variant, "config": config.to_dict() if hasattr(config, "to_dict")
             else None, "program_sha": sha(program), "program_lines": program.count("\n"),
             "kernels": []}
    for text, blob in kernels:
      entry["kernels"].append({"kernel_sha": sha(text), "kernel_bytes_sha": sha(blob),
                               "kernel_lines": text.count("\n"), "bytes": len(blob)})
      if dump:
        path = dump / "kernels" / f"{sha(text)[:16]}.mlir.gz"
        if not path.exists():
          path.write_bytes(gzip.compress(text.encode(), 6))
    if dump:
      path = dump / "programs" / f"{sha(program)[:16]}.mlir"
      if not path.exists():
        path.write_text(program)
    results[rid] = entry
    print(f"[{time.time() - t0:6.1f}s] {i:3d} {rid} prog {entry['program_sha'][:12]} "
          + " ".join(k["kernel_sha"][:12] for k in entry["kernels"]), flush=True)
  modules = sorted({getattr(m, "__file__", None) or "" for n, m in sys.modules.items()
                    if n.startswith("jaxgemm")} - {""})
  outside = [f for f in modules if not pathlib.Path(f).resolve().is_relative_to(ROOT)]
  assert not outside, f"jaxgemm modules from outside {ROOT}: {outside}"
  versions = {b: tuning_cache.kernel_version(b) for b in ("triton", "pallas", "xla")}
  head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
  meta = {"root": str(ROOT), "git_head": head, "kernel_versions": versions,
          "jax": jax.__version__, "jaxgemm_modules": len(modules),
          "kernel_modules_loaded": sorted(f for f in modules if "/kernels/" in f),
          "normalized": "kernel_sha: the mosaic_gpu_v2 module bytecode parsed and printed "
                        "without debug info; program_sha: the lowered StableHLO printed "
                        "without debug info, each kernel's bytes replaced by its index "
                        "and kernel_hash dropped"}
  pathlib.Path(out_path).write_text(json.dumps({"meta": meta, "records": results}, indent=1))
  print(json.dumps(meta, indent=1))


_PURE_PREFIX = "stable_mosaic_gpu.arith."   # arith ops (serialized names): no effects


def sunk_text(text: str) -> str:
  """The kernel `text` with every arith op moved to just before its first user (in its
  own block), then printed: two kernels that differ only in where pure integer/float
  arithmetic is placed print the same."""
  ctx = jax_mlir.make_ir_context()
  mosaic_gpu_dialect.register_dialect(ctx)
  ctx.allow_unregistered_dialects = True
  with ctx:
    module = ir.Module.parse(text)

    def sink_block(block):
      ops = [op.operation for op in block.operations]
      for op in ops:
        for region in op.regions:
          for inner in region.blocks:
            sink_block(inner)
      for op in reversed(ops):
        if not op.name.startswith(_PURE_PREFIX) or len(op.regions):
          continue
        first = None
        for result in op.results:
          for use in result.uses:
            user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            while user.block != block:      # the user's ancestor in this block
              user = user.parent.operation
            if first is None or user.is_before_in_block(first):
              first = user
        if first is not None:
          op.move_before(first)

    for region in module.operation.regions:
      for block in region.blocks:
        sink_block(block)
    return module.operation.get_asm(enable_debug_info=False)


def explain(old_json, new_json, old_dump, new_dump) -> int:
  """For the records whose kernels differ: whether they print the same once every
  arith op sits just before its first user (`sunk_text`), and the ops that moved
  (the diff of the two texts with SSA names blanked)."""
  import collections  # noqa: PLC0415
  import difflib  # noqa: PLC0415
  import re  # noqa: PLC0415
  ssa = re.compile(r"%[0-9]+|\^bb[0-9]+")
  old, new = (json.loads(pathlib.Path(p).read_text())["records"] for p in (old_json, new_json))

  def load(dump, digest):
    return gzip.decompress((pathlib.Path(dump) / "kernels" / f"{digest[:16]}.mlir.gz")
                           .read_bytes()).decode()

  pairs = collections.defaultdict(list)
  for rid in old:
    for ko, kn in zip(old[rid]["kernels"], new[rid]["kernels"]):
      if ko["kernel_sha"] != kn["kernel_sha"]:
        pairs[(ko["kernel_sha"], kn["kernel_sha"])].append(rid)
  kinds, bad = collections.Counter(), 0
  for (ko, kn), rids in sorted(pairs.items()):
    to, tn = load(old_dump, ko), load(new_dump, kn)
    same_sunk = sunk_text(to) == sunk_text(tn)
    a, b = ssa.sub("%_", to).splitlines(), ssa.sub("%_", tn).splitlines()
    moved = [(tag, " ".join(x.split())[:110]) for tag, lines in
             (("-", [l for l in difflib.unified_diff(a, b, n=0, lineterm="")
                     if l.startswith("-") and not l.startswith("---")]),
              ("+", [l for l in difflib.unified_diff(a, b, n=0, lineterm="")
                     if l.startswith("+") and not l.startswith("+++")]))
             for x in lines]
    key = (same_sunk, tuple(sorted(collections.Counter(moved).items())))
    kinds[key] += len(rids)
    bad += not same_sunk
    print(f"{'SAME once sunk' if same_sunk else 'DIFFERS sunk'}: {len(rids)} record(s), "
          f"{len(moved)} diff lines (SSA blanked), e.g. {rids[0]}", flush=True)
  print("summary (records: same once sunk, diff lines with SSA names blanked):")
  for (same_sunk, moved), count in kinds.items():
    print(f"  {count} records, same once sunk={same_sunk}:")
    for (tag, line), times in moved:
      print(f"    {tag} x{times} {line}")
  print(f"{sum(len(r) for r in pairs.values())} records in {len(pairs)} distinct kernel pairs; "
        f"{bad} pairs differ even with arith ops sunk to their first user")
  return 1 if bad else 0


def compare(old_path, new_path) -> int:
  old, new = (json.loads(pathlib.Path(p).read_text()) for p in (old_path, new_path))
  print("old:", json.dumps(old["meta"]))
  print("new:", json.dumps(new["meta"]))
  assert old["records"].keys() == new["records"].keys(), "different record sets"
  same = differ = bytes_differ = 0
  kernels, programs, launches = set(), set(), set()
  for rid in old["records"]:
    o, n = old["records"][rid], new["records"][rid]
    bad = []
    if o["program_sha"] != n["program_sha"]:
      bad.append("program around the kernel")
    if len(o["kernels"]) != len(n["kernels"]):
      bad.append("number of kernels")
    for ko, kn in zip(o["kernels"], n["kernels"]):
      if ko["kernel_sha"] != kn["kernel_sha"]:
        bad.append(f"kernel ({ko['kernel_sha'][:16]} -> {kn['kernel_sha'][:16]})")
      bytes_differ += ko["kernel_bytes_sha"] != kn["kernel_bytes_sha"]
      kernels.add(kn["kernel_sha"])
    programs.add(n["program_sha"])
    launches.add((n["program_sha"], tuple(k["kernel_sha"] for k in n["kernels"])))
    if bad:
      differ += 1
      print(f"DIFFERS {rid}: {bad}")
    else:
      same += 1
  print(f"{same} records identical, {differ} differ ({same + differ} Pallas records; "
        f"{len(launches)} distinct lowered programs, {len(kernels)} distinct kernels, "
        f"{len(programs)} distinct programs around them; {bytes_differ} kernels whose raw "
        f"bytecode, locations included, differs)")
  return 1 if differ else 0


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("out", nargs="?")
  parser.add_argument("--limit", type=int)
  parser.add_argument("--dump", help="a folder to write each distinct kernel and program to")
  parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
  parser.add_argument("--explain", nargs=4, metavar=("OLD", "NEW", "OLD_DUMP", "NEW_DUMP"))
  args = parser.parse_args()
  if args.explain:
    sys.exit(explain(*args.explain))
  if args.compare:
    sys.exit(compare(*args.compare))
  probe(args.out, args.limit, args.dump)
