"""`jaxgemm.accelerate(fn)`: an existing model's GEMMs on jaxgemm, with no rewrite of the model.

(The module is `gemm_rewrite`, not `accelerate`: the package exports the function under
that name, which would hide a module of the same name.)

`accelerate` traces `fn` to its program (a jaxpr, as `jax.jit` does) and runs that
program again with every `lax.dot_general` that jaxgemm's kernels take replaced by
`jaxgemm.dot_general` (or, with `fp8=`, `jaxgemm.matmul(x, w, fp8=...)`), and every
`lax.ragged_dot_general` by jaxgemm's grouped GEMM; the other operations are bound as
they were. The rewrite happens on the program before any differentiation of the
accelerated function, so `jax.grad(accelerate(f))` differentiates through jaxgemm's
own VJPs (the backward GEMMs on jaxgemm too, FP8 ones under the recipe), and
`accelerate(jax.grad(f))` finds the backward's GEMMs as ordinary dots in the traced
gradient.

What `fn`'s program reaches GEMMs through: `@`, `jnp.dot`, `jnp.matmul`, `jnp.einsum`
and flax's layers all bind `dot_general`; `lax.ragged_dot` binds `ragged_dot_general`.
Inside `jax.jit`, `jax.checkpoint`, `lax.scan`, `lax.while_loop` and `lax.cond`, the
sub-programs are rewritten too and the same higher-order primitive is bound again
with them (the checkpoint's policy and CSE setting kept). Left as written, and
reported so by `explain()`:

* the bodies of `jax.custom_jvp` / `jax.custom_vjp` functions: a user's derivative
  rule must keep matching its primal (`jax.nn.relu` and friends are custom_jvp, but
  contain no GEMM);
* `shard_map` bodies: they run per device with mesh axes bound, which this rewrite
  does not set up (call jaxgemm inside the shard_map body instead);
* any other primitive that carries a sub-program.

Layering: this sits at the router's level (it calls `jaxgemm.ops.router` and the ops'
public functions); nothing under `jaxgemm/ops` imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util
from jax.extend import core as jcore

try:   # source lines and name scopes for explain() and profiles: labels only
  from jax.extend import source_info_util
except ImportError:   # pragma: no cover -- a jax without it
  source_info_util = None

from jaxgemm import dispatch, gemm_fusion, registry
from jaxgemm.ops import router
from jaxgemm.ops.glu import api as glu_api
from jaxgemm.ops.matmul import api as matmul_api
from jaxgemm.ops.ragged_dot import api as ragged_dot_api
from jaxgemm.ops.scaled_matmul.problem import OUT_DTYPES as FP8_OUT_DTYPES
from jaxgemm.ops.scaled_matmul.training import Fp8Recipe

__all__ = ["Gemm", "Report", "accelerate", "default_fp8_filter"]

# Primitives by name: the jit and checkpoint primitives have been renamed across jax
# versions ("pjit" -> "jit", "checkpoint" -> "remat2"), so both names are listed, and
# the checkpoint's as this jax names it. lax.ragged_dot binds ragged_dot_general.
_DOT = "dot_general"
_RAGGED = "ragged_dot_general"
# Higher-order primitives whose sub-programs are rewritten and bound again: each keeps
# its own params (a checkpoint's policy, a scan's length), only its sub-programs change.
_REWRITTEN_INSIDE = frozenset({"jit", "pjit", "closed_call", "scan", "while", "cond",
                               "checkpoint", "remat2",
                               getattr(getattr(jcore.primitives, "remat_p", None), "name",
                                       "remat2")})
# A user's derivative (or transpose) rule stays matched to the body it was written for.
_CUSTOM_RULES = frozenset({"custom_jvp_call", "custom_jvp_call_jaxpr", "custom_vjp_call",
                           "custom_vjp_call_jaxpr", "linear_call"})
_SHARD_MAP = frozenset({"shard_map"})

LEFT = "left on XLA"
REWRITE_INSIDE = "rewrite inside"   # the plan's action for a jit, scan, ... with a GEMM inside
# The plan's action for an equation a fused op replaces (its result is the fused op's).
FUSED_AWAY = "fused away"


@dataclasses.dataclass(frozen=True)
class _Fused:
  """The plan's action for the equation whose result a fused op computes."""

  fusion: gemm_fusion.Fusion
  fp8: bool                # the GEMM in FP8 (epilogues only)
  out_dtype: Any
  precision: Any
