"""The `sharded` suite: jaxgemm on a mesh of every device, against XLA's dot on the same mesh.

    python -m bench --suite sharded                       # the step, the layouts, the MLP
    python -m bench --suite sharded --only 'sharded.step' # the training step alone
    python -m bench --suite sharded --only 'sharded.mlp-sp.*' --backends auto   # the MLP

Every row compiles two programs of the same expression for the same mesh, the
same placed inputs and the same output shardings: one calls jaxgemm (a backend,
or `auto`), the other jnp / lax (XLA's dot: the `xla_dot` row). It records

* the time of one call, jaxgemm's and XLA's interleaved in blocks (`time_paired`).
  The clock is the wall clock over back-to-back calls (`PipelinedWallTimer`): a
  program on several GPUs has no one kernel time, and its collectives and their
  overlap are part of what is compared;
* the collectives of each compiled HLO, by kind and operand type (`collectives`),
  and whether jaxgemm's are XLA's (`same_collectives`): a sharded operand gathered
  whole would show as an extra all-gather;
* the memory XLA plans per device for each program (`compiled.memory_analysis()`:
  arguments + outputs + temporaries - aliased buffers; one device's share of an
  SPMD program), since a gather would also show there;
* the local problem each kernel was lowered for (`sharding.recording_local_problems`),
  and the program's custom calls (`custom_calls`: which kernels ran);
* agreement with XLA: the result's relative Frobenius error against the dtype's
  tolerance (the GEMM suites' gate), or the step's loss trajectory.

The layouts (`layouts`) are the sharding issue's, at the sizes of an LLM's MLP
(8192 tokens, d_model 4096, d_ff 14336: Llama-3-8B) on a 1-D mesh `x` of all
devices: data parallel (M split), column parallel (N), row parallel (K split and
an all-reduce), row parallel into a sequence-sharded result (K split and a
reduce-scatter), and experts (a batch of 8 experts split).

The Megatron sequence-parallel MLP (`MlpConfig`, issue 44), gelu(x @ W1) @ W2 at
Llama-3-8B and Llama-3-70B sizes on a 1-D mesh `tp` of all devices: x split on tokens,
W1 on columns, W2 on rows, the result on tokens. Its operands' shardings conflict (tokens
and columns on one axis), so one operand must move: XLA gathers x, the smaller. Each
model has a forward row (`fwd`) and a forward-and-backward one (`fwd+bwd`: y, dx, dW1
and dW2 through `jax.vjp`), each with both programs' times and collective bytes.

The training step (`StepConfig`) is a stack of Megatron-style transformer blocks
on a (data, model) mesh: q/k/v and the MLP's up projection column-parallel, the
attention output and the MLP's down projection row-parallel, attention per head
(heads over `model`, causal), batch over `data`; fp32 parameters and Adam, bf16
GEMMs. jaxgemm's model calls `jaxgemm.matmul` / `jaxgemm.dot_general` where XLA's
calls `jnp.matmul` / `lax.dot_general`; both start from the same parameters and
see the same batch, so the losses must agree step by step within the dtype's
trajectory tolerance (`training.TRAJECTORY_TOL`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections import Counter
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm import sharding
from jaxgemm.timing import summarize, time_paired

from . import training as T
from . import problems as BP
from .runner import (AUTO, REF, REF_VARIANT, STATUS_ERROR, STATUS_FAIL, STATUS_OK,
                     STATUS_SKIPPED, TOLERANCE, Context, SuiteOptions, base_row, excluded,
                     short_error)

SUITE = "sharded"
STEP_NAME = "sharded.step"
# How a compiled program's collectives are read (kind, result type, bytes on one device)
# is jaxgemm.sharding's, shared with the tests: `collectives` counts them, per kind
# `collective_totals` sums them.
COLLECTIVES = sharding.COLLECTIVES
collectives = sharding.hlo_collectives
collective_totals = sharding.collective_totals


# ---------------------------------------------------------------- compiled programs

def describe_collectives(found: Counter) -> str:
  """'all-reduce 8 ops 21.3 MB; ...' per kind, or 'none'.

  >>> describe_collectives(collectives("%a = bf16[1024,1024]{1,0} all-reduce(%p)"))
  'all-reduce 1 op 2.10 MB'
  """
  if not found:
    return "none"
  return "; ".join(f"{k} {ops} op{'s' if ops > 1 else ''} {b / 1e6:.2f} MB"
                   for k, (ops, b) in collective_totals(found).items())


def list_collectives(found: Counter) -> str:
  """Every collective with its operand type (the log's detail)."""
  return "; ".join(f"{k} {t}" + (f" x{n}" if n > 1 else "") for (k, t), n in sorted(found.items()))


_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')


def custom_calls(hlo: str) -> str:
  """'triton_kernel_call x12; __cublas$lt$matmul x3': which kernels a program calls (the
  GEMM kernels are custom calls: jaxgemm's Triton and Mosaic GPU ones, and cuBLAS).

  >>> custom_calls('%c = f32[4] custom-call(%a), custom_call_target="mosaic_gpu_v2"')
  'mosaic_gpu_v2 x1'
  """
  found = Counter(_CUSTOM_CALL.findall(hlo))
  return "; ".join(f"{k} x{n}" for k, n in sorted(found.items())) or "none"


def memory_per_device(compiled) -> int | None:
  """Bytes XLA plans on one device for a compiled program (None where it does not say)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 (not every backend implements it)
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


@dataclasses.dataclass
class Program:
  """One compiled program and what the suite reads off it."""

  compiled: Callable
  collectives: Counter
  memory: int | None
  local_problems: list[str]
  compile_s: float
  custom_calls: str = ""


def compile_program(fn, args, out_shardings=None, hlo_file=None,
                    compiler_options: dict | None = None) -> Program:
  """Compiles fn for `args` (placed); `hlo_file`: where its collectives' HLO lines go;
  `compiler_options`: XLA's flags for this program alone (e.g. its windowed einsum)."""
  t0 = time.perf_counter()
  with sharding.recording_local_problems() as seen:
    compiled = jax.jit(fn, out_shardings=out_shardings).lower(*args).compile(
        compiler_options=compiler_options)
  hlo = compiled.as_text()
  if hlo_file is not None:
    hlo_file.parent.mkdir(parents=True, exist_ok=True)
    hlo_file.write_text("".join(line.strip() + "\n" for line in hlo.splitlines()
                                if sharding.COLLECTIVE_OP.search(line)))
  return Program(compiled, collectives(hlo), memory_per_device(compiled),
                 sorted({x.problem.describe() for x in seen}), time.perf_counter() - t0,
                 custom_calls(hlo))


def _hlo_file(hlo_dir, problem: str, program: str):
  """Where a program's collectives go: a file name of letters, digits, '.', '_' and '-'
  only (variants such as "overlap=True" or "local GEMMs (floor)" are not; the GPU
  machine returns no file with other characters in its name)."""
  from pathlib import Path  # noqa: PLC0415
  if hlo_dir is None:
    return None
  return Path(hlo_dir) / (re.sub(r"[^A-Za-z0-9._-]+", "-", f"{problem}.{program}") + ".txt")


# ---------------------------------------------------------------- the layouts

@dataclasses.dataclass(frozen=True)
class Layout:
  """One sharded GEMM: C = A @ B (batched when `batch`), operands placed as the specs say."""

  name: str
  what: str
  batch: int          # 0: a plain (M, K) @ (K, N)
  m: int
  k: int
  n: int
  a_spec: P
  b_spec: P
  out_spec: P | None  # None: the partitioner's choice (as jnp's matmul leaves it)

  @property
  def flops(self) -> int:
    return 2 * max(self.batch, 1) * self.m * self.k * self.n

  def shapes(self):
    lead = (self.batch,) if self.batch else ()
    return (*lead, self.m, self.k), (*lead, self.k, self.n)


# (tokens, d_model, d_ff, experts) of the layouts, per size: Llama-3-8B's MLP on GPUs;
# small enough for XLA:CPU; and for the GPU tier's test (every local operand's rows a
# multiple of 16 bytes over up to 8 devices, as the Pallas kernels' TMA copies need).
SIZES = {"llm": (8192, 4096, 14336, 8), "cpu": (64, 32, 48, 8), "test": (512, 256, 1024, 8)}


def layouts(size: str = "llm") -> list[Layout]:
  """The sharding issue's layouts on a 1-D mesh `x` (`size`: a key of SIZES)."""
  tokens, d, ff, experts = SIZES[size]
  capacity = tokens // experts * 2        # top-2 routing: each expert's share of the copies
  x = "x"
  return [
      Layout("sharded.data.M", "data parallel: x rows split, W replicated", 0, tokens, d, ff,
             P(x, None), P(None, None), None),
      Layout("sharded.column.N", "column parallel: W columns split, x replicated", 0, tokens,
             d, ff, P(None, None), P(None, x), None),
      Layout("sharded.row.K", "row parallel: K split, one all-reduce", 0, tokens, ff, d,
             P(None, x), P(x, None), None),
      Layout("sharded.row.K-scatter", "row parallel into sequence-sharded rows: K split, "
             "one reduce-scatter", 0, tokens, ff, d, P(None, x), P(x, None), P(x, None)),
      Layout("sharded.experts.B", f"{experts} experts split (batch), {capacity} tokens each",
             experts, capacity, d, ff, P(x, None, None), P(x, None, None), None),
  ]


def _normal(key, shape, dtype, spec, mesh, scale=1.0):
  """Random normal(0, scale) made in place on its shards (never gathered on one device)."""
  make = jax.jit(lambda k: (scale * jax.random.normal(k, shape, jnp.float32)).astype(dtype),
                 out_shardings=NamedSharding(mesh, spec))
  return make(key)


@jax.jit
def _rel_err(x, ref):
  x, ref = x.astype(jnp.float32), ref.astype(jnp.float32)
  return jnp.linalg.norm(x - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)


def _cannot_run_here(ctx: Context, backend: str) -> str:
  """Why `backend` is not run on this machine ('' where it is)."""
  if not ctx.on_gpu and jax.device_count() > 1 and backend not in ("xla", AUTO):
    return ("not run: the interpreters cannot run inside a partitioned program on the CPU "
            "(tests/sharding_on_8_devices.py says why)")
  return ""


# ---------------------------------------------------------------- rows

def _row(ctx: Context, timer: PipelinedWallTimer, problem: str, kind: str, backend: str,
         variant: str, mesh) -> dict:
  row = base_row(ctx, SUITE, kind, backend, variant)
  row.update(problem=problem, mesh=" x ".join(f"{n}={s}" for n, s in mesh.shape.items()),
             timer=timer.label)
  return row


class PipelinedWallTimer:
  """The wall clock over back-to-back calls: a program on several devices has no one kernel
  time, and one call's `block_until_ready` puts the host's launch of four devices' work
  (and its wait) inside every sample.

  `time(f, args, n)` launches n calls, waits once for the last (the devices run them in
  order) and gives each call the mean. In `time_paired`'s blocks (about 10 ms of calls)
  a 1 ms layout row is then timed ten calls at a time; a 25 ms step one call at a time, as
  before. The first 4 x H200 run (the sharded suite at 6b50250, 4 x H200) timed every call
  alone, and its layout rows' XLA medians moved from 0.63 to 1.08 ms within one row
  (docs/results-sharded.md); this timer has not run on a GPU yet.
  """

  label = "wallclock (back-to-back calls of a program on every device of the mesh)"
  is_device_timer = False

  def time(self, f, args, iters: int, chunk: int | None = None) -> list[float]:
    out = []
    while len(out) < iters:
      n = min(chunk or iters, iters - len(out))
      t0 = time.perf_counter()
      for _ in range(n):
        result = f(*args)
      jax.block_until_ready(result)
      out += [(time.perf_counter() - t0) * 1e3 / n] * n
    return out


def _memory_gb(b: int | None):
  return "" if b is None else b / 1e9


def _program_fields(prog: Program, ref: Program | None) -> dict:
  out = {"collectives": describe_collectives(prog.collectives),
         "collective_mb": sum(b for _, b in collective_totals(prog.collectives).values()) / 1e6,
         "mem_per_device_gb": _memory_gb(prog.memory),
         "local_problems": "; ".join(prog.local_problems),
         "custom_calls": prog.custom_calls,
         "compile_s": prog.compile_s}
  if ref is not None:
    out.update(same_collectives=int(collective_totals(prog.collectives)
                                    == collective_totals(ref.collectives)),
               xla_mem_per_device_gb=_memory_gb(ref.memory))
  return out


def run_layouts(ctx: Context, timer: PipelinedWallTimer, backends: list[str], size: str = "llm",
                only: Callable[[str], bool] = lambda name: True, hlo_dir=None) -> list[dict]:
  """Every layout, on XLA's dot and on each backend; a row each (see the module doc)."""
  devices = jax.devices()
  mesh = jax.make_mesh((len(devices),), ("x",), axis_types=(AxisType.Auto,))
  dtype = BP.dtype_of(ctx.dtype_name)
  rows = []
  for i, lay in enumerate(layouts(size)):
    if not only(lay.name):
      continue
    fields = dict(batch=lay.batch or 1, m=lay.m, k=lay.k, n=lay.n, layout="NN",
                  flops=lay.flops, problem_note=lay.what)
    ctx.log(f"[{lay.name}] {lay.what}: {lay.shapes()[0]} {lay.a_spec} @ {lay.shapes()[1]} "
            f"{lay.b_spec} on {len(devices)} devices")

    def make_args(i=i, lay=lay):
      key_a, key_b = jax.random.split(jax.random.PRNGKey(ctx.seed + i))
      a_shape, b_shape = lay.shapes()
      return (_normal(key_a, a_shape, dtype, lay.a_spec, mesh),
              _normal(key_b, b_shape, dtype, lay.b_spec, mesh, scale=1 / math.sqrt(lay.k)))
    out_sh = None if lay.out_spec is None else NamedSharding(mesh, lay.out_spec)
    rows += _rows_against_xla(ctx, timer, mesh, _candidates(backends, lambda mm: mm),
                              lay.name, fields, jnp.matmul, make_args, out_sh, hlo_dir)
  return rows


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One program a row times against XLA's: `fn` on the placed inputs.

  checked: its results must match XLA's (False: it computes something else on purpose,
    e.g. the local GEMMs alone, the compute floor; it is timed only).
  own_out_shardings: compiled without the problem's output shardings (the floor's results
    are not the problem's); `compiler_options`: XLA's flags for it alone.
  """

  backend: str
  variant: str
  fn: Callable
  checked: bool = True
  own_out_shardings: bool = False
  compiler_options: dict | None = None


def _candidates(backends: list[str], program: Callable[[Callable], Callable],
                overlaps: tuple = (None,)) -> list[Candidate]:
  """Each backend's program (`program(matmul)`), once per `overlap=` value in `overlaps`
  (None: the user's default call, named "default" for auto)."""
  out = []
  for backend in backends:
    for overlap in overlaps:
      name = "default" if backend == AUTO else "(default)"
      out.append(Candidate(backend, name if overlap is None else f"overlap={overlap}",
                           program(_dots(backend, overlap)[0])))
  return out


def _rows_against_xla(ctx: Context, timer: PipelinedWallTimer, mesh,
                      candidates: list[Candidate], problem: str, fields: dict,
                      reference: Callable, make_args: Callable, out_shardings,
                      hlo_dir=None) -> list[dict]:
  """One problem's rows: XLA's program (`reference`, jnp / lax) and each candidate's,
  compiled for the same placed inputs (`make_args()`) and output shardings, checked
  against XLA's results (every output: the relative Frobenius error against the dtype's
  tolerance) and timed interleaved with it. XLA's row comes last."""
  tol = TOLERANCE[ctx.dtype_name]
  ref_row = _row(ctx, timer, problem, "sharded_gemm", REF, REF_VARIANT, mesh)
  ref_row.update(fields)
  if ctx.out_of_time():
    ref_row.update(status=STATUS_SKIPPED,
                   note=f"not run: --time-budget {ctx.time_budget_s:g} s spent")
    ctx.emit(ref_row)
    return [ref_row]
  args = make_args()
  rows, ref_times = [], []
  with jax.set_mesh(mesh):
    ref = compile_program(reference, args, out_shardings, _hlo_file(hlo_dir, problem, REF))
    want = jax.tree.leaves(ref.compiled(*args))
    ref_row.update(status=STATUS_OK, **_program_fields(ref, None))
    for cand in candidates:
      backend = cand.backend
      row = _row(ctx, timer, problem, "sharded_gemm", backend, cand.variant, mesh)
      row.update(fields)
      if excluded(ctx.exclude, backend, row["variant"], problem) or _cannot_run_here(
          ctx, backend):
        row.update(status=STATUS_SKIPPED, note=_cannot_run_here(ctx, backend) or "--exclude")
      else:
        try:
          prog = compile_program(cand.fn, args,
                                 None if cand.own_out_shardings else out_shardings,
                                 _hlo_file(hlo_dir, problem, f"{backend}.{cand.variant}"),
                                 cand.compiler_options)
          got = jax.tree.leaves(prog.compiled(*args))
          err = (max(float(_rel_err(g, w)) for g, w in zip(got, want)) if cand.checked
                 else 0.0)
          what = "rel_err" if len(got) == 1 else f"max rel_err of {len(got)} results"
          row.update(_program_fields(prog, ref), tolerance=tol,
                     note=f"{what} {err:.2e}" if cand.checked else "not compared (computes "
                     "the local GEMMs alone)")
          if len(got) > 1 and cand.checked:
            row["grad_rel_err"] = err
          if not err <= tol:
            row.update(status=STATUS_FAIL, error=f"relative error {err:.3e} > {tol:g}")
          else:
            row.update(_timed(timer, prog, ref, args, ctx.iters, fields["flops"], ref_times))
        except Exception as e:  # noqa: BLE001 (one backend's failure is a row, not the end)
          row.update(status=STATUS_ERROR, error=short_error(e))
      ctx.log(f"  {backend:>8}: {_describe(row)}")
      ctx.emit(row)
      rows.append(row)
    if ref_times:
      ref_row.update(_time_fields(summarize(ref_times), fields["flops"]))
    ctx.log(f"  {REF:>8}: {_describe(ref_row)}")
    ctx.emit(ref_row)
  return rows + [ref_row]


# ---------------------------------------------------------------- the Megatron-SP MLP


@dataclasses.dataclass(frozen=True)
class MlpConfig:
  """The Megatron sequence-parallel MLP, gelu(x @ W1) @ W2, on a 1-D mesh `tp` of every
  device (`MLP_SPECS`): x (tokens, d_model) split on tokens, W1 (d_model, d_ff) on its
  columns, W2 (d_ff, d_model) on its rows, the result split on tokens again."""

  name: str
  model: str
  tokens: int
  d_model: int
  d_ff: int

  def problem(self, form: str) -> str:
    return f"{self.name}.{form}"

  def flops(self, form: str) -> int:
    """Two GEMMs forward; with the backward, each GEMM's two gradients besides."""
    return (3 if form == MLP_TRAINING else 1) * 2 * 2 * self.tokens * self.d_model * self.d_ff


# Issue 44 measured the 70B MLP's forward on 4 x H100 at c3e0863: XLA 3.35 ms, jaxgemm
# 4.57 ms (the partitioning rule gathered W1, 470 MB, where XLA gathers x, 128 MB).
MLPS = {
    "llm": [MlpConfig("sharded.mlp-sp.llama3-8b", "Llama-3-8B", 8192, 4096, 14336),
            MlpConfig("sharded.mlp-sp.llama3-70b", "Llama-3-70B", 8192, 8192, 28672)],
    # The same proportions (W1 3.5 times x), small enough for XLA:CPU on 8 devices.
    "cpu": [MlpConfig("sharded.mlp-sp.llama3-8b", "Llama-3-8B (tiny)", 64, 32, 112),
            MlpConfig("sharded.mlp-sp.llama3-70b", "Llama-3-70B (tiny)", 64, 64, 224)],
    "test": [MlpConfig("sharded.mlp-sp.llama3-8b", "Llama-3-8B (test)", 512, 256, 896),
             MlpConfig("sharded.mlp-sp.llama3-70b", "Llama-3-70B (test)", 512, 512, 1792)],
}
MLP_SPECS = dict(x=P("tp", None), w1=P(None, "tp"), w2=P("tp", None), out=P("tp", None))
MLP_FORWARD, MLP_TRAINING = "fwd", "fwd+bwd"


def mlp_names(size: str) -> list[str]:
  """The MLP rows' problem names at `size`."""
  return [cfg.problem(form) for cfg in MLPS[size] for form in (MLP_FORWARD, MLP_TRAINING)]


def mlp_program(matmul, form: str) -> Callable:
  """The MLP with `matmul`: the forward (x, W1, W2) -> y, or forward and backward
  (x, W1, W2, dy) -> (y, dx, dW1, dW2) (`jax.vjp` with the cotangent dy)."""
  forward = lambda x, w1, w2: matmul(jax.nn.gelu(matmul(x, w1)), w2)
  if form == MLP_FORWARD:
    return forward

  def training(x, w1, w2, dy):
    y, vjp = jax.vjp(forward, x, w1, w2)
    return (y, *vjp(dy))
  return training


def run_mlps(ctx: Context, timer: PipelinedWallTimer, backends: list[str], size: str = "llm",
             only: Callable[[str], bool] = lambda name: True, hlo_dir=None) -> list[dict]:
  """The Megatron-SP MLP at each model's sizes, forward and forward + backward, on
  `jaxgemm.matmul` (each backend) against jnp.matmul's program; a row each."""
  devices = jax.devices()
  mesh = jax.make_mesh((len(devices),), ("tp",), axis_types=(AxisType.Auto,))
  dtype = BP.dtype_of(ctx.dtype_name)
  sh = {name: NamedSharding(mesh, spec) for name, spec in MLP_SPECS.items()}
  rows = []
  for i, cfg in enumerate(MLPS[size]):
    for form in (MLP_FORWARD, MLP_TRAINING):
      problem = cfg.problem(form)
      if not only(problem):
        continue
      what = (f"Megatron sequence-parallel MLP gelu(x @ W1) @ W2, {form}, {cfg.model}: "
              f"x ({cfg.tokens}, {cfg.d_model}) on tokens, W1 ({cfg.d_model}, {cfg.d_ff}) on "
              f"columns, W2 on rows, y on tokens, over tp={len(devices)}")
      ctx.log(f"[{problem}] {what}")
      fields = dict(batch=1, m=cfg.tokens, k=cfg.d_model, n=cfg.d_ff, layout="NN",
                    flops=cfg.flops(form), problem_note=what)

      def make_args(i=i, cfg=cfg, form=form):
        keys = jax.random.split(jax.random.PRNGKey(ctx.seed + 100 + i), 4)
        args = (_normal(keys[0], (cfg.tokens, cfg.d_model), dtype, MLP_SPECS["x"], mesh),
                _normal(keys[1], (cfg.d_model, cfg.d_ff), dtype, MLP_SPECS["w1"], mesh,
                        scale=1 / math.sqrt(cfg.d_model)),
                _normal(keys[2], (cfg.d_ff, cfg.d_model), dtype, MLP_SPECS["w2"], mesh,
                        scale=1 / math.sqrt(cfg.d_ff)))
        if form == MLP_TRAINING:
          args += (_normal(keys[3], (cfg.tokens, cfg.d_model), dtype, MLP_SPECS["out"], mesh),)
        return args
      out_sh = (sh["out"] if form == MLP_FORWARD
                else (sh["out"], sh["x"], sh["w1"], sh["w2"]))
      candidates = _candidates(backends, lambda mm, form=form: mlp_program(mm, form),
                               overlaps=MLP_OVERLAPS)
      if ctx.on_gpu:
        candidates.append(Candidate("xla", "windowed-einsum", mlp_program(jnp.matmul, form),
                                    compiler_options=XLA_WINDOWED_EINSUM))
      candidates.append(Candidate("xla", FLOOR, floor_program(form, mesh), checked=False,
                                  own_out_shardings=True))
      rows += _rows_against_xla(ctx, timer, mesh, candidates, problem, fields,
                                mlp_program(jnp.matmul, form), make_args, out_sh, hlo_dir)
  return rows


# Issue 46: each backend's MLP rows run the user's default call (overlap=None, which is
# no ring for now: jaxgemm.collective_matmul says why) and the rings (overlap=True).
MLP_OVERLAPS = (None, True)
# XLA's own collective matmul (issue 46 measured it at 0.68x on 4 x H100): its windowed
# einsum, for every size, on several streams.
XLA_WINDOWED_EINSUM = {"xla_gpu_threshold_for_windowed_einsum_mib": 0,
                       "xla_gpu_multi_streamed_windowed_einsum": True}
FLOOR = "local GEMMs (floor)"


def floor_program(form: str, mesh) -> Callable:
  """The compute floor: each device's local GEMMs of the MLP (`form`) on its x shard tiled
  to the full token count, with no collective (a shard_map). Its results are not the
  MLP's; the tiling's copy (tokens x d_model) is counted in its time."""
  tp = mesh.shape["tp"]
  tile = lambda t: jnp.concatenate([t] * tp, axis=0)

  def local(x, w1, w2, *dy):
    return mlp_program(jnp.matmul, form)(tile(x), w1, w2, *map(tile, dy))
  specs = (MLP_SPECS["x"], MLP_SPECS["w1"], MLP_SPECS["w2"])
  if form == MLP_TRAINING:
    specs += (MLP_SPECS["out"],)
    out_specs = (P("tp", None), P("tp", None), MLP_SPECS["w1"], MLP_SPECS["w2"])
  else:
    out_specs = P("tp", None)
  return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out_specs,
                       check_vma=False)


