"""Prototype for issue 24: jaxgemm's matmul_p partitions like dot_general under jit.

A record: it patches the package as it was at commit 91f1959, before the design landed in
`jaxgemm/sharding.py`; on a later checkout it would wrap the package's partitioned lowering
a second time. Run it from that commit (`git worktree add /tmp/p 91f1959`).

Run from the repository root (8 host CPU devices; backend="xla" only: see README.md):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python research/sharding/prototype.py

Part 1 is the mechanism (what `jaxgemm/sharding.py` would hold): an op declares an einsum
rule; `make_partitionable` splits its primitive into the op primitive (all rules: JVP,
transpose, batching, abstract eval) whose lowering is a `custom_partitioning` call, and a
kernel primitive `<name>_local` that the partitioner's callback binds with the LOCAL shapes,
so the kernel is chosen for the local problem. Part 2 patches matmul_p at run time (this
folder may not edit the package). Part 3 runs the checks and prints the evidence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import sys
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # GSPMD's deprecation warning, per compile
sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental.custom_partitioning import custom_partitioning  # noqa: E402
from jax.extend.core import Primitive  # noqa: E402
from jax.interpreters import ad, mlir  # noqa: E402
from jax._src import config as jax_config, core as jax_core, dispatch as jax_dispatch  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxgemm  # noqa: E402
from jaxgemm.ops.matmul import api, primitive as prim  # noqa: E402


def _internal(module, *names):
  """A jax internal without a public name (README: "jax internals"), by its 0.10.2 name."""
  for name in names:
    if hasattr(module, name):
      return getattr(module, name)
  raise ImportError(f"jax {jax.__version__}: none of {names} in {module.__name__}")


REQUIRES_DEVICES = _internal(jax_dispatch, "prim_requires_devices_during_lowering")
INSERT_PVARY = _internal(jax_core, "auto_insert_reshard", "standard_insert_pvary")
SHARDING_IN_TYPES = _internal(jax_mlir, "lower_with_sharding_in_types")

# ============================================================ part 1: the mechanism


@dataclasses.dataclass(frozen=True)
class EinsumRule:
  """Factor names per dimension of each operand and of the result, e.g. matmul's
  (("b", "m", "k"), ("b", "k", "n")) -> ("b", "m", "n"). Factors absent from the
  result are contracted: sharding one means local partial results and a reduction."""
  operands: tuple[tuple[str, ...], ...]
  result: tuple[str, ...]

  @property
  def reduction(self) -> tuple[str, ...]:
    seen = dict.fromkeys(f for dims in self.operands for f in dims)
    return tuple(f for f in seen if f not in self.result)

  def __str__(self):
    return ", ".join(" ".join(d) for d in self.operands) + " -> " + " ".join(self.result)


def _axes(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(axes):
  return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


@dataclasses.dataclass(frozen=True)
class Plan:
  """How one call runs on the mesh: operand and result specs, and the reduction."""
  operands: tuple[P, ...]
  result: P
  reduce_axes: tuple[str, ...]   # psum over these (or psum_scatter when scatter_dim is set)
  scatter_dim: int | None


def plan(rule: EinsumRule, operand_specs, result_spec=None) -> Plan:
  """Keep every operand's sharding (no gather): each factor takes the mesh axes of the
  first operand dimension that shards it; a mesh axis shards one factor only (a later,
  conflicting use is replicated). A sharded reduction factor leaves partial results:
  psum them, or psum_scatter into the result dimension `result_spec` shards on the same
  axes (the reduce-scatter a K-sharded GEMM with a sharded output needs)."""
  factor_axes: dict[str, tuple[str, ...]] = {}
  used: set[str] = set()
  for dims, spec in zip(rule.operands, operand_specs):
    for f, entry in zip(dims, tuple(spec) + (None,) * (len(dims) - len(spec))):
      axes = _axes(entry)
      if axes and f not in factor_axes and not used & set(axes):
        factor_axes[f] = axes
        used |= set(axes)
  reduce_axes = tuple(a for f in rule.reduction for a in factor_axes.get(f, ()))
  out = [factor_axes.get(f, ()) for f in rule.result]
  scatter_dim = None
  if reduce_axes and result_spec is not None:
    for d, entry in enumerate(tuple(result_spec)[:len(out)]):
      if not out[d] and _axes(entry) == reduce_axes:
        out[d], scatter_dim = reduce_axes, d
        break
  return Plan(tuple(P(*(_entry(factor_axes.get(f)) for f in dims)) for dims in rule.operands),
              P(*map(_entry, out)), reduce_axes, scatter_dim)


def _is_partly_manual(axis_ctx):
  """Inside a shard_map that is manual over some mesh axes only."""
  manual = getattr(axis_ctx, "manual_axes", None)    # SPMDAxisContext
  return manual is not None and set(manual) != set(axis_ctx.mesh.axis_names)


def _mesh_for_callbacks(axis_ctx):
  """The Mesh custom_partitioning should name shardings with, where it finds none itself.

  Its lowering takes the mesh of `with mesh:` (deprecated), else the abstract mesh jit
  found on a NamedSharding of a concrete Mesh (operands, results, constraints). Without
  one (numpy operands and a typed out_sharding, Explicit axes) its callbacks get
  GSPMDShardings, which have no spec. Give it the context mesh on the program's devices."""
  devices, mesh = getattr(axis_ctx, "device_assignment", None), jax.sharding.get_abstract_mesh()
  if getattr(axis_ctx, "abstract_mesh", 0) is None and devices and mesh.size == len(devices):
    return jax.sharding.Mesh(np.array(devices).reshape(mesh.axis_sizes), mesh.axis_names)
  return None