# The default filter's floor on M*N*K (multiply-adds). FP8 quantizes each operand on the
# fly (amax, scale, cast: memory-bound passes over X, W and, in the backward, dY) to win
# back at most 2x on the tensor cores; below ~1G multiply-adds (a few microseconds of
# bf16 on an H100) those passes cost about what the GEMM does. The smallest FP8 rows
# measured (docs/results-fp8.md) are 128x4096x14336 and up; this floor is below them and
# is the models suite's to tune.
FP8_MIN_MULTIPLY_ADDS = 2**30
# The recipes' scale blocks are 128 wide ("block": 1x128 and 128x128), and so are the
# FP8 kernels' K and N tiles: other K and N are padded or refused.
FP8_ALIGN = 128


@dataclasses.dataclass(frozen=True)
class Gemm:
  """One GEMM found in `fn`'s program, and what `accelerate` made of it.

  Attributes:
    where: its place in the program: equation indices, and the higher-order
      primitives (and which of their sub-programs) it sits in, e.g.
      "scan (eqn 7)/eqn 0" or "cond (eqn 4)/branches[1]/eqn 2".
    source: the user's line that bound it ("model.py:12 (mlp)"), when jax kept it.
    primitive: "dot_general" or "ragged_dot_general".
    lhs_shape, rhs_shape, out_shape, lhs_dtype, rhs_dtype, out_dtype: as fn's program
      has them (per example under jax.vmap).
    batch, m, n, k: the sizes of the product: batch dimensions, lhs's free dimensions
      (the rows; all of lhs's rows for a grouped GEMM), rhs's free ones, the contracted.
    groups: a grouped GEMM's number of groups (None for dot_general).
    became: "jaxgemm.dot_general (backend='auto')", "jaxgemm.matmul fp8=block
      (backend='auto')", "jaxgemm.ragged_dot_general (...)", "jaxgemm.ragged_dot fp8=...",
      or "left on XLA".
    why: why it was left on XLA (or, with fp8=, why it was not put in FP8); "" otherwise.
  """

  where: str
  source: str | None
  primitive: str
  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  lhs_dtype: str
  rhs_dtype: str
  out_dtype: str
  batch: int
  m: int
  n: int
  k: int
  groups: int | None = None
  became: str = ""
  why: str = ""

  @property
  def on_jaxgemm(self) -> bool:
    return self.became != LEFT

  @property
  def fp8(self) -> bool:
    return " fp8=" in self.became

  def signature(self) -> str:
    """'bfloat16[8,256] x bfloat16[256,512] -> bfloat16[8,512]'."""
    def one(dtype, shape):
      return f"{dtype}[{','.join(map(str, shape))}]"
    return (f"{one(self.lhs_dtype, self.lhs_shape)} x {one(self.rhs_dtype, self.rhs_shape)} "
            f"-> {one(self.out_dtype, self.out_shape)}")


class Report(tuple):
  """`explain()`'s answer: the GEMMs found (`Gemm` entries, in program order), printed as a
  table by `str(report)`."""

  header: str = ""

  def __new__(cls, entries, header=""):
    report = super().__new__(cls, entries)
    report.header = header
    return report

  def __str__(self):
    on = sum(g.on_jaxgemm for g in self)
    fp8 = sum(g.fp8 for g in self)
    lines = [f"{self.header}: {len(self)} GEMM(s) found, {on} on jaxgemm"
             f"{f' ({fp8} in FP8)' if fp8 else ''}, {len(self) - on} left on XLA"]
    rows = [("#", "where", "source", "GEMM", "became", "why")]
    rows += [(str(i), g.where, g.source or "", g.signature(), g.became, g.why)
             for i, g in enumerate(self)]
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r[:5], widths)) + "  " + r[5]
              for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def default_fp8_filter(gemm: Gemm) -> bool:
  """The GEMMs `fp8=` puts in FP8 when no `fp8_filter` is given: floating, K and N
  multiples of 128 (the recipes' scale blocks and the FP8 kernels' tiles), and at least
  2**30 multiply-adds (M*N*K), below which quantizing on the fly costs what FP8 saves
  (`FP8_MIN_MULTIPLY_ADDS` has the reasoning).

  >>> g = Gemm("eqn 0", None, "dot_general", (8192, 4096), (4096, 4096), (8192, 4096),
  ...          "bfloat16", "bfloat16", "bfloat16", batch=1, m=8192, n=4096, k=4096)
  >>> default_fp8_filter(g), default_fp8_filter(dataclasses.replace(g, m=8))
  (True, False)
  """
  floating = all(jnp.issubdtype(np.dtype(d), jnp.floating)
                 for d in (gemm.lhs_dtype, gemm.rhs_dtype))
  return (floating and gemm.k % FP8_ALIGN == 0 and gemm.n % FP8_ALIGN == 0
          and gemm.m * gemm.n * gemm.k >= FP8_MIN_MULTIPLY_ADDS)