def _time_fields(ks: dict, flops: int, xs: dict | None = None) -> dict:
  """A row's time columns from `summarize` of its times (and of XLA's beside them)."""
  out = dict(status=STATUS_OK, iters=ks["n"], time_ms_median=ks["median_ms"],
             time_ms_p10=ks["p10_ms"], time_ms_p90=ks["p90_ms"], time_ms_min=ks["min_ms"],
             tflops=flops / (ks["median_ms"] * 1e-3) / 1e12)
  if xs is not None:
    out.update(xla_time_ms=xs["median_ms"], speedup_vs_xla=xs["median_ms"] / ks["median_ms"])
  return out


def _timed(timer, prog: Program, ref: Program, args, iters: int, flops: int,
           ref_times: list) -> dict:
  """`prog` timed interleaved with XLA's `ref` (`time_paired`): its time columns; XLA's
  times are added to `ref_times`, which make the XLA row's after every backend ran."""
  k_times, x_times = time_paired(timer, prog.compiled, ref.compiled, args, iters)
  ref_times += x_times
  return _time_fields(summarize(k_times), flops, summarize(x_times))


def _step_fields(fields: dict, tokens: int) -> dict:
  """A training step's time columns, with its step time and tokens per second."""
  ms = fields["time_ms_median"]
  return {**fields, "step_wall_ms": ms, "tokens_per_s": tokens / (ms * 1e-3)}


