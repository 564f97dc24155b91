"""The moe suites: grouped GEMMs (`jaxgemm.ragged_dot`, issue 26) on every kernel, then an
MoE training step.

Each problem (`problems.MoeProblem`: a layer's forward, dgrad or wgrad GEMM over
G experts) runs as the GEMM suites' problems do (`runner.run_problem`, with
`RAGGED_DOT` saying what differs), in one process:

1. the group sizes: a Dirichlet(2) split of the M tokens with a fixed seed
   (`jaxgemm.ops.ragged_dot.primitive.example_group_sizes`, drawn on the host's
   CPU device so every machine draws the same), or the problem's fixed sizes;
   the layer's forward and backward GEMMs share them;
2. XLA's own op, `lax.ragged_dot` (forward) or `lax.ragged_dot_general`
   (dgrad, wgrad): the reference result and time (backend `xla_dot`, as for
   the GEMM suites: "XLA's own op");
3. on a GPU, for forward problems, jax's example kernel
   `jax.experimental.pallas.ops.gpu.ragged_dot_mgpu.ragged_dot` (backend
   `jax_example`): a sweep of a few block configs (`EXAMPLE_CONFIGS`), each
   checked against XLA's result, the fastest correct one recorded (its config
   in `config`, every config's time or error in `note`); where the module is
   absent or every config fails, the row says why and the run goes on;
4. every (backend, variant) of op "ragged_dot" and the default (`auto`),
   through `jaxgemm.ragged_dot` / `jaxgemm.ragged_dot_general`: checked
   against XLA's result, then timed interleaved with it; each row also gets
   `example_time_ms` and `speedup_vs_example` (the example's median over the
   kernel's).

TFLOP/s count the real FLOPs, 2 M K N, however the tokens split. `min_bytes`
(and so `gbps` and `pct_copy_bw`, the fraction of the bandwidth roofline)
counts lhs, the weights of the experts that have tokens (`active_groups`) and
the output, each once; the roofline is the copy bandwidth measured at the
start of the run (`runner.measure_copy_bandwidth`).

The suite ends with an MoE training step (`training.run_training` on
`training.GPU_MOE_MODEL`, or the CPU's model), whose grouped GEMMs run on each
backend and whose dense layers stay on XLA's dot.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Callable

import jax
import numpy as np
from jax import lax

import jaxgemm
from jaxgemm.ops.ragged_dot.primitive import example_group_sizes

from . import problems as P
from . import runner as R
from . import training as T
from .ops.ragged_dot import EXAMPLE, EXAMPLE_VARIANT, OP, MoeProblem
from .runner import SuiteOptions

REF_VARIANT = "lax.ragged_dot_general"   # lax.ragged_dot for forward problems
EXAMPLE_MODULE = "jax.experimental.pallas.ops.gpu.ragged_dot_mgpu"
# jax's example kernel's block configs: (block_m, block_n, block_k,
# max_concurrent_steps, grid_block_n); a config whose tiles do not divide the
# problem (K by block_k, N by block_n * grid_block_n) is left out, as the
# example's own sweep (its main()) does.
EXAMPLE_CONFIGS = (
    (128, 128, 64, 4, 1),
    (128, 128, 64, 4, 4),
    (64, 128, 64, 6, 1),
    (64, 256, 64, 4, 1),
    (128, 64, 64, 6, 1),
)
EXAMPLE_FIELDS = ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n")


def group_sizes(mp: MoeProblem, seed: int) -> np.ndarray:
  """(G,) int32: the problem's fixed sizes, else a Dirichlet(2) split of its M tokens
  (`example_group_sizes`), the same for a layer's three GEMMs and on every machine."""
  if mp.group_sizes is not None:
    return np.asarray(mp.group_sizes, np.int32)
  problem = jaxgemm.RaggedDotProblem(1, mp.groups, mp.m, mp.k, mp.n, np.dtype(np.float32),
                                     np.dtype(np.float32), np.dtype(np.float32))
  try:
    cpu = jax.devices("cpu")[0]
  except RuntimeError:
    cpu = None
  with jax.default_device(cpu):
    return np.asarray(example_group_sizes(problem, jax.random.key(seed)))[0].astype(np.int32)


def ragged_problem(mp: MoeProblem, dtype_name: str) -> jaxgemm.RaggedDotProblem:
  """The canonical problem `jaxgemm.ragged_dot(_general)` makes of `mp`."""
  dt = np.dtype(P.dtype_of(dtype_name))
  prec = R.precision_of(dtype_name)
  # dgrad: dy (M, N) times W (G, K, N) transposed: a GEMM with K and N swapped.
  k, n = (mp.n, mp.k) if mp.mode == "dgrad" else (mp.k, mp.n)
  return jaxgemm.RaggedDotProblem(1, mp.groups, mp.m, k, n, dt, dt, np.dtype(np.float32),
                                  trans_rhs=mp.mode == "dgrad",
                                  ragged_contracting=mp.mode == "wgrad",
                                  precision=None if prec is None else (prec, prec))