@dataclasses.dataclass(frozen=True)
class _Options:
  backend: str
  fp8: Fp8Recipe | None
  fp8_name: str            # how the report names the recipe: "block", "tensor" or its repr
  fp8_filter: Callable[[Gemm], bool]
  fuse: bool


# ------------------------------------------------------------------ deciding


def _source(eqn) -> str | None:
  try:
    text = source_info_util.summarize(eqn.source_info)
  except Exception:   # noqa: BLE001 -- only a label; jax's internals may change
    return None   # (source_info_util None included)
  path, _, rest = text.partition(":")
  return os.path.basename(path) + (":" + rest if rest else "")


def _describe(eqn, where: str) -> Gemm:
  """The Gemm entry of a dot_general or ragged_dot_general equation, undecided."""
  lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
  out = eqn.outvars[0].aval
  groups = None
  if eqn.primitive.name == _DOT:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  else:
    numbers = eqn.params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = numbers.dot_dimension_numbers
    group_dims = tuple(numbers.rhs_group_dimensions)
    rc, rb = tuple(rc), (*rb, *group_dims)   # the group dimension is not one of rhs's free ones
    groups = eqn.invars[2].aval.shape[-1] if eqn.invars[2].aval.ndim else 0
  def size(shape, dims):
    return math.prod(shape[d] for d in dims)

  def free(shape, dims):
    return [d for d in range(len(shape)) if d not in dims]

  return Gemm(where=where, source=_source(eqn), primitive=eqn.primitive.name,
              lhs_shape=tuple(lhs.shape), rhs_shape=tuple(rhs.shape),
              out_shape=tuple(out.shape), lhs_dtype=np.dtype(lhs.dtype).name,
              rhs_dtype=np.dtype(rhs.dtype).name, out_dtype=np.dtype(out.dtype).name,
              batch=size(lhs.shape, lb), m=size(lhs.shape, free(lhs.shape, (*lc, *lb))),
              n=size(rhs.shape, free(rhs.shape, (*rc, *rb))), k=size(lhs.shape, lc),
              groups=groups)


def _fp8_form_why_not(eqn, options: _Options) -> str | None:
  """None where the GEMM has the FP8 training path's form, else why it has not."""
  lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
  out = eqn.outvars[0].aval
  params = eqn.params
  if eqn.primitive.name == _DOT:
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    if lb or rb or rhs.ndim != 2 or tuple(rc) != (0,) or tuple(lc) != (lhs.ndim - 1,):
      return "not of the FP8 path's form x(..., K) @ w(K, N)"
    backend_op = "scaled_matmul"
  else:
    if (params["ragged_dot_dimension_numbers"] != ragged_dot_api.RAGGED_DOT_NUMBERS
        or lhs.ndim != 2 or rhs.ndim != 3 or eqn.invars[2].aval.ndim != 1):
      return "not of the FP8 grouped path's form ragged_dot(x(M, K), w(G, K, N))"
    backend_op = "scaled_ragged_dot"
  for name, dtype in (("lhs", lhs.dtype), ("rhs", rhs.dtype)):
    if not jnp.issubdtype(dtype, jnp.floating) or np.dtype(dtype).itemsize not in (2, 4):
      return f"the FP8 path quantizes bfloat16, float16 or float32; {name} is {dtype}"
  if np.dtype(out.dtype) not in FP8_OUT_DTYPES:
    return f"the FP8 path returns {[d.name for d in FP8_OUT_DTYPES]}; the result is {out.dtype}"
  if params.get("precision") is not None:
    return f"precision={params['precision']} asks for more than FP8"
  if options.backend != dispatch.AUTO:
    try:
      dispatch.validate(backend_op, options.backend)
    except ValueError as e:
      return f"no FP8 kernels of backend={options.backend!r}: {e}"
  return None