def _describe(row: dict) -> str:
  if row["status"] != STATUS_OK:
    return f"{row['status']}: {row.get('error') or row.get('note', '')}"
  parts = []
  if row.get("time_ms_median"):
    parts.append(f"{row['time_ms_median']:.3f} ms")
  if row.get("speedup_vs_xla"):
    parts.append(f"{row['speedup_vs_xla']:.3f}x XLA")
  if row.get("mem_per_device_gb") not in (None, ""):
    parts.append(f"{row['mem_per_device_gb']:.2f} GB/device")
  if "same_collectives" in row:
    parts.append("same collectives" if row["same_collectives"] else "OTHER collectives")
  parts.append(row["collectives"])
  if row.get("custom_calls"):
    parts.append(f"calls {row['custom_calls']}")
  return ", ".join(parts)


# ---------------------------------------------------------------- the training step

@dataclasses.dataclass(frozen=True)
class StepConfig:
  """A stack of Megatron-style transformer blocks (see the module doc)."""

  batch: int
  seq: int
  d_model: int
  heads: int
  d_ff: int
  layers: int
  steps: int
  lr: float = 3e-4
  model_parallel: int = 2     # the `model` axis; `data` takes the other devices

  @property
  def head_dim(self) -> int:
    return self.d_model // self.heads

  def mesh_shape(self, devices: int) -> tuple[int, int]:
    model = math.gcd(self.model_parallel, devices)
    return devices // model, model

  @property
  def flops(self) -> int:
    """GEMM FLOPs of one step (forward + backward = 3x forward), attention's included."""
    tokens = self.batch * self.seq
    dense = 2 * tokens * (4 * self.d_model ** 2 + 2 * self.d_model * self.d_ff)
    attention = 2 * 2 * self.batch * self.seq ** 2 * self.d_model
    return 3 * self.layers * (dense + attention)