def ref_fn(mp: MoeProblem, dtype_name: str) -> Callable:
  """XLA's own grouped GEMM: lax.ragged_dot (fwd) or lax.ragged_dot_general."""
  prec = R.precision_of(dtype_name)
  out = P.dtype_of(dtype_name)
  if mp.mode == "fwd":
    def xla_ragged_dot(lhs, rhs, gs):
      return lax.ragged_dot(lhs, rhs, gs, precision=prec, preferred_element_type=out)
    return xla_ragged_dot
  numbers = mp.dimension_numbers()

  def xla_ragged_dot_general(lhs, rhs, gs):
    return lax.ragged_dot_general(lhs, rhs, gs, numbers, precision=prec,
                                  preferred_element_type=out)
  return xla_ragged_dot_general


def kernel_fn(mp: MoeProblem, dtype_name: str, backend: str, variant: str) -> Callable:
  """jaxgemm's kernel (backend, variant) through the public API; (AUTO, AUTO_VARIANT): as
  a user calls it by default (backend="auto", no variant)."""
  prec = R.precision_of(dtype_name)
  v = None if backend == R.AUTO else variant
  if mp.mode == "fwd":
    def grouped(lhs, rhs, gs):
      return jaxgemm.ragged_dot(lhs, rhs, gs, precision=prec, backend=backend, variant=v)
    return grouped
  numbers = mp.dimension_numbers()

  def grouped_general(lhs, rhs, gs):
    return jaxgemm.ragged_dot_general(lhs, rhs, gs, numbers, precision=prec,
                                      backend=backend, variant=v)
  return grouped_general


def example_fn(config: tuple) -> Callable:
  """jax's example kernel with one block config (only the keywords its signature has)."""
  import importlib  # noqa: PLC0415
  ex = importlib.import_module(EXAMPLE_MODULE)
  params = inspect.signature(ex.ragged_dot).parameters
  kw = {f: v for f, v in zip(EXAMPLE_FIELDS, config) if f in params}

  def example(lhs, rhs, gs):
    return ex.ragged_dot(lhs, rhs, group_sizes=gs, **kw)
  return example


def example_configs(mp: MoeProblem) -> list[tuple]:
  return [c for c in EXAMPLE_CONFIGS
          if mp.k % c[2] == 0 and mp.n % (c[1] * c[4]) == 0]


def _config_label(c: tuple) -> str:
  return "bm{}.bn{}.bk{}.s{}.g{}".format(*c)


class RaggedDotMeasured(R.Measured):
  """What the moe suites measure differently from the GEMM suites (`runner.Measured`)."""

  op = OP
  arity = 3
  # XLA's lax.ragged_dot takes 10-65 ms a call on the big problems (issue 26): kernels
  # 7-100x faster are timed alone there, not paired with 20 more of its calls each.
  pair_max_ref_ms = 5.0

  def ref_variant(self, mp):
    return "lax.ragged_dot" if mp.mode == "fwd" else REF_VARIANT

  def prepare(self, ctx, mp: MoeProblem, dtype_name):
    """The problem with its group sizes drawn (`group_sizes`) and `active_groups` set."""
    sizes = group_sizes(mp, ctx.seed)
    if sizes.shape != (mp.groups,) or sizes.sum() > mp.m or (sizes < 0).any():
      raise ValueError(f"group sizes {sizes.tolist()} do not fit G={mp.groups}, M={mp.m}")
    return dataclasses.replace(mp, group_sizes=tuple(int(x) for x in sizes),
                               active_groups=int((sizes > 0).sum()))

  def ref_fn(self, mp, dtype_name):
    return ref_fn(mp, dtype_name)

  def kernel_fn(self, mp, dtype_name, backend, variant):
    return kernel_fn(mp, dtype_name, backend, variant)

  def inputs(self, mp, dtype_name, n_rot, seed):
    dt = P.dtype_of(dtype_name)
    ops = R.normal_inputs([s for _ in range(n_rot) for s in (mp.lhs_shape(), mp.rhs_shape())],
                          dt, seed)
    gs = jax.device_put(np.asarray(mp.group_sizes, np.int32))
    return [x for i in range(n_rot) for x in (ops[2 * i], ops[2 * i + 1], gs)]

  def problem(self, mp, dtype_name):
    return ragged_problem(mp, dtype_name)

  def before_kernels(self, ctx, mp, dtype_name, bufs, refs, ref_compiled, n_rot,
                     solo_ref_ms=None):
    """jax's example kernel (forward problems); each kernel row's ratio to it."""
    if mp.mode != "fwd":
      return [], None
    row = run_example(ctx, mp, dtype_name, bufs, refs, ref_compiled, n_rot, solo_ref_ms)
    ex_ms = row.get("time_ms_median") if row["status"] == R.STATUS_OK else None

    def finish(r):
      if ex_ms and r.get("status") == R.STATUS_OK:
        r.update(example_time_ms=ex_ms, speedup_vs_example=ex_ms / r["time_ms_median"])
    return [row], finish