def _decide(eqn, where: str, options: _Options) -> tuple[Gemm, str]:
  """(the report's entry, the action: "dot", "fp8_dot", "ragged", "fp8_ragged" or "lax")."""
  gemm = _describe(eqn, where)
  params, (lhs, rhs, *rest) = eqn.params, [v.aval for v in eqn.invars]
  backend = options.backend
  try:
    if eqn.primitive.name == _DOT:
      why = matmul_api.why_not_on_kernels(
          lhs, rhs, params["dimension_numbers"], params.get("precision"),
          params.get("preferred_element_type"), params.get("out_sharding"), backend=backend)
      became, action = f"jaxgemm.dot_general (backend={backend!r})", "dot"
    else:
      why = ragged_dot_api.why_not_on_kernels(
          lhs, rhs, rest[0], params["ragged_dot_dimension_numbers"], params.get("precision"),
          params.get("preferred_element_type"), backend=backend)
      for name in ("group_offset", "out_sharding"):
        if why is None and params.get(name) is not None:
          why = f"jaxgemm's grouped GEMM takes no {name} (got {name}={params[name]!r})"
      became, action = f"jaxgemm.ragged_dot_general (backend={backend!r})", "ragged"
  except (TypeError, ValueError, NotImplementedError) as e:
    why = f"jaxgemm cannot check this call: {type(e).__name__}: {e}"
  if why is not None:
    return dataclasses.replace(gemm, became=LEFT, why=why), "lax"
  gemm = dataclasses.replace(gemm, became=became)
  if options.fp8 is None:
    return gemm, action
  why_not_fp8 = _fp8_form_why_not(eqn, options)
  if why_not_fp8 is None and not options.fp8_filter(gemm):
    why_not_fp8 = (f"the default fp8_filter takes K and N multiples of {FP8_ALIGN} and "
                   f"M*N*K >= 2**{int(math.log2(FP8_MIN_MULTIPLY_ADDS))}; here M={gemm.m}, "
                   f"N={gemm.n}, K={gemm.k}"
                   if options.fp8_filter is default_fp8_filter else "fp8_filter returned False")
  if why_not_fp8 is not None:
    return dataclasses.replace(gemm, why=f"not FP8: {why_not_fp8}"), action
  op = "jaxgemm.matmul" if action == "dot" else "jaxgemm.ragged_dot"
  return (dataclasses.replace(gemm, became=f"{op} fp8={options.fp8_name} (backend={backend!r})"),
          "fp8_" + action)


def _sub_jaxprs(eqn):
  """(label, Jaxpr or ClosedJaxpr) of each sub-program in the equation's params."""
  for key, value in eqn.params.items():
    if isinstance(value, (jcore.Jaxpr, jcore.ClosedJaxpr)):
      yield key, value
    elif isinstance(value, (tuple, list)):
      for i, sub in enumerate(value):
        if isinstance(sub, (jcore.Jaxpr, jcore.ClosedJaxpr)):
          yield f"{key}[{i}]", sub


def _left_inside(name: str) -> str:
  if name in _CUSTOM_RULES:
    return (f"inside {name}: a custom derivative rule must keep matching its primal, so "
            f"its body is left as written")
  if name in _SHARD_MAP:
    return ("inside shard_map: its body runs per device with mesh axes bound, which "
            "accelerate does not rewrite (call jaxgemm inside the shard_map body)")
  return f"inside {name}, a primitive whose sub-program accelerate does not rewrite"