LOCAL_PROBLEMS: list = []   # what each kernel primitive lowered: (op name, local shapes)


def make_partitionable(prim_: Primitive, rule_of, kernel_lowerings):
  """Make `prim_` partition by `rule_of(**params) -> EinsumRule`.

  `kernel_lowerings` maps platform -> the op's kernel lowering (which chooses the kernel
  for the shapes it is given). They move to a new primitive `<name>_local`; `prim_`
  lowers to a custom_partitioning call of `<name>_local`, whose partition callback binds
  `<name>_local` on the local shards and adds the reduction the plan asks for.
  """
  local_p = Primitive(prim_.name + "_local")
  local_p.def_abstract_eval(lambda *avals, **params: prim_.abstract_eval(*avals, **params)[0])
  for platform, lowering in kernel_lowerings.items():
    def record(ctx, *args, _lowering=lowering, **params):
      LOCAL_PROBLEMS.append((prim_.name, tuple(a.shape for a in ctx.avals_in)))
      return _lowering(ctx, *args, **params)
    mlir.register_lowering(local_p, record, platform=platform)

  def local(params, *operands):
    return local_p.bind(*operands, **dict(params))

  def partition(params, mesh, arg_shapes, result_shape):
    p = plan(rule_of(**dict(params)), [x.sharding.spec for x in arg_shapes],
             result_shape.sharding.spec)

    def lower_fn(*operands):   # local shapes: a typed out_sharding (global) does not apply
      out = local_p.bind(*operands, **{**dict(params), **({"out_sharding": None}
                                                        if "out_sharding" in dict(params) else {})})
      if p.scatter_dim is not None:
        return lax.psum_scatter(out, p.reduce_axes, scatter_dimension=p.scatter_dim, tiled=True)
      return lax.psum(out, p.reduce_axes) if p.reduce_axes else out

    return (mesh, lower_fn, NamedSharding(mesh, p.result),
            tuple(NamedSharding(mesh, s) for s in p.operands))

  def infer_sharding_from_operands(params, mesh, arg_shapes, result_shape):
    p = plan(rule_of(**dict(params)), [x.sharding.spec for x in arg_shapes])
    return NamedSharding(mesh, p.result)

  def sharding_rule(params, mesh, operand_types, result_types):
    rule = rule_of(**dict(params))
    return str(rule), dict(reduction_factors=rule.reduction)

  partitioned = custom_partitioning(local, static_argnums=(0,))
  partitioned.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                            sharding_rule=sharding_rule)

  def lowering(ctx, *operands, **params):
    axis_ctx = ctx.module_context.axis_context
    if _is_partly_manual(axis_ctx):
      # Our NamedShardings lack the manual subgroup there and XLA aborts the process
      # ("Check failed: target.IsManualSubgroup() == sharding().IsManualSubgroup()"): run
      # the kernel on what the partitioner gives it (it gathers the auto axes).
      return mlir.lower_fun(local_p.bind, multiple_results=False)(ctx, *operands, **params)
    call = lambda *xs: partitioned(tuple(sorted(params.items())), *xs)
    mesh = _mesh_for_callbacks(axis_ctx)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)   # "`with mesh:` ... deprecated"
      with contextlib.nullcontext() if mesh is None else mesh:
        outs = mlir.lower_fun(call, multiple_results=False)(ctx, *operands)
    # As jax's own lowerings do: with Explicit axes, constrain the result to its type.
    return [SHARDING_IN_TYPES(ctx, out, aval) for out, aval in zip(outs, ctx.avals_out)]

  for platform in kernel_lowerings:   # replaces the kernel lowerings, now local_p's
    mlir.register_lowering(prim_, lowering, platform=platform)
  # Without this, jit lowers with no device assignment and custom_partitioning's lowering
  # fails with "AssertionError: Please file a bug" (jax's cuDNN GEMM wrapper does the same).
  REQUIRES_DEVICES.add(prim_)
  return local_p