STEPS = {
    "llm": StepConfig(batch=8, seq=2048, d_model=4096, heads=32, d_ff=14336, layers=2, steps=20),
    "cpu": StepConfig(batch=4, seq=8, d_model=32, heads=4, d_ff=64, layers=2, steps=3, lr=1e-2),
    "test": StepConfig(batch=8, seq=128, d_model=256, heads=4, d_ff=1024, layers=2, steps=5,
                       lr=1e-3),
}

PARAM_SPECS = dict(wq=P(None, "model"), wk=P(None, "model"), wv=P(None, "model"),
                   wo=P("model", None), w1=P(None, "model"), w2=P("model", None))


def init_params(cfg: StepConfig, key, mesh) -> list[dict]:
  d, f = cfg.d_model, cfg.d_ff
  shapes = dict(wq=(d, d), wk=(d, d), wv=(d, d), wo=(d, d), w1=(d, f), w2=(f, d))
  params = []
  for layer_key in jax.random.split(key, cfg.layers):
    keys = dict(zip(shapes, jax.random.split(layer_key, len(shapes))))
    params.append({n: _normal(keys[n], s, jnp.float32, PARAM_SPECS[n], mesh,
                              scale=1 / math.sqrt(s[0])) for n, s in shapes.items()})
  return params