def _plan(jaxpr, path: str, options: _Options, entries: list, actions: dict,
          left_because: str | None = None) -> bool:
  """Walks the program once: an entry per GEMM, and an action per equation that is not
  bound as it was (a GEMM replaced: its op; a higher-order primitive with one inside:
  "rewrite inside"). GEMMs under a primitive that is not rewritten are entries with
  `left_because`. Returns whether the program has any action."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  any_action = False
  entry_of = {}   # equation index -> its GEMM's entry
  for i, eqn in enumerate(jaxpr.eqns):
    name = eqn.primitive.name
    if name in (_DOT, _RAGGED):
      if left_because is None:
        gemm, action = _decide(eqn, f"{path}eqn {i}", options)
      else:
        gemm, action = dataclasses.replace(_describe(eqn, f"{path}eqn {i}"), became=LEFT,
                                           why=left_because), "lax"
      entry_of[i] = len(entries)
      entries.append(gemm)
      if action != "lax":
        actions[id(eqn)] = action
    subs = list(_sub_jaxprs(eqn))
    inner = left_because
    if inner is None and name not in _REWRITTEN_INSIDE:
      inner = _left_inside(name)
    inside = False
    for label, sub in subs:
      sub_path = f"{path}{name} (eqn {i})/" + (f"{label}/" if len(subs) > 1 else "")
      inside |= _plan(sub, sub_path, options, entries, actions, inner)
    if inside:   # only where rewritten: else its GEMMs were planned "lax"
      actions[id(eqn)] = REWRITE_INSIDE
    any_action |= id(eqn) in actions
  if options.fuse:
    _plan_fusions(jaxpr, options, entries, actions, entry_of)
  return any_action


def _plan_fusions(jaxpr, options: _Options, entries: list, actions: dict, entry_of: dict):
  """fuse=True: the epilogues and GLUs of this program level (`gemm_fusion.find`) become
  one fused op each, at the equation of their result; FP8 GEMMs take epilogues only
  (jaxgemm.matmul(fp8=) runs them after the GEMM; there is no FP8 GLU)."""
  eqns = jaxpr.eqns
  action_of = lambda i: actions.get(id(eqns[i]))
  eligible = {i for i in entry_of if action_of(i) in ("dot", "fp8_dot")}
  glu_ok = {i for i in eligible if action_of(i) == "dot"}
  for fusion in gemm_fusion.find(jaxpr, eligible, glu=bool(glu_ok)):
    if fusion.kind == gemm_fusion.GLU and not set(fusion.dots) <= glu_ok:
      continue
    dot = eqns[fusion.dots[0]]
    fp8 = action_of(fusion.dots[0]) == "fp8_dot"
    for i in fusion.covered:
      actions[id(eqns[i])] = FUSED_AWAY
    actions[id(eqns[fusion.result])] = _Fused(fusion, fp8, dot.outvars[0].aval.dtype,
                                              dot.params.get("precision"))
    became = (f"{fusion.describe()}{f' fp8={options.fp8_name}' if fp8 else ''} "
              f"(backend={options.backend!r})")
    for i in fusion.dots:
      entries[entry_of[i]] = dataclasses.replace(entries[entry_of[i]], became=became)


# ------------------------------------------------------------------ running


def _bind(eqn, invals, params=None):
  """The equation's primitive on `invals`, as jax.core.eval_jaxpr binds it."""
  bind_params = eqn.primitive.get_bind_params(eqn.params if params is None else params)
  if isinstance(bind_params, tuple):   # older jax: (subfuns, params)
    subfuns, bind_params = bind_params
    return eqn.primitive.bind(*subfuns, *invals, **bind_params)
  return eqn.primitive.bind(*invals, **bind_params)


def _eqn_context(eqn):
  """The equation's source line and name scope (profiles keep naming the user's code),
  and its context (e.g. compute_on), as eval_jaxpr sets them."""
  stack = contextlib.ExitStack()
  try:
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    stack.enter_context(source_info_util.user_context(eqn.source_info.traceback,
                                                      name_stack=name_stack))
  except AttributeError:   # a jax without them: only labels are lost
    pass
  manager = getattr(getattr(eqn, "ctx", None), "manager", None)
  if manager is not None:
    stack.enter_context(manager)
  return stack


def _convert_constvars(jaxpr):
  # The one internal helper used: an open Jaxpr (checkpoint's) whose constants become
  # leading inputs; jax has had it since 2020.
  from jax._src.interpreters import partial_eval as pe   # noqa: PLC0415
  return pe.convert_constvars_jaxpr(jaxpr)