RAGGED_DOT = RaggedDotMeasured()


def run_example(ctx, mp, dtype_name, bufs, refs, ref_compiled, n_rot, solo_ref_ms=None) -> dict:
  """jax's example kernel on a forward problem: the best of its config sweep (a row)."""
  row = R.base_row(ctx, mp.suite, "gemm", EXAMPLE, EXAMPLE_VARIANT, mp, dtype_name)
  row.update(rotate=n_rot, tolerance=R.TOLERANCE[dtype_name])
  if R.excluded(ctx.exclude, EXAMPLE, EXAMPLE_VARIANT, mp.name):
    row.update(status=R.STATUS_SKIPPED, note="excluded by --exclude")
    return row
  if not ctx.on_gpu:
    row.update(status=R.STATUS_SKIPPED, note="GPU only (a Mosaic GPU kernel); not run here")
    return row
  try:
    example_fn(EXAMPLE_CONFIGS[0])
  except Exception as e:  # noqa: BLE001 (absent in this jax, or its API moved)
    row.update(status=R.STATUS_UNSUPPORTED, note=f"{EXAMPLE_MODULE}: {R.short_error(e)}")
    return row
  configs = example_configs(mp)
  if not configs:
    row.update(status=R.STATUS_UNSUPPORTED,
               note=f"no config of {EXAMPLE_CONFIGS} divides K={mp.k}, N={mp.n}")
    return row
  tried, best = [], None
  for c in configs:
    r = dict(row, config=json.dumps(dict(zip(EXAMPLE_FIELDS, c))))
    with R.Watchdog(ctx, r, f"{EXAMPLE}/{_config_label(c)} on {mp.name}"):
      R._run_kernel(ctx, mp, dtype_name, r, lambda *_, c=c: example_fn(c), bufs, refs, n_rot,
                    ref_compiled, (EXAMPLE, _config_label(c)), RAGGED_DOT.arity, solo_ref_ms)
    if r["status"] == R.STATUS_OK:
      tried.append(f"{_config_label(c)} {r['time_ms_median']:.4g} ms")
      if best is None or r["time_ms_median"] < best["time_ms_median"]:
        best = r
    else:
      tried.append(f"{_config_label(c)} {r['status']}: {r.get('note', '')[:160]}")
  summary = f"best of {len(configs)} configs: " + "; ".join(tried) + (
      f" (each timed alone: XLA's reference takes {solo_ref_ms:.3g} ms a call)"
      if solo_ref_ms is not None else "")
  if best is None:
    row.update(status=R.STATUS_ERROR, note=summary)
    return row
  best["note"] = summary
  return best


def run_moe_suite(ctx: R.Context, suite: str, probs: list[MoeProblem], backends: list[str],
                  variants_policy, *, training_cfg=None, quick: bool = False,
                  training: bool = True) -> list[dict]:
  """The suite's grouped GEMMs, then (with `training`) its MoE training step
  (`training.run_suite_then_training`: under a time budget the problems leave
  `training.TRAINING_RESERVE_S` of it to the step)."""
  model = (training_cfg or T.moe_model(ctx.on_gpu, quick)) if training else None
  return T.run_suite_then_training(ctx, suite, probs, backends, variants_policy,
                                   ops=RAGGED_DOT, model=model, label="MoE")


def run_suite(ctx: R.Context, suite: str, probs: list[MoeProblem], backends: list[str],
              variants_policy, options: SuiteOptions) -> list[dict]:
  """A moe suite (bench/ops/ragged_dot.py): its problems, then its MoE step, which runs
  unless --only names other problems only ('*.wgrad': no step; 'moe.*': the step alone)."""
  cfg = T.model_for(T.moe_model(ctx.on_gpu, options.quick), options)
  return run_moe_suite(ctx, suite, probs, backends, variants_policy, training_cfg=cfg,
                       quick=options.quick, training=options.runs(cfg.name))
