"""`fused_matmul_p`: a GEMM with its epilogue (or its backward's gate) in one kernel.

Canonical form: `matmul_p`'s (batch, M, K, N groups of dimensions, `ndims`;
here K and N one dimension each), with extra operands after A and B:

    forward form   Y = act(op(A) @ op(B) + bias) + residual   [and Z, the pre-activation]
    gated forms    C = g(Z) * (op(A) @ op(B))        gate "out"
                   C = op(A * g(Z)) @ op(B)          gate "lhs"
                   C = op(A) @ op(B * g(Z))          gate "rhs"

with g = the derivative of `gate_activation` (`FusedMatmulProblem` has the
details). The gated forms are linear in A and B, and are what the forward
form's derivative is made of:

    Y' = g(Z) * (A' @ B) + g(Z) * (A @ B') + g(Z) * bias' + residual'

(JVP: two out-gated GEMMs, Z saved by the forward kernel), and transposing
an out-gated GEMM gives GEMMs gated on the operand that carries the cotangent,
dA = (g(Z) * dY) @ B^T (gate "lhs"), dB = A^T @ (g(Z) * dY) (gate "rhs"):
the activation's derivative is applied to the cotangent tile as the backward
kernel loads it, with no pass over dY of its own. Transposing those gives
out-gated GEMMs again, so second order (hessian) closes over the same forms;
the derivative of a gate with respect to Z itself (second order only) is
computed with jnp.

Rules: abstract eval (lax.dot_general's, for shard_map's varying axes), the
lowering (chosen per problem by `jaxgemm.dispatch`, as for matmul_p), JVP and
transpose as above, batching (a mapped A joins M; anything else becomes a
batch dimension), sharding through `jaxgemm.sharding` (K stays whole under a
nonlinear epilogue: partial sums cannot go through an activation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jaxgemm import collective_matmul, registry, sharding
from jaxgemm.gemm import dimension_groups
from jaxgemm.ops import activations, rules
from jaxgemm.ops.rules import add_terms, bias_to_out, is_zero, moved
from jaxgemm.ops.base import Op, normal_operands
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.matmul import primitive as matmul_primitive

fused_matmul_p = Primitive("jaxgemm_fused_matmul")
fused_matmul_p.multiple_results = True

_EPILOGUE = dict(activation=None, bias=None, residual=False, save_preactivation=False,
                 gate=None, gate_activation=None)


def _gemm_params(params) -> dict:
  """The params matmul_p takes (the epilogue's dropped)."""
  return {k: v for k, v in params.items() if k not in _EPILOGUE}


def _out_full_shape(a_shape, b_shape, *, trans_a, trans_b, ndims, **_):
  (batch, m, _), (_, _, n) = dimension_groups(a_shape, b_shape, trans_a=trans_a,
                                              trans_b=trans_b, ndims=ndims)
  return (*batch, *m, *n)


def _extra_full_shapes(a_shape, b_shape, params) -> list[tuple[int, ...]]:
  """The shapes the operands after A and B must have, in full (uncollapsed) dims."""
  nb, nn = params["ndims"][0], params["ndims"][3]
  out = _out_full_shape(a_shape, b_shape, **params)
  if params["gate"] is not None:
    return [{"out": out, "lhs": tuple(a_shape), "rhs": tuple(b_shape)}[params["gate"]]]
  shapes = []
  if params["bias"] == "shared":
    shapes.append(out[len(out) - nn:])
  elif params["bias"] == "batched":
    shapes.append((*out[:nb], *out[len(out) - nn:]))
  if params["residual"]:
    shapes.append(out)
  return shapes


def problem_of(a, b, *extras, **params) -> FusedMatmulProblem:
  """The FusedMatmulProblem that `fused_matmul_p.bind(a, b, *extras, **params)` computes."""
  gemm = matmul_primitive.problem_of(a, b, **params)
  want = _extra_full_shapes(a.shape, b.shape, params)
  got = [tuple(x.shape) for x in extras]
  if got != want:
    raise TypeError(f"fused_matmul_p with {dict((k, params[k]) for k in _EPILOGUE)} takes "
                    f"extra operands of shapes {want}; got {got}")
  if params["gate"] is None and any(x.dtype != params["out_dtype"] for x in extras):
    raise TypeError(f"fused_matmul_p's bias and residual must be in the result's dtype "
                    f"{np.dtype(params['out_dtype']).name}; got {[x.dtype.name for x in extras]}")
  return FusedMatmulProblem(**{f: getattr(gemm, f) for f in gemm.__dataclass_fields__},
                            **{k: params[k] for k in _EPILOGUE})


def bind(a, b, *extras, trans_a=False, trans_b=False, ndims=matmul_primitive.DEFAULT_NDIMS,
         out_dtype, acc_dtype, precision, backend, variant=None, config=None,
         activation=None, bias=None, residual=False, save_preactivation=False, gate=None,
         gate_activation=None, out_sharding=None, overlap=None):
  """fused_matmul_p.bind with every param; returns the list of results.

  out_sharding must be None (it is in the params for `jaxgemm.sharding`, which
  treats it as matmul_p's): the result takes the sharding rule's."""
  if out_sharding is not None:
    raise NotImplementedError("fused_matmul_p takes no out_sharding")
  a, b, *extras = sharding.insert_pvary(a, b, *extras)
  return fused_matmul_p.bind(
      a, b, *extras, trans_a=trans_a, trans_b=trans_b, ndims=tuple(ndims),
      out_dtype=np.dtype(out_dtype), acc_dtype=np.dtype(acc_dtype), precision=precision,
      backend=backend, variant=variant, config=config, out_sharding=None,
      activation=activation, bias=bias, residual=residual,
      save_preactivation=save_preactivation, gate=gate, gate_activation=gate_activation,
      overlap=overlap)


def _abstract_eval(a, b, *extras, **params):
  problem = problem_of(a, b, *extras, **params)
  out, _ = lax.dot_general_p.abstract_eval(
      a, b, dimension_numbers=matmul_primitive.dimension_numbers(**params), precision=None,
      preferred_element_type=None, out_sharding=None)
  out = out.update(dtype=problem.out_dtype, weak_type=False)
  return [out] * problem.num_outputs


def _impl(*args, **params):
  from jax._src import dispatch as jax_dispatch  # noqa: PLC0415 (eager path for primitives)
  return jax_dispatch.apply_primitive(fused_matmul_p, *args, **params)


# ---------------------------------------------------------------- autodiff

def _gated(x, y, z, params, gate):
  """The GEMM of x and y (params' layout) gated on `gate` by g(z); plain if z is None."""
  if z is None:
    return matmul_primitive.bind(x, y, **_gemm_params(params))
  return bind(x, y, z, **{**_gemm_params(params), "gate": gate,
                          "gate_activation": params["activation"]})[0]


def _forward_jvp(primals, tangents, **params):
  a, b, *extras = primals
  da, db, *dextras = tangents
  nb, nn = params["ndims"][0], params["ndims"][3]
  act = params["activation"]
  bias_t = dextras.pop(0) if params["bias"] else None
  residual_t = dextras.pop(0) if params["residual"] else None
  outs = fused_matmul_p.bind(a, b, *extras, **{**params, "save_preactivation": act is not None
                                               or params["save_preactivation"]})
  y, z = outs[0], (outs[1] if len(outs) > 1 else None)
  out_shape, out_dtype = y.shape, y.dtype
  # The bias's tangent stays fp32 up to the sum: transposed, its cotangent is a sum
  # over every row, which in bf16 lost 1.2% (Frobenius) against XLA's at 4096^3
  # (the epilogue suite at 5e779e5, H100, sq4096.bias.gelu.fwd+bwd).
  bias_term = (None if bias_t is None or is_zero(bias_t)
               else bias_to_out(bias_t.astype(np.float32), out_shape, nb, nn, params["bias"]))
  gemm = dict(params, variant=None, config=None)   # the caller's tiles were for the forward
  if params["save_preactivation"] or act is None:
    # Z's tangent is wanted (or Y's is Z's): plain GEMMs, then the derivative.
    dz = add_terms([None if is_zero(da) else _gated(da, b, None, gemm, None),
               None if is_zero(db) else _gated(a, db, None, gemm, None), bias_term])
    dz = jnp.zeros(out_shape, out_dtype) if dz is None else dz
    dy = (dz if act is None else activations.derivative(act, z.astype(np.float32)) * dz
          ).astype(out_dtype)
    dz = dz.astype(out_dtype)
  else:
    g_bias = (None if bias_term is None else
              activations.derivative(act, z.astype(np.float32)) * bias_term)
    dy = add_terms([None if is_zero(da) else _gated(da, b, z, gemm, "out"),
               None if is_zero(db) else _gated(a, db, z, gemm, "out"), g_bias])
    dy = jnp.zeros(out_shape, out_dtype) if dy is None else dy.astype(out_dtype)
  if residual_t is not None and not is_zero(residual_t):
    dy = dy + residual_t.astype(out_dtype)
  if params["save_preactivation"]:
    return [y, z], [dy, dz]
  return [y], [dy]


def _gated_jvp(primals, tangents, **params):
  """Bilinear in A and B; Z's own tangent (second order only) through jnp."""
  a, b, z = primals
  da, db, dz = tangents
  gate, act = params["gate"], params["gate_activation"]
  outs = fused_matmul_p.bind(a, b, z, **params)
  gemm = dict(params, variant=None, config=None)
  terms = [None if is_zero(da) else fused_matmul_p.bind(da, b, z, **gemm)[0],
           None if is_zero(db) else fused_matmul_p.bind(a, db, z, **gemm)[0]]
  if not is_zero(dz):
    # d g(Z) = g'(Z) dZ, applied to whatever g multiplies.
    dg = jax.jvp(lambda z: activations.derivative(act, z), (z.astype(np.float32),),
                 (dz.astype(np.float32),))[1]
    plain = _gemm_params(params)
    if gate == "out":
      terms.append(dg * matmul_primitive.bind(a, b, **plain))
    elif gate == "lhs":
      terms.append(matmul_primitive.bind((a * dg).astype(a.dtype), b, **plain))
    else:
      terms.append(matmul_primitive.bind(a, (b * dg).astype(b.dtype), **plain))
  out = add_terms(terms)
  out = jnp.zeros(outs[0].shape, outs[0].dtype) if out is None else out.astype(outs[0].dtype)
  return outs, [out]


def _jvp(primals, tangents, **params):
  return (_gated_jvp if params["gate"] else _forward_jvp)(primals, tangents, **params)


def _gated_transpose(cts, a, b, z, **params):
  """A gated GEMM's transpose: matmul_p's two backward GEMMs, each gated where the
  gated tensor went (an operand of it: gate that side; its result: gate "out")."""
  (ct,) = cts
  if is_zero(ct) or ad.is_undefined_primal(z):
    if ad.is_undefined_primal(z):
      raise ValueError("fused_matmul_p is not linear in its gate operand Z")
    return [None if not ad.is_undefined_primal(x) else ad.Zero(x.aval) for x in (a, b)] + [None]
  gate = params["gate"]
  trans_a, trans_b = params["trans_a"], params["trans_b"]
  nb, nm, nk, nn = params["ndims"]
  act = params["gate_activation"]
  ct = ct.astype(a.aval.dtype if ad.is_undefined_primal(a) else a.dtype)

  def gemm(x_aval, lhs, rhs, trans_lhs, trans_rhs, ndims, lhs_is, rhs_is, out_is):
    """One backward GEMM; *_is name the forward tensor in that place ("ct", "a", "b")."""
    gated = {"out": "ct", "lhs": "a", "rhs": "b"}[gate]
    where = "lhs" if lhs_is == gated else "rhs" if rhs_is == gated else "out" if out_is == gated \
        else None
    out_sharding = None if x_aval.sharding.mesh.empty else x_aval.sharding
    common = dict(trans_a=trans_lhs, trans_b=trans_rhs, ndims=ndims, out_dtype=x_aval.dtype,
                  acc_dtype=params["acc_dtype"], precision=params["precision"],
                  backend=params["backend"], variant=None, config=None,
                  overlap=params.get("overlap"))
    if where is None:
      return matmul_primitive.bind(lhs, rhs, out_sharding=out_sharding, **common)
    return bind(lhs, rhs, z, gate=where, gate_activation=act, **common)[0]

  da = db = None
  if ad.is_undefined_primal(a):
    if trans_a:   # a stored (K, M): dA = op_b(B) dC^T
      da = gemm(a.aval, b, ct, trans_b, True, (nb, nk, nn, nm), "b", "ct", "a")
    else:
      da = gemm(a.aval, ct, b, False, not trans_b, (nb, nm, nn, nk), "ct", "b", "a")
  if ad.is_undefined_primal(b):
    if trans_b:   # b stored (N, K): dB = dC^T op_a(A)
      db = gemm(b.aval, ct, a, True, trans_a, (nb, nn, nm, nk), "ct", "a", "b")
    else:
      db = gemm(b.aval, a, ct, not trans_a, False, (nb, nk, nm, nn), "a", "ct", "b")
  return [da, db, None]


# ---------------------------------------------------------------- batching

def _batch_rule(args, dims, **params):
  """vmap: a mapped A (with its residual or gate) joins M, reusing B unbroadcast;
  anything else becomes a leading batch dimension (unmapped operands broadcast,
  a bias shared by every batch stays shared)."""
  a, b, *extras = args
  da, db, *dextras = dims
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  nb, nm, nk, nn = params["ndims"]
  trans_a, gate = params["trans_a"], params["gate"]
  kinds = (["gate"] if gate else (["bias"] if params["bias"] else [])
           + (["residual"] if params["residual"] else []))
  bias_mapped = any(d is not None for k, d in zip(kinds, dextras) if k == "bias")
  if da is not None and db is None and gate != "rhs" and not bias_mapped:
    a = jnp.moveaxis(a, da, nb + (nk if trans_a else 0))   # the front of a's M group
    new_extras = []
    for kind, x, d in zip(kinds, extras, dextras):
      if kind == "bias":
        new_extras.append(x)
      elif gate == "lhs":
        new_extras.append(moved(x, d, nb + (nk if trans_a else 0), size))
      else:   # the residual, or an out gate: shaped like the output
        new_extras.append(moved(x, d, nb, size))
    outs = fused_matmul_p.bind(a, b, *new_extras,
                               **{**params, "ndims": (nb, nm + 1, nk, nn)})
    return outs, [nb] * len(outs)
  a, b = moved(a, da, 0, size), moved(b, db, 0, size)
  new_extras, bias_kind = [], params["bias"]
  for kind, x, d in zip(kinds, extras, dextras):
    if kind == "bias" and d is None and bias_kind == "shared":
      new_extras.append(x)
    elif kind == "bias" and bias_kind == "shared":   # mapped: one bias per new batch entry
      x = jnp.moveaxis(x, d, 0)   # (size, *N)
      batch = a.shape[1:1 + nb]
      new_extras.append(lax.broadcast_in_dim(x, (size, *batch, *x.shape[1:]),
                                        (0, *range(nb + 1, nb + x.ndim))))
      bias_kind = "batched"
    else:
      new_extras.append(moved(x, d, 0, size))
  outs = fused_matmul_p.bind(a, b, *new_extras, **{**params, "ndims": (nb + 1, nm, nk, nn),
                                              "bias": bias_kind})
  return outs, [0] * len(outs)


# ---------------------------------------------------------------- sharding

def sharding_rule(*, trans_a, trans_b, ndims, activation, bias, residual, gate, **_
                  ) -> sharding.EinsumRule:
  """matmul_p's einsum with the extra operands': a bias over ``n`` (``b n`` per batch),
  a residual and an out gate over ``b m n``, an operand gate over its operand's factors.

  K stays whole (replicated) under an epilogue: an activation (or a bias, or a
  residual) applied to each device's partial sum is not the one of the sum.

  >>> str(sharding_rule(trans_a=False, trans_b=False, ndims=(0, 2, 1, 1), activation="gelu",
  ...                   bias="shared", residual=True, gate=None))
  'm0 m1 k, k n, n, m0 m1 n -> m0 m1 n'
  """
  base = matmul_primitive.sharding_rule(trans_a=trans_a, trans_b=trans_b, ndims=ndims)
  (a, b), out = base.operands, base.result
  batch, n = out[:ndims[0]], out[len(out) - ndims[3]:]
  if gate:
    extras = [{"out": out, "lhs": a, "rhs": b}[gate]]
  else:
    extras = ([n] if bias == "shared" else [batch + n] if bias else [])
    extras += [out] if residual else []
  nonlinear = gate is None and (activation or bias or residual)
  return sharding.EinsumRule((a, b, *extras), out, replicated=("k",) if nonlinear else ())


fused_matmul_p.def_impl(_impl)
fused_matmul_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[fused_matmul_p] = _jvp
ad.primitive_transposes[fused_matmul_p] = _gated_transpose
batching.primitive_batchers[fused_matmul_p] = _batch_rule
fused_matmul_local_p = sharding.make_partitionable(
    fused_matmul_p, sharding_rule,
    {platform: rules.kernel_lowering(
        problem_of, lambda p: (p.a_shape, p.b_shape, *p.extra_shapes), platform=platform,
        multiple_results=True) for platform in ("cuda", "cpu")},
    overlap=collective_matmul.ring_for)


def _call(problem: FusedMatmulProblem, a, b, *extras, backend, variant, config):
  """The primitive on canonical 3-D operands (what the autotuner times)."""
  outs = bind(a, b, *extras, trans_a=problem.trans_a, trans_b=problem.trans_b,
              out_dtype=problem.out_dtype, acc_dtype=problem.acc_dtype,
              precision=problem.precision, backend=backend, variant=variant, config=config,
              **{k: getattr(problem, k) for k in _EPILOGUE})
  return outs[0] if len(outs) == 1 else tuple(outs)


def _example_operands(problem: FusedMatmulProblem, key):
  dtypes = [problem.out_dtype] * len(problem.extra_shapes)
  return normal_operands([(problem.a_shape, problem.dtype), (problem.b_shape, problem.dtype),
                          *zip(problem.extra_shapes, dtypes)], key)


FUSED_MATMUL = registry.register_op(Op(
    name="fused_matmul",
    primitive=fused_matmul_p,
    arity=lambda problem: 2 + len(problem.extra_shapes),
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=_example_operands,
))
