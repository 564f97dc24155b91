"""sm_90 PTX of every Triton launch the shipped H200 table's records make, hashed.

    python ptx_identity.py OUT.json

Run once per source tree (PYTHONPATH=<tree>), in separate processes, and
compare the two JSONs (`compare`, below). For every Triton record of
jaxgemm/tables/nvidia-h200.json it rebuilds the record's problem from its key
and shape, takes the record's config, and runs the backend's own
`TritonMatmul().impl(problem, variant, config, "cuda")` abstractly
(`jax.eval_shape`) with `jaxgemm.triton_call.call` replaced by a stub that
records each `Launch` and the dtypes of the arrays it is given. Each launch is
compiled for sm_90 on the CPU with jax-triton's own compilation function, as
tests/test_triton_ptx.py does, and its PTX hashed. Also recorded per record:
the launch's grid, warps, stages, output shapes, argument dtypes and kernel
name, and the jaxpr of the XLA work around the launches (the layout pass of
`layout.tensor_core_layout`, split-K's sum), so a change there shows too.

Normalization: the PTX's debug line info (`.loc` and `.file` directives, and
the `.section .debug_*` blocks) names source files and line numbers, which
move when code is added to a kernel's file even where the instructions do not.
Those lines are removed before hashing; nothing else is touched. The raw sha
(nothing removed) is recorded alongside.

`python ptx_identity.py --compare OLD.json NEW.json` prints the comparison.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import re
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
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.extend.core import Primitive  # noqa: E402
from triton import knobs  # noqa: E402

from jaxgemm import triton_call, tuning_cache  # noqa: E402
from jaxgemm.ops.matmul.problem import GemmProblem  # noqa: E402
from jaxgemm.ops.matmul.triton import TritonConfig, TritonMatmul  # noqa: E402

TABLE = "NVIDIA H200"
PRECISIONS = {"default": None, "tf32": None,
              "tf32x3": (lax.Precision.HIGH, lax.Precision.HIGH),
              "ieee": (lax.Precision.HIGHEST, lax.Precision.HIGHEST)}
_DEBUG_LINE = re.compile(r"^\s*\.(loc|file)\b")
# Labels LLVM emits for the debug info's address ranges (referenced only from
# the .debug_* sections; `normalize` checks that).
_DEBUG_LABEL = re.compile(r"^\$L__tmp\d+:$")


@functools.cache
def _jax_triton_lib():
  """jax_triton.triton_lib, loaded past the package __init__ that insists on a GPU jaxlib
  (as tests/test_triton_ptx.py does)."""
  spec = importlib.util.find_spec("jax_triton")
  path = pathlib.Path(spec.submodule_search_locations[0]) / "triton_lib.py"
  module_spec = importlib.util.spec_from_file_location("_probe_triton_lib", path)
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[module_spec.name] = module
  module_spec.loader.exec_module(module)

  class Captured:
    def __init__(self, name, num_warps, num_ctas, shared_mem_bytes, ptx, ttir,
                 compute_capability):
      self.name, self.ptx, self.shared_mem_bytes = name, ptx, shared_mem_bytes

  module.triton_kernel_call_lib.TritonKernel = Captured
  return module


def normalize(ptx: str) -> str:
  """PTX without its debug line info (see the module docstring)."""
  out, in_debug = [], False
  for line in ptx.splitlines():
    if line.lstrip().startswith(".section") and ".debug" in line:
      in_debug = True
    if in_debug:
      if line.strip() == "}":
        in_debug = False
      continue
    if _DEBUG_LINE.match(line) or _DEBUG_LABEL.match(line):
      continue
    out.append(line)
  text = "\n".join(out) + "\n"
  # The labels removed must be debug info's alone: no instruction may name one.
  assert "$L__tmp" not in text, "a $L__tmp label is referenced outside the debug sections"
  return text


_COMPILED: dict = {}


def compile_ptx(launch, arg_dtypes) -> tuple[str, int, str, str]:
  """(PTX, shared memory bytes, entry name, PTX compiled with no line info) of `launch`
  as jax_triton.triton_call would compile it for sm_90."""
  lib = _jax_triton_lib()
  key = (launch.kernel.fn.__name__, tuple(arg_dtypes), launch.constexprs, launch.num_warps,
         launch.num_stages)
  if key not in _COMPILED:
    arg_types = [f"*{lib._JAX_TO_TRITON_TYPE_MAP[jnp.dtype(d)]}" for d in arg_dtypes]
    out = []
    for no_line_info in (False, True):
      # TRITON_DISABLE_LINE_INFO's knob; jax-triton's in-memory cache does not key on it.
      knobs.compilation.disable_line_info = no_line_info
      lib._COMPILED_KERNEL_CACHE.clear()
      kernel, _ = lib.get_or_create_triton_kernel(
          lib.get_cuda_backend, "cuda", launch.kernel, arg_types, (),
          num_warps=launch.num_warps, num_stages=launch.num_stages, num_ctas=1,
          compute_capability=90, enable_fp_fusion=True, metaparams=dict(launch.constexprs),
          dump=False)
      out.append(kernel)
    knobs.compilation.disable_line_info = False
    assert "$L__tmp" not in out[1].ptx and ".loc" not in out[1].ptx
    _COMPILED[key] = (out[0].ptx, out[0].shared_mem_bytes, out[0].name, out[1].ptx)
  return _COMPILED[key]


def records():
  """(record id, variant, problem, config) of each Triton record of the shipped table."""
  data = json.loads(tuning_cache.table_path(TABLE).read_text())
  for key, shapes in sorted(data["entries"].items()):
    op, kind, backend, variant, rest = tuning_cache.parse_key(key)
    if backend != "triton":
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
      yield f"{key}@{shape}", variant, problem, TritonConfig.from_dict(record["config"])


# The launch in the traced program: a primitive that takes the launch's arrays and
# gives its outputs, so the program's dataflow into and out of it is recorded.
launch_p = Primitive("triton_launch")
launch_p.multiple_results = True
launch_p.def_abstract_eval(
    lambda *avals, outs, kernel: [jax.core.ShapedArray(s, np.dtype(d)) for s, d in outs])


def dataflow(closed) -> str:
  """The program of a jaxpr as expressions from its outputs back to its inputs.

  Two jaxprs with the same dataflow give the same text even where independent
  equations come in another order (the text of `jax.make_jaxpr` numbers its
  variables in equation order, so it would differ).
  """
  jaxpr = closed.jaxpr
  names = {v: f"in{i}" for i, v in enumerate(jaxpr.invars)}
  names.update({v: f"const{i}" for i, v in enumerate(jaxpr.constvars)})
  producer = {v: (eqn, i) for eqn in jaxpr.eqns for i, v in enumerate(eqn.outvars)}

  cache = {}

  def expr(v) -> str:
    if hasattr(v, "val"):   # a literal
      return f"lit({v.val!r}:{v.aval})"
    if v not in cache:
      cache[v] = _expr(v)
    return cache[v]

  def _expr(v) -> str:
    if v in names:
      return f"{names[v]}:{v.aval}"
    eqn, i = producer[v]
    params = ",".join(f"{k}={eqn.params[k]}" for k in sorted(eqn.params))
    return f"{eqn.primitive.name}[{params}]({','.join(map(expr, eqn.invars))})#{i}:{v.aval}"

  is_var = lambda v: not hasattr(v, "val")
  used = {v for eqn in jaxpr.eqns for v in eqn.invars if is_var(v)}
  used |= {v for v in jaxpr.outvars if is_var(v)}
  dead = [str(eqn) for eqn in jaxpr.eqns if not any(v in used for v in eqn.outvars)
          and eqn.outvars]
  assert not dead, f"equations whose results nothing uses: {dead}"
  return "\n".join(map(expr, jaxpr.outvars))


def launches_of(variant, problem, config):
  """The launches (with their argument dtypes) of the backend's impl, the program
  around them (`dataflow`) and its jaxpr's text."""
  captured = []

  def stub(launch, *arrays, platform):
    assert platform == "cuda"
    outs = launch.out_shape if isinstance(launch.out_shape, tuple) else (launch.out_shape,)
    captured.append((launch, [np.dtype(x.dtype).name for x in arrays]
                     + [np.dtype(o.dtype).name for o in outs]))
    results = launch_p.bind(
        *arrays, kernel=launch.kernel.fn.__name__,
        outs=tuple((tuple(o.shape), np.dtype(o.dtype).name) for o in outs))
    return tuple(results) if isinstance(launch.out_shape, tuple) else results[0]

  real, triton_call.call = triton_call.call, stub
  try:
    fn = TritonMatmul(num_sms=132).impl(problem, variant, config, "cuda")
    a = jax.ShapeDtypeStruct(problem.a_shape, problem.dtype)
    b = jax.ShapeDtypeStruct(problem.b_shape, problem.dtype)
    closed = jax.make_jaxpr(fn)(a, b)
  finally:
    triton_call.call = real
  return captured, dataflow(closed), str(closed)