# ============================================================ part 2: matmul_p's rule


def matmul_rule(*, trans_a, trans_b, **_) -> EinsumRule:
  a = ("b", "k", "m") if trans_a else ("b", "m", "k")
  b = ("b", "n", "k") if trans_b else ("b", "k", "n")
  return EinsumRule((a, b), ("b", "m", "n"))


MATMUL_LOCAL_P = make_partitionable(
    prim.matmul_p, matmul_rule,
    {p: functools.partial(prim._lowering, platform=p) for p in ("cpu", "cuda")})


# ------------------------------------------------------------ matmul_p's types (sharding, vma)
# What primitive.py would change so matmul_p types like dot_general: `patch_types()` applies
# it at run time, so the checks can show the behaviour before and after.

def abstract_eval(a, b, *, trans_a, trans_b, **params):
  """dot_general's abstract eval on the canonical form: carries the output sharding
  (Explicit axes) and the varying manual axes (shard_map) as jax's own dot does."""
  prim._abstract_eval(a, b, trans_a=trans_a, trans_b=trans_b, **params)   # our checks
  dims = (((1 if trans_a else 2,), (2 if trans_b else 1,)), ((0,), (0,)))
  out, _ = lax.dot_general_p.abstract_eval(
      a, b, dimension_numbers=dims, precision=None, preferred_element_type=None,
      out_sharding=params.get("out_sharding"))
  return out.update(dtype=params["out_dtype"], weak_type=False)


def bind(a, b, *, trans_a=False, trans_b=False, out_dtype, acc_dtype, precision, backend,
         variant, config, out_sharding=None):
  """primitive.bind, plus out_sharding (None: the rule's) and shard_map's varying axes:
  an invariant operand is cast to varying (pvary) first, as lax.dot_general does, and
  pvary's transpose is the psum that makes the gradient of an invariant operand invariant."""
  a, b = INSERT_PVARY(a, b)
  if out_sharding is not None:   # a type carries an AbstractMesh, as lax's canonicalize_sharding
    mesh, spec = ((jax.sharding.get_abstract_mesh(), out_sharding)
                  if isinstance(out_sharding, P) else (out_sharding.mesh, out_sharding.spec))
    out_sharding = NamedSharding(getattr(mesh, "abstract_mesh", mesh), spec)
  return prim.matmul_p.bind(a, b, trans_a=trans_a, trans_b=trans_b,
                            out_dtype=np.dtype(out_dtype), acc_dtype=np.dtype(acc_dtype),
                            precision=precision, backend=backend, variant=variant,
                            config=config, out_sharding=out_sharding)