class _Program:
  """fn traced at one input signature: its jaxpr, output tree, plan and report."""

  def __init__(self, closed, out_tree, options: _Options):
    self.closed, self.out_tree, self.options = closed, out_tree, options
    entries, self.actions = [], {}
    _plan(closed.jaxpr, "", options, entries, self.actions)
    self.entries = tuple(entries)
    self._rewritten = {}   # id(sub-program) -> (sub-program, its rewritten ClosedJaxpr)

  def run(self, args):
    return self._eval(self.closed.jaxpr, self.closed.consts, args)

  def _eval(self, jaxpr, consts, args):
    env = {}

    def read(v):
      return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
      action = self.actions.get(id(eqn))
      if action is FUSED_AWAY:
        continue   # its value is inside a fused op's, which nothing else reads
      with _eqn_context(eqn):
        if isinstance(action, _Fused):
          env[eqn.outvars[0]] = self._fused(action, read)
          continue
        outs = self._eqn(eqn, [read(v) for v in eqn.invars])
      env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
    return [read(v) for v in jaxpr.outvars]

  def _fused(self, action: _Fused, read):
    f, backend = action.fusion, self.options.backend
    maybe = lambda v: None if v is None else read(v)
    if f.kind == gemm_fusion.GLU:
      return glu_api.glu(read(f.x), read(f.w), read(f.w_up), activation=f.activation,
                         bias_gate=maybe(f.bias), bias_up=maybe(f.bias_up),
                         precision=action.precision, preferred_element_type=action.out_dtype,
                         backend=backend)
    return router.matmul(read(f.x), read(f.w), bias=maybe(f.bias), activation=f.activation,
                         residual=maybe(f.residual),
                         fp8=self.options.fp8 if action.fp8 else None,
                         precision=None if action.fp8 else action.precision,
                         preferred_element_type=action.out_dtype, backend=backend)

  def _eqn(self, eqn, invals):
    action = self.actions.get(id(eqn))
    if action is None:
      return _bind(eqn, invals)
    if action == REWRITE_INSIDE:
      return self._higher_order(eqn, invals)
    return self._gemm(eqn, action, invals)

  def _gemm(self, eqn, action, invals):
    params, backend, fp8 = eqn.params, self.options.backend, self.options.fp8
    out_dtype = eqn.outvars[0].aval.dtype
    if action == "dot":
      return matmul_api.dot_general(
          *invals, params["dimension_numbers"], precision=params.get("precision"),
          preferred_element_type=params.get("preferred_element_type"),
          out_sharding=params.get("out_sharding"), backend=backend)
    if action == "fp8_dot":
      return router.matmul(*invals, fp8=fp8, preferred_element_type=out_dtype,
                           out_sharding=params.get("out_sharding"), backend=backend)
    if action == "ragged":
      return ragged_dot_api.ragged_dot_general(
          *invals, params["ragged_dot_dimension_numbers"], precision=params.get("precision"),
          preferred_element_type=params.get("preferred_element_type"), backend=backend)
    assert action == "fp8_ragged", action
    return router.ragged_dot(*invals, preferred_element_type=out_dtype, fp8=fp8,
                             backend=backend)

  def _rewrite(self, sub):
    """A sub-program (Jaxpr or ClosedJaxpr) rewritten, with the same input types: a
    ClosedJaxpr, traced once per program."""
    hit = self._rewritten.get(id(sub))
    if hit is None or hit[0] is not sub:
      closed = sub if isinstance(sub, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(sub, [])
      new = jax.make_jaxpr(lambda *args: self._eval(closed.jaxpr, closed.consts, args))(
          *closed.in_avals)
      hit = self._rewritten[id(sub)] = (sub, new)
    return hit[1]

  def _higher_order(self, eqn, invals):
    """The same primitive, bound with its sub-programs rewritten."""
    params = dict(eqn.params)
    for key, value in eqn.params.items():
      if isinstance(value, jcore.ClosedJaxpr):
        params[key] = self._rewrite(value)
      elif isinstance(value, (tuple, list)) and any(
          isinstance(v, jcore.ClosedJaxpr) for v in value):
        params[key] = type(value)(self._rewrite(v) if isinstance(v, jcore.ClosedJaxpr) else v
                                  for v in value)
      elif isinstance(value, jcore.Jaxpr):
        # An open sub-program (checkpoint's): constants the rewrite made become its
        # leading inputs, outside any CSE barrier.
        new = self._rewrite(value)
        params[key] = _convert_constvars(new.jaxpr) if new.consts else new.jaxpr
        invals = [*new.consts, *invals]
        cse = params.get("prevent_cse")
        if new.consts and isinstance(cse, tuple):
          params["prevent_cse"] = (False,) * len(new.consts) + cse
    return _bind(eqn, invals, params)


# ------------------------------------------------------------------ the API


def _trace_key():
  """What else jax.jit's cache keys on (x64, default precision, dtype promotion, mesh...):
  None where this jax has no such function (then nothing is cached)."""
  try:
    from jax._src.config import trace_context   # noqa: PLC0415
    key = trace_context()
    hash(key)
    return key
  except Exception:   # noqa: BLE001 -- caching is an optimization only
    return None


# Leaves of fn's arguments that become inputs of its program: arrays (ShapeDtypeStruct:
# explain() on abstract arguments). The others (Python numbers and bools, strings,
# functions) are static, as they are to fn run as it is: a flag such as
# `training=True` may steer Python control flow; each value is its own program.
_DYNAMIC = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)