def sha(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def probe(out_path, limit=None, dump=None):
  # Every jaxgemm module must come from the tree being probed.
  import jaxgemm  # noqa: PLC0415
  results, t0 = {}, time.time()
  for i, (rid, variant, problem, config) in enumerate(records()):
    if limit is not None and i >= limit:
      break
    captured, flow, jaxpr = launches_of(variant, problem, config)
    entry = {"program_sha": sha(flow), "jaxpr_text_sha": sha(jaxpr), "launches": []}
    for launch, dtypes in captured:
      ptx, smem, name, ptx_no_line_info = compile_ptx(launch, dtypes)
      if dump:
        pathlib.Path(dump).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(dump) / f"{sha(normalize(ptx))[:16]}.ptx").write_text(ptx)
      out = launch.out_shape if isinstance(launch.out_shape, tuple) else (launch.out_shape,)
      entry["launches"].append({
          "kernel": launch.kernel.fn.__name__, "entry": name, "grid": list(launch.grid),
          "num_warps": launch.num_warps, "num_stages": launch.num_stages,
          "out_shapes": [[list(o.shape), np.dtype(o.dtype).name] for o in out],
          "arg_dtypes": dtypes, "constexprs": [[k, v] for k, v in launch.constexprs],
          "shared_mem_bytes": smem,
          "ptx_sha": sha(normalize(ptx)), "ptx_raw_sha": sha(ptx),
          "ptx_no_line_info_sha": sha(ptx_no_line_info),
          "ptx_lines": len(normalize(ptx).splitlines())})
    results[rid] = entry
    print(f"[{time.time() - t0:6.1f}s] {i:3d} {rid} "
          + " ".join(l["ptx_sha"][:12] for l in entry["launches"]), flush=True)
  modules = sorted({getattr(m, "__file__", None) or "" for n, m in sys.modules.items()
                    if n.startswith("jaxgemm")} - {""})
  outside = [f for f in modules if not pathlib.Path(f).resolve().is_relative_to(ROOT)]
  assert not outside, f"jaxgemm modules from outside {ROOT}: {outside}"
  versions = {b: tuning_cache.kernel_version(b) for b in ("triton", "pallas", "xla")}
  import triton  # noqa: PLC0415
  import subprocess  # noqa: PLC0415
  head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
  meta = {"root": str(ROOT), "git_head": head, "kernel_versions": versions, "triton": triton.__version__,
          "jax": jax.__version__, "jaxgemm_modules": len(modules),
          "normalized": "ptx_sha: removed .loc/.file lines, $L__tmp labels and .section .debug_* "
                        "blocks; ptx_no_line_info_sha: compiled with line info off, raw"}
  pathlib.Path(out_path).write_text(json.dumps({"meta": meta, "records": results}, indent=1))
  print(json.dumps(meta, indent=1))