def _backward(x_aval, params, lhs, rhs, trans_lhs, trans_rhs):
  # The backward GEMM's result is stored as the primal operand is: give it that sharding,
  # as dot_general's transpose does (with Explicit axes a K-sharded backward GEMM, e.g.
  # the weight gradient of data parallel, is otherwise "ambiguous" and raises).
  sharding = None if x_aval.sharding.mesh.empty else x_aval.sharding
  return bind(lhs, rhs, trans_a=trans_lhs, trans_b=trans_rhs, out_dtype=x_aval.dtype,
              acc_dtype=params["acc_dtype"], precision=params["precision"],
              backend=params["backend"], variant=params["variant"], config=params["config"],
              out_sharding=sharding)


def transpose_lhs(ct, a, b, *, trans_a, trans_b, **params):   # primitive.py's, via _backward
  ct = ct.astype(b.dtype)
  if trans_a:
    return _backward(a.aval, params, b, ct, trans_b, True)
  return _backward(a.aval, params, ct, b, False, not trans_b)


def transpose_rhs(ct, a, b, *, trans_a, trans_b, **params):
  ct = ct.astype(a.dtype)
  if trans_b:
    return _backward(b.aval, params, ct, a, True, trans_a)
  return _backward(b.aval, params, a, ct, not trans_a, False)


def patch_types():
  prim.matmul_p.def_abstract_eval(abstract_eval)
  prim.bind = api.bind = bind
  ad.defbilinear(prim.matmul_p, transpose_lhs, transpose_rhs)
  jax.clear_caches()   # traces made before the patch hold the old types


# ============================================================ part 3: the checks

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(hlo: str) -> dict[str, int]:
  counts = {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in COLLECTIVES}
  return {c: n for c, n in counts.items() if n}


def ints(shape, seed):
  """Integer-valued float32: every product and sum here is exact, so results must be equal."""
  return jnp.asarray(np.random.default_rng(seed).integers(-3, 4, shape), jnp.float32)


def run_sharded(mesh, fn, operands, specs, out_spec=None):
  """Compile fn on sharded operands: (result, compiled HLO text, local problems)."""
  operands = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(operands, specs)]
  out_shardings = None if out_spec is None else NamedSharding(mesh, out_spec)
  del LOCAL_PROBLEMS[:]
  compiled = jax.jit(fn, out_shardings=out_shardings).lower(*operands).compile()
  local = list(LOCAL_PROBLEMS)
  return compiled(*operands), compiled.as_text(), local


def mm():
  return lambda a, b: jaxgemm.matmul(a, b, backend="xla"), jnp.matmul


def dg(dims):
  return (lambda a, b: jaxgemm.dot_general(a, b, dims, backend="xla"),
          lambda a, b: lax.dot_general(a, b, dims))


TA, TB, TAB = (((0,), (0,)), ((), ())), (((1,), (1,)), ((), ())), (((0,), (1,)), ((), ()))
A, BA, W, WN, AT, BB = (ints((64, 32), 0), ints((8, 16, 32), 1), ints((32, 48), 2),
                        ints((48, 32), 3), ints((32, 64), 4), ints((8, 32, 24), 5))