def _signature(leaf, dynamic: bool):
  """A leaf's part of the program cache's key: an array's type (sharding included), a
  static value with its type (1, 1.0 and True are equal, not the same argument)."""
  if not dynamic:
    return type(leaf), leaf
  return leaf if isinstance(leaf, jax.ShapeDtypeStruct) else jax.typeof(leaf)


class _Accelerated:
  """What `accelerate` returns: fn with its GEMMs on jaxgemm, and `explain`."""

  def __init__(self, fn, options: _Options):
    functools.update_wrapper(self, fn, updated=())   # not __dict__: fn may be a Module
    self._fn, self._options = fn, options
    self._programs = {}

  def _program(self, args, kwargs):
    leaves, in_tree = tree_util.tree_flatten((args, kwargs))
    dynamic = [isinstance(x, _DYNAMIC) for x in leaves]
    dyn_leaves = [x for x, d in zip(leaves, dynamic) if d]
    key = (in_tree, tuple(map(_signature, leaves, dynamic)), _trace_key())
    try:
      program = self._programs.get(key) if key[-1] is not None else None
    except TypeError:   # an unhashable static argument: traced every call
      key, program = None, None
    if program is None:
      def flat_fn(*dyn):
        it = iter(dyn)
        a, k = tree_util.tree_unflatten(in_tree, [next(it) if d else x
                                                  for x, d in zip(leaves, dynamic)])
        return self._fn(*a, **k)
      closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*dyn_leaves)
      program = _Program(closed, tree_util.tree_structure(out_shape), self._options)
      # Kept only where its program has no constants: the arrays fn closes over are
      # those, and they change without fn's arguments changing (an nnx Module's weights,
      # tracers of an outer nnx.jit or grad, which must not leak either), so that a
      # program with them is traced again at each call.
      if key is not None and key[-1] is not None and not closed.consts:
        self._programs[key] = program
    return program, dyn_leaves

  def __call__(self, *args, **kwargs):
    program, dyn_leaves = self._program(args, kwargs)
    return tree_util.tree_unflatten(program.out_tree, program.run(dyn_leaves))

  def explain(self, *args, **kwargs) -> Report:
    """The GEMMs of fn's program for these arguments (abstract ones, e.g.
    `jax.ShapeDtypeStruct`, do as well), each with what it became and why: a `Report`,
    whose `str` is a table."""
    program, _ = self._program(args, kwargs)
    o = self._options
    name = getattr(self._fn, "__name__", type(self._fn).__name__)   # a Module: its class
    header = (f"accelerate({name}, backend={o.backend!r}"
              f"{f', fp8={o.fp8_name}' if o.fp8 is not None else ''}, fuse={o.fuse})")
    return Report(program.entries, header)

  def __repr__(self):
    return f"accelerate({self._fn!r})"