def compare(old_path, new_path) -> int:
  old, new = (json.loads(pathlib.Path(p).read_text()) for p in (old_path, new_path))
  print("old:", json.dumps(old["meta"]))
  print("new:", json.dumps(new["meta"]))
  assert old["records"].keys() == new["records"].keys(), "different record sets"
  fields = ("kernel", "entry", "grid", "num_warps", "num_stages", "out_shapes", "arg_dtypes",
            "constexprs", "shared_mem_bytes", "ptx_sha", "ptx_no_line_info_sha")
  same = differ = raw_differ = reordered = 0
  launches = set()
  for rid in old["records"]:
    o, n = old["records"][rid], new["records"][rid]
    bad = []
    if o["program_sha"] != n["program_sha"]:
      bad.append("program around the launches")
    reordered += o["jaxpr_text_sha"] != n["jaxpr_text_sha"]
    if len(o["launches"]) != len(n["launches"]):
      bad.append("number of launches")
    for lo, ln in zip(o["launches"], n["launches"]):
      bad += [f for f in fields if lo[f] != ln[f]]
      raw_differ += lo["ptx_raw_sha"] != ln["ptx_raw_sha"]
      launches.add(ln["ptx_sha"])
    if bad:
      differ += 1
      print(f"DIFFERS {rid}: {bad}")
    else:
      same += 1
  print(f"{same} records identical, {differ} differ ({same + differ} Triton records; "
        f"{len(launches)} distinct normalized PTX; {raw_differ} launches whose raw PTX, "
        f"debug line info included, differs; {reordered} records whose jaxpr text differs "
        f"(the equations' order) with the same dataflow)")
  return 1 if differ else 0


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("out", nargs="?")
  parser.add_argument("--limit", type=int)
  parser.add_argument("--dump", help="a folder to write each launch's raw PTX to")
  parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
  args = parser.parse_args()
  if args.compare:
    sys.exit(compare(*args.compare))
  probe(args.out, args.limit, args.dump)