LAYOUTS = [  # name, (jaxgemm fn, jax's fn), operands, in specs, out spec, expected collectives
    ("batch B", mm(), (BA, BB), (P("d"), P("d")), None, {}),
    ("x(B,M,K) @ W, B sharded", mm(), (BA, W), (P("d"), P()), None, {}),
    ("M (data parallel)", mm(), (A, W), (P("d", None), P()), None, {}),
    ("N (column parallel)", mm(), (A, W), (P(), P(None, "d")), None, {}),
    ("K (row parallel)", mm(), (A, W), (P(None, "d"), P("d", None)), None, {"all-reduce": 1}),
    ("K, out M-sharded", mm(), (A, W), (P(None, "d"), P("d", None)), P("d", None),
     {"reduce-scatter": 1}),
    ("K, out N-sharded", mm(), (A, W), (P(None, "d"), P("d", None)), P(None, "d"),
     {"reduce-scatter": 1}),
    ("trans_a, M sharded", dg(TA), (AT, W), (P(None, "d"), P()), None, {}),
    ("trans_b, N sharded", dg(TB), (A, WN), (P(), P("d", None)), None, {}),
    ("trans_a+b, K sharded", dg(TAB), (AT, WN), (P("d", None), P(None, "d")), None,
     {"all-reduce": 1}),
]


def check_layouts():
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
  print(f"\n== layouts, Auto mesh {dict(mesh.shape)}, "
        f"jax_use_shardy_partitioner={jax.config.jax_use_shardy_partitioner}")
  print(f"{'layout':26} {'jaxgemm collectives':24} {'jax collectives':24} "
        f"{'out spec':18} local problems (a, b)")
  for name, (fn, ref), operands, specs, out_spec, want in LAYOUTS:
    out, hlo, local = run_sharded(mesh, fn, operands, specs, out_spec)
    ref_out, ref_hlo, _ = run_sharded(mesh, ref, operands, specs, out_spec)
    ok = (np.array_equal(np.asarray(out), np.asarray(ref_out)) and collectives(hlo) == want
          and "CustomSPMDPartitioning" not in hlo)
    print(f"{name:26} {str(collectives(hlo)):24} {str(collectives(ref_hlo)):24} "
          f"{str(out.sharding.spec):18} {sorted(set(s for _, s in local))}"
          f"{'' if ok else '  <-- FAILED'}")


def attempt(what, thunk):
  """Run a check; print its error (type and first line) instead of stopping."""
  try:
    return thunk()
  except Exception as e:  # noqa: BLE001 (the error is the finding)
    print(f"{what:34} FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return None


def matmul_out(a, b, out_sharding=None):
  """2-D jaxgemm.matmul with lax's out_sharding (what api.matmul would pass to matmul_p)."""
  spec = None if out_sharding is None else P(None, *out_sharding)
  return bind(a[None], b[None], out_dtype=a.dtype, acc_dtype=np.float32, precision=None,
              backend="xla", variant=None, config=None, out_sharding=spec)[0]


def mlp_loss(dot, down_sharding):
  """A Megatron-style MLP: column-parallel up projection, row-parallel down projection
  (K-sharded over 'model': with Explicit axes its out_sharding must be given)."""
  def loss(params, x, t):
    w1, w2 = params
    y = dot(jax.nn.relu(dot(x, w1)), w2, out_sharding=down_sharding)
    return jnp.sum(y * t)   # linear in y: every gradient is exact in float32
  return loss


def check_training_step(axis_type=AxisType.Auto):
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
  down = None if axis_type == AxisType.Auto else P("data", None)
  operands = ((ints((32, 64), 6), ints((64, 24), 7)), ints((16, 32), 8), ints((16, 24), 9))
  specs = ((P(None, "model"), P("model", None)), P("data", None), P("data", None))
  results = {}
  with jax.set_mesh(mesh):
    operands = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)),
                            operands, specs)
    mm = matmul_out if axis_type == AxisType.Explicit else (
        lambda a, b, out_sharding=None: jaxgemm.matmul(a, b, backend="xla"))
    for name, dot in (("jaxgemm", mm), ("jnp", jnp.matmul)):
      del LOCAL_PROBLEMS[:]
      step = attempt(f"{name} training step, {axis_type}", lambda: jax.jit(
          jax.value_and_grad(mlp_loss(dot, down))).lower(*operands).compile())
      if step is None:
        return
      results[name] = (step(*operands), collectives(step.as_text()),
                       sorted(set(s for _, s in LOCAL_PROBLEMS)))
  (loss, grads), counts, local = results["jaxgemm"]
  (ref_loss, ref_grads), ref_counts, _ = results["jnp"]
  same = all(np.array_equal(g, r) for g, r in zip(grads, ref_grads)) and np.isclose(loss, ref_loss)
  print(f"\n== MLP training step (value_and_grad), mesh {dict(mesh.shape)} {axis_type}: grads "
        f"{'equal' if same else 'DIFFER'}, specs {[g.sharding.spec for g in grads]}\n"
        f"   collectives jaxgemm {counts}, jnp {ref_counts}\n   local problems {local}")