def _rmsnorm(x):
  x32 = x.astype(jnp.float32)
  return (x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def block(p: dict, h, cfg: StepConfig, matmul, dot_general, dtype):
  """Pre-norm causal attention and a GELU MLP, each with its residual."""
  b, s, _ = h.shape
  w = {n: v.astype(dtype) for n, v in p.items()}
  x = _rmsnorm(h)
  split = lambda t: t.reshape(b, s, cfg.heads, cfg.head_dim).transpose(0, 2, 1, 3)
  q, k, v = (split(matmul(x, w[n])) for n in ("wq", "wk", "wv"))
  scores = dot_general(q, k, (((3,), (3,)), ((0, 1), (0, 1)))).astype(jnp.float32)
  causal = jnp.tril(jnp.ones((s, s), bool))
  scores = jnp.where(causal, scores / math.sqrt(cfg.head_dim), -1e30)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  heads = dot_general(probs, v, (((3,), (2,)), ((0, 1), (0, 1))))
  h = h + matmul(heads.transpose(0, 2, 1, 3).reshape(b, s, cfg.d_model), w["wo"])
  return h + matmul(jax.nn.gelu(matmul(_rmsnorm(h), w["w1"])), w["w2"])


def make_step(cfg: StepConfig, matmul, dot_general, dtype):
  def loss_fn(params, x, target):
    h = x.astype(dtype)
    for p in params:
      h = block(p, h, cfg, matmul, dot_general, dtype)
    return jnp.mean(jnp.square(_rmsnorm(h).astype(jnp.float32) - target))

  def step(params, opt, x, target):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, target)
    params, opt = T.adam_update(params, grads, opt, cfg.lr)
    return params, opt, loss

  return step