def accelerate(fn: Callable, *, backend: str = "auto", fp8=None,
               fp8_filter: Callable[[Gemm], bool] | None = None, fuse: bool = True) -> Any:
  """`fn` with every GEMM that jaxgemm can run on jaxgemm: one line to adopt jaxgemm.

  Returns a function with fn's signature and results, which traces fn (as `jax.jit`
  does, so fn must be traceable in its array arguments; the others, Python numbers and
  flags included, are static) and runs its program with each `lax.dot_general` (from `@`,
  `jnp.dot`, `jnp.matmul`, `jnp.einsum`, flax layers) as `jaxgemm.dot_general` and each
  `lax.ragged_dot` as jaxgemm's grouped GEMM, wherever jaxgemm's kernels take it; the
  rest runs as it was (the module docstring lists what is looked inside). It composes
  with jit, grad (through jaxgemm's VJPs when grad is outside: `jax.grad(accelerate(f))`;
  `accelerate(jax.grad(f))` rewrites the traced gradient's dots), vmap, checkpoint and
  scan. `.explain(*args, **kwargs)` reports each GEMM found, what it became and why.
  A call traces fn again unless fn's program for that input signature has no constants
  (then it is kept): arrays fn closes over, such as an nnx Module's weights, are read
  at every call, never kept from an earlier one. Call it under `jax.jit` (or
  `nnx.jit`): outside, the program runs op by op.

  Args:
    fn: the function, e.g. a loss or a training step; pytrees in and out, kwargs too.
    backend: "auto" or one of `jaxgemm.backends()`, for every GEMM replaced. Under
      "auto" a GEMM the kernels cannot take stays on lax; under a named backend, so
      does one that backend cannot run (explain says why).
    fp8: None, "tensor", "block" or a `jaxgemm.Fp8Recipe`: GEMMs of the form
      x(..., K) @ w(K, N) (and grouped ones ragged_dot(x(M, K), w(G, K, N))) that
      `fp8_filter` accepts run as `jaxgemm.matmul(x, w, fp8=fp8)` (`jaxgemm.ragged_dot(...,
      fp8=fp8)`): FP8 GEMMs forward and, under `jax.grad(accelerate(f))`, backward. In
      `accelerate(jax.grad(f))` the backward's GEMMs (dY @ W^T, X^T @ dY) are not of that
      form and run on jaxgemm in their own dtype.
    fp8_filter: with fp8, a function of a `Gemm` (shapes, dtypes, where it was found, and
      what it would become without FP8) returning whether it runs in FP8; it decides both
      ways, so it can force a small GEMM in. Default: `default_fp8_filter`.
    fuse: whether the patterns `jaxgemm.gemm_fusion` recognizes (x@w + b, act(x@w + b),
      act(x@w + b) + r, act(x@wg) * (x@wu)) become one fused op each
      (`jaxgemm.matmul(bias=, activation=, residual=)`, `jaxgemm.glu`); explain() names
      them. With fp8, epilogues only.

  Example:
    >>> import jax, jax.numpy as jnp, jaxgemm
    >>> def mlp(params, x):
    ...   return jax.nn.relu(x @ params["w1"]) @ params["w2"]
    >>> params = {"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 8))}
    >>> fast = jaxgemm.accelerate(mlp, backend="xla")
    >>> fast(params, jnp.ones((4, 16)))[0, 0].item()
    512.0
    >>> jax.grad(lambda p: fast(p, jnp.ones((4, 16))).sum())(params)["w1"].shape
    (16, 32)
    >>> [g.became for g in fast.explain(params, jnp.ones((4, 16)))]
    ["jaxgemm.matmul(activation='relu') (backend='xla')", "jaxgemm.dot_general (backend='xla')"]
  """
  if not callable(fn):
    raise TypeError(f"accelerate(fn): fn must be callable; got {type(fn).__name__} {fn!r}")
  if not isinstance(backend, str):
    raise TypeError(f"accelerate: backend must be a backend name, 'auto' or one of "
                    f"{list(registry.backends('matmul'))}; got backend={backend!r}")
  dispatch.validate("matmul", backend)   # ValueError naming backend= and the valid ones
  recipe = name = None
  if fp8 is not None:
    recipe = Fp8Recipe.named(fp8)   # ValueError naming fp8= and the valid ones
    name = fp8 if isinstance(fp8, str) else repr(recipe)
    if backend != dispatch.AUTO and recipe.backend not in (dispatch.AUTO, backend):
      raise ValueError(f"accelerate: backend={backend!r} and fp8's backend="
                       f"{recipe.backend!r} differ; name the backend once")
  if fp8_filter is not None:
    if fp8 is None:
      raise ValueError("accelerate: fp8_filter= chooses which GEMMs run in FP8; pass fp8= "
                       "('tensor', 'block' or a jaxgemm.Fp8Recipe) with it")
    if not callable(fp8_filter):
      raise TypeError(f"accelerate: fp8_filter must be a function of a jaxgemm.accelerate "
                      f"Gemm returning a bool; got {fp8_filter!r}")
  if not isinstance(fuse, bool):
    raise TypeError(f"accelerate: fuse must be True or False; got fuse={fuse!r}")
  options = _Options(backend, recipe, name, fp8_filter or default_fp8_filter, fuse)
  return _Accelerated(fn, options)