def check_vmap():
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
  mm = lambda a, b: jaxgemm.matmul(a, b, backend="xla")
  print("\n== vmap over the sharded axis")
  for name, fn, ops, specs in (
      ("a mapped (folds into M)", jax.vmap(mm, (0, None)), (BA, W), (P("d"), P())),
      ("both mapped (folds into B)", jax.vmap(mm), (BA, BB), (P("d"), P("d")))):
    out, hlo, local = run_sharded(mesh, fn, ops, specs)
    ok = np.array_equal(out, jnp.matmul(*ops))
    print(f"{name:34} {'equal' if ok else 'DIFFER'}, collectives {collectives(hlo)}, "
          f"out {out.sharding.spec}, local {sorted(set(s for _, s in local))}")


def check_explicit():
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Explicit,))
  mm = lambda a, b: jaxgemm.matmul(a, b, backend="xla")
  k_out = lambda a, b: matmul_out(a, b, out_sharding=P("d", None))
  grad = lambda f: jax.grad(lambda a, w: f(a, w).sum(), argnums=(0, 1))
  print(f"\n== Explicit mesh {dict(mesh.shape)}: type of the result, its value's sharding")
  with jax.set_mesh(mesh):
    m = jax.device_put(A, P("d", None)), jax.device_put(W, P())
    k = jax.device_put(A, P(None, "d")), jax.device_put(W, P("d", None))
    for what, fn, ref, operands in (
        ("M sharded", mm, jnp.matmul, m), ("M sharded: grad (dA, dW)", grad(mm),
                                           grad(jnp.matmul), m),
        ("K sharded", mm, jnp.matmul, k),
        ("K sharded, out_sharding=P('d')", k_out, k_out, k)):
      typed = attempt(what, lambda: jax.eval_shape(fn, *operands))
      if typed is None:
        continue
      compiled = jax.jit(fn).lower(*operands).compile()
      out, expect = compiled(*operands), jax.jit(ref)(*map(np.asarray, operands))
      spec = lambda x: x.sharding.spec if x.sharding is not None else "no sharding"
      equal = all(np.array_equal(o, e) for o, e in zip(jax.tree.leaves(out), jax.tree.leaves(expect)))
      print(f"{what:34} type {jax.tree.map(spec, typed)}, value "
            f"{jax.tree.map(lambda x: x.sharding.spec, out)}, "
            f"{collectives(compiled.as_text())}, {'equal' if equal else 'DIFFER'}")


def check_shard_map(check_vma=True):
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
  def loss(dot):
    f = jax.shard_map(dot, mesh=mesh, in_specs=(P("d", None), P()), out_specs=P("d", None),
                      check_vma=check_vma)
    return jax.jit(jax.grad(lambda a, w: f(a, w).sum(), argnums=(0, 1)))
  a, w = jax.device_put(A, NamedSharding(mesh, P("d", None))), W
  what = f"shard_map grad, check_vma={check_vma}"
  del LOCAL_PROBLEMS[:]
  g = attempt(what, lambda: loss(lambda a, b: jaxgemm.matmul(a, b, backend="xla"))(a, w))
  if g is not None:
    ref = loss(jnp.matmul)(a, w)
    print(f"{what:34} {'equal' if all(np.array_equal(x, y) for x, y in zip(g, ref)) else 'DIFFER'}"
          f" to jnp's (dW {'equal' if np.array_equal(g[1], ref[1]) else 'DIFFERS'}), local "
          f"{sorted(set(s for _, s in LOCAL_PROBLEMS))}")