def _dots(backend: str | None, overlap: bool | None = None):
  """(matmul, dot_general): jaxgemm's on `backend` (`auto`: no backend named, as a user
  calls it) with `overlap=` (None: not passed), or jnp's / lax's for None."""
  if backend is None:
    return jnp.matmul, lax.dot_general
  kw = {} if backend == AUTO else {"backend": backend}
  if overlap is not None:
    kw["overlap"] = overlap
  return (lambda a, b: jaxgemm.matmul(a, b, **kw),
          lambda a, b, dims: jaxgemm.dot_general(a, b, dims, **kw))


def run_step(ctx: Context, timer: PipelinedWallTimer, backends: list[str], cfg: StepConfig,
             hlo_dir=None) -> list[dict]:
  """The training step on XLA's dot and on each backend (rows `sharded_step`)."""
  devices = jax.device_count()
  data, model = cfg.mesh_shape(devices)
  mesh = jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  dtype = BP.dtype_of(ctx.dtype_name)
  tol = T.TRAJECTORY_TOL[ctx.dtype_name]
  tokens = cfg.batch * cfg.seq
  describe = (f"{cfg.layers} Megatron blocks, d_model {cfg.d_model}, {cfg.heads} heads, d_ff "
              f"{cfg.d_ff}, batch {cfg.batch} x seq {cfg.seq}, Adam, {cfg.steps} steps, "
              f"mesh data {data} x model {model}")
  ctx.log(f"[{STEP_NAME}] {describe}")
  kp, kx, kt = jax.random.split(jax.random.PRNGKey(ctx.seed), 3)
  with jax.set_mesh(mesh):
    params = init_params(cfg, kp, mesh)
    act = P("data", None, None)
    x = _normal(kx, (cfg.batch, cfg.seq, cfg.d_model), jnp.float32, act, mesh)
    target = _normal(kt, (cfg.batch, cfg.seq, cfg.d_model), jnp.float32, act, mesh)
    opt = T.adam_init(params)
    args = (params, opt, x, target)

    def train(prog: Program) -> list[float]:
      p, o, losses = params, opt, []
      for _ in range(cfg.steps):
        p, o, loss = prog.compiled(p, o, x, target)
        losses.append(float(loss))
      return losses

    def base(backend, variant):
      row = _row(ctx, timer, STEP_NAME, "sharded_step", backend, variant, mesh)
      row.update(flops=cfg.flops, tokens_per_step=tokens, steps=cfg.steps,
                 problem_note=describe)
      return row

    ref_row = base(REF, "jnp.matmul")
    ref = compile_program(make_step(cfg, *_dots(None), dtype), args,
                          hlo_file=_hlo_file(hlo_dir, STEP_NAME, REF))
    ref_losses = train(ref)
    ref_row.update(status=STATUS_OK, loss_first=ref_losses[0], loss_last=ref_losses[-1],
                   **_program_fields(ref, None))
    ref_times, rows = [], []
    for backend in backends:
      row = base(backend, "default" if backend == AUTO else "(default)")
      if _cannot_run_here(ctx, backend):
        row.update(status=STATUS_SKIPPED, note=_cannot_run_here(ctx, backend))
        ctx.emit(row)
        rows.append(row)
        continue
      try:
        prog = compile_program(make_step(cfg, *_dots(backend), dtype), args,
                               hlo_file=_hlo_file(hlo_dir, STEP_NAME, backend))
        losses = train(prog)
        rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)]
        row.update(_program_fields(prog, ref), loss_first=losses[0], loss_last=losses[-1],
                   loss_max_rel_diff=max(rel), loss_last_rel_diff=rel[-1],
                   loss0_rel_diff=rel[0], tolerance=tol, agree=int(max(rel) <= tol),
                   note="losses " + " ".join(f"{v:.4g}" for v in losses))
        if not max(rel) <= tol:
          row.update(status=STATUS_FAIL, error=f"loss differs from XLA's by {max(rel):.3e} "
                                               f"> {tol:g} (relative)")
        else:
          row.update(_step_fields(_timed(timer, prog, ref, args, ctx.iters, cfg.flops,
                                         ref_times), tokens))
      except Exception as e:  # noqa: BLE001
        row.update(status=STATUS_ERROR, error=short_error(e))
      ctx.log(f"  {backend:>8}: {_describe(row)}")
      ctx.emit(row)
      rows.append(row)
    if ref_times:
      ref_row.update(_step_fields(_time_fields(summarize(ref_times), cfg.flops), tokens))
    ref_row["note"] = "losses " + " ".join(f"{v:.4g}" for v in ref_losses)
    ctx.log(f"  {REF:>8}: {_describe(ref_row)}")
    ctx.emit(ref_row)
    rows.append(ref_row)
  return rows


def run_sharded_suite(ctx: Context, backends: list[str], *, size: str | None = None,
                      only: str = "", steps: int | None = None, hlo_dir=None) -> list[dict]:
  """The training step, then the layouts, then the Megatron-SP MLP's rows (under a time
  budget, as many as it leaves time for).

  size: a key of SIZES / STEPS (default: "llm" on a GPU, "cpu" elsewhere); `only`:
  comma-separated globs of problem names (the layouts' and `sharded.step`); `hlo_dir`:
  where each compiled program's collectives are written, one file per row.
  """
  import fnmatch  # noqa: PLC0415
  globs = [g.strip() for g in only.split(",") if g.strip()]
  wanted = lambda name: not globs or any(fnmatch.fnmatch(name, g) for g in globs)
  size = size or ("llm" if ctx.on_gpu else "cpu")
  cfg = dataclasses.replace(STEPS[size], **({"steps": steps} if steps else {}))
  timer = PipelinedWallTimer()
  rows = run_step(ctx, timer, backends, cfg, hlo_dir) if wanted(STEP_NAME) else []
  rows += run_layouts(ctx, timer, backends, size, wanted, hlo_dir)
  return rows + run_mlps(ctx, timer, backends, size, wanted, hlo_dir)


def run_suite(ctx: Context, suite: str, probs, backends: list[str], variants_policy,
              options: SuiteOptions) -> list[dict]:
  """The sharded suite (bench/ops/sharded.py): `run_sharded_suite` at the CPU's sizes with
  --quick, its collectives' HLO lines in the run's `collectives/` folder."""
  return run_sharded_suite(ctx, backends, size="cpu" if options.quick else None,
                           only=",".join(options.only), steps=options.training_steps,
                           hlo_dir=None if options.out_dir is None
                           else options.out_dir / "collectives")