def check_edges():
  mm = lambda a, b: jaxgemm.matmul(a, b, backend="xla")
  print("\n== edges")
  mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
  for name, a, b, specs in (("M=60 over 8 devices", ints((60, 32), 0), W, (P("d", None), P())),
                            ("K=36 over 8 devices", ints((64, 36), 0), ints((36, 48), 1),
                             (P(None, "d"), P("d", None)))):
    # Uneven shards cannot be device_put: shard inside jit, for jaxgemm and for jnp.
    results = []
    for fn in (mm, jnp.matmul):
      constrained = lambda a, b, fn=fn: fn(*(lax.with_sharding_constraint(
          x, NamedSharding(mesh, s)) for x, s in zip((a, b), specs)))
      del LOCAL_PROBLEMS[:]
      compiled = jax.jit(constrained).lower(a, b).compile()
      results.append((compiled(a, b), collectives(compiled.as_text()), list(LOCAL_PROBLEMS)))
    (out, counts, local), (_, ref_counts, _) = results
    print(f"{name:34} {'equal' if np.array_equal(out, a @ b) else 'DIFFER'}, collectives "
          f"{counts} (jnp {ref_counts}), local {sorted(set(s for _, s in local))}")
  mesh1 = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Auto,))
  del LOCAL_PROBLEMS[:]
  text = jax.jit(mm).lower(*(jax.device_put(x, NamedSharding(mesh1, P())) for x in (A, W))).as_text()
  print(f"{'1-device mesh':34} custom_partitioning in the StableHLO: "
        f"{'CustomSPMDPartitioning' in text}, kernel lowered for {LOCAL_PROBLEMS[0][1]}")
  mesh2 = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  def body(x, w):
    return mm(x, lax.with_sharding_constraint(w, NamedSharding(mesh2, P(None, "model"))))
  f = jax.shard_map(body, mesh=mesh2, in_specs=(P("data"), P()), out_specs=P("data"),
                    axis_names={"data"})
  del LOCAL_PROBLEMS[:]
  out, hlo, local = run_sharded(mesh2, f, (A, W), (P("data"), P(None, "model")))
  print(f"{'shard_map manual over data only':34} {'equal' if np.array_equal(out, A @ W) else 'DIFFER'}"
        f", collectives {collectives(hlo)}, kernel lowered for {sorted(set(s for _, s in local))}"
        f" (no partitioning: see _is_partly_manual)")


def check_api_level_wrap():
  """The alternative: custom_partitioning around the call (not the lowering) stops grad."""
  @custom_partitioning
  def wrapped(a, b):
    return jaxgemm.matmul(a, b, backend="xla")
  wrapped.def_partition(lambda mesh, args, res: (mesh, wrapped.fun, res.sharding,
                                                 tuple(x.sharding for x in args)),
                        sharding_rule="m k, k n -> m n", reduction_factors=("k",))
  print("\n== custom_partitioning around the call instead of the lowering")
  attempt("jax.grad", lambda: jax.grad(lambda a: wrapped(a, W).sum())(A))
  attempt("jax.vmap", lambda: jax.vmap(wrapped, (0, None))(BA, W))


if __name__ == "__main__":
  print(f"jax {jax.__version__}, jax_use_shardy_partitioner={jax.config.jax_use_shardy_partitioner}"
        f", pvary insertion: core.{INSERT_PVARY.__name__}")
  check_layouts()
  with jax_config.use_shardy_partitioner(False):   # GSPMD: infer_sharding_from_operands
    check_layouts()
  check_training_step()
  check_vmap()
  check_edges()
  check_api_level_wrap()
  print("\n######## before patch_types(): matmul_p's abstract eval as in main")
  check_explicit()
  check_shard_map()
  check_shard_map(check_vma=False)
  patch_types()
  print("\n######## after patch_types(): dot_general's abstract eval, pvary in bind, "
        "out_sharding")
  check_explicit()
  check_shard_map()
  check_training_step(AxisType.Explicit)
