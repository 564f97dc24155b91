"""`glu_p`: a gated linear unit, `activation(X @ Wg + bg) * (X @ Wu + bu)`, in one dual-GEMM kernel.

Canonical form: `matmul_p`'s for each of the two products (same layout, the
same `ndims`; K and N one dimension each), operands X, Wg, Wu and, with
`bias`, bg and bu; results H, and with `save_preactivation` also Zg and Zu.

Derivative (JVP): with Zg, Zu saved by the forward kernel,

    H' = act'(Zg) Zu * Zg' + act(Zg) * Zu',   Z*' = X' @ W* + X @ W*' + b*'

The tangents of Zg and Zu are matmul_p GEMMs (on the call's backend) and the
combination is jnp, which XLA fuses; transposed, the backward is one XLA
fusion (dZg = dH act'(Zg) Zu, dZu = dH act(Zg), and the bias sums) and four
GEMMs on the kernels. (A gate in the GEMMs' prologue would need two
different factors per output tile: dX = dZg @ Wg^T + dZu @ Wu^T.)

Rules: abstract eval, lowering (chosen per problem by `jaxgemm.dispatch`),
JVP, batching (a mapped X joins M), sharding (K whole: the gate is nonlinear).
"""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jaxgemm import collective_matmul, registry, sharding
from jaxgemm.gemm import dimension_groups
from jaxgemm.ops import activations, rules
from jaxgemm.ops.base import Op, normal_operands
from jaxgemm.ops.rules import add_terms, bias_to_out, is_zero, moved
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.matmul import primitive as matmul_primitive

glu_p = Primitive("jaxgemm_glu")
glu_p.multiple_results = True

_EPILOGUE = ("activation", "bias", "save_preactivation")


def _gemm_params(params) -> dict:
  return {k: v for k, v in params.items() if k not in _EPILOGUE}


def problem_of(x, w_gate, w_up, *biases, **params) -> GluProblem:
  """The GluProblem that `glu_p.bind(x, w_gate, w_up, *biases, **params)` computes."""
  gemm = matmul_primitive.problem_of(x, w_gate, **params)
  if params["ndims"][2:] != (1, 1):
    raise TypeError(f"glu_p takes one K and one N dimension; ndims={params['ndims']}")
  if w_up.shape != w_gate.shape or w_up.dtype != w_gate.dtype:
    raise TypeError(f"glu_p's w_up must match w_gate: got {w_up.shape} {w_up.dtype} and "
                    f"{w_gate.shape} {w_gate.dtype}")
  out = dimension_groups(x.shape, w_gate.shape, trans_a=params["trans_a"],
                         trans_b=params["trans_b"], ndims=params["ndims"])
  batch, n = out[0][0], out[1][2]
  want = {None: [], "shared": [n] * 2, "batched": [(*batch, *n)] * 2}[params["bias"]]
  got = [tuple(b.shape) for b in biases]
  if got != [tuple(s) for s in want] or any(b.dtype != params["out_dtype"] for b in biases):
    raise TypeError(f"glu_p with bias={params['bias']!r} takes biases of shapes {want} in "
                    f"{np.dtype(params['out_dtype']).name}; got "
                    f"{[(b.shape, b.dtype.name) for b in biases]}")
  return GluProblem(**{f: getattr(gemm, f) for f in gemm.__dataclass_fields__},
                    **{k: params[k] for k in _EPILOGUE})


def bind(x, w_gate, w_up, *biases, trans_a=False, trans_b=False,
         ndims=matmul_primitive.DEFAULT_NDIMS, out_dtype, acc_dtype, precision, backend,
         variant=None, config=None, activation="silu", bias=None, save_preactivation=False,
         overlap=None):
  """glu_p.bind with every param; returns the list of results."""
  x, w_gate, w_up, *biases = sharding.insert_pvary(x, w_gate, w_up, *biases)
  return glu_p.bind(x, w_gate, w_up, *biases, trans_a=trans_a, trans_b=trans_b,
                    ndims=tuple(ndims), out_dtype=np.dtype(out_dtype),
                    acc_dtype=np.dtype(acc_dtype), precision=precision, backend=backend,
                    variant=variant, config=config, out_sharding=None, activation=activation,
                    bias=bias, save_preactivation=save_preactivation, overlap=overlap)


def _abstract_eval(x, w_gate, w_up, *biases, **params):
  problem = problem_of(x, w_gate, w_up, *biases, **params)
  out, _ = lax.dot_general_p.abstract_eval(
      x, w_gate, dimension_numbers=matmul_primitive.dimension_numbers(**params),
      precision=None, preferred_element_type=None, out_sharding=None)
  return [out.update(dtype=problem.out_dtype, weak_type=False)] * problem.num_outputs


def _impl(*args, **params):
  from jax._src import dispatch as jax_dispatch  # noqa: PLC0415 (eager path for primitives)
  return jax_dispatch.apply_primitive(glu_p, *args, **params)


def _jvp(primals, tangents, **params):
  x, w_gate, w_up, *biases = primals
  dx, dwg, dwu, *dbiases = tangents
  act, nb = params["activation"], params["ndims"][0]
  h, zg, zu = glu_p.bind(*primals, **{**params, "save_preactivation": True})
  gemm = dict(_gemm_params(params), variant=None, config=None)
  mm = lambda a, b: matmul_primitive.bind(a, b, **gemm)

  def dz(w, dw, dbias):
    terms = [None if is_zero(dx) else mm(dx, w), None if is_zero(dw) else mm(x, dw),
             None if dbias is None or is_zero(dbias) else
             bias_to_out(dbias.astype(np.float32), h.shape, nb, 1, params["bias"])]
    out = add_terms(terms)
    return jnp.zeros(h.shape, h.dtype) if out is None else out

  dzg = dz(w_gate, dwg, dbiases[0] if dbiases else None)
  dzu = dz(w_up, dwu, dbiases[1] if dbiases else None)
  zg32, zu32 = zg.astype(np.float32), zu.astype(np.float32)
  # dzg, dzu stay fp32 where a bias's tangent joins them (its cotangent sums every row).
  dh = (activations.derivative(act, zg32) * zu32 * dzg
        + activations.apply(act, zg32) * dzu).astype(h.dtype)
  if params["save_preactivation"]:
    return [h, zg, zu], [dh, dzg.astype(h.dtype), dzu.astype(h.dtype)]
  return [h], [dh]


def _batch_rule(args, dims, **params):
  """vmap: a mapped X joins M (the weights unbroadcast); anything else a batch dimension."""
  x, w_gate, w_up, *biases = args
  dx, dwg, dwu, *dbiases = dims
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  nb, nm, nk, nn = params["ndims"]
  if dx is not None and dwg is None and dwu is None and all(d is None for d in dbiases):
    x = jnp.moveaxis(x, dx, nb + (nk if params["trans_a"] else 0))
    outs = glu_p.bind(x, w_gate, w_up, *biases, **{**params, "ndims": (nb, nm + 1, nk, nn)})
    return outs, [nb] * len(outs)
  x, w_gate, w_up = (moved(a, d, 0, size) for a, d in ((x, dx), (w_gate, dwg), (w_up, dwu)))
  bias_kind = params["bias"]
  if bias_kind == "shared" and all(d is None for d in dbiases):
    new_extras = biases
  elif bias_kind:
    batch = x.shape[1:1 + nb]
    new_extras = []
    for bias, d in zip(biases, dbiases):
      if bias_kind == "shared":   # (N,) or mapped (V, N) -> (V, *batch, N)
        bias = bias[None] if d is None else jnp.moveaxis(bias, d, 0)
        new_extras.append(lax.broadcast_in_dim(bias, (size, *batch, bias.shape[-1]),
                                          (0, nb + 1)))
      else:
        new_extras.append(moved(bias, d, 0, size))
    bias_kind = "batched"
  else:
    new_extras = []
  outs = glu_p.bind(x, w_gate, w_up, *new_extras, **{**params, "ndims": (nb + 1, nm, nk, nn),
                                                "bias": bias_kind})
  return outs, [0] * len(outs)


def sharding_rule(*, trans_a, trans_b, ndims, bias, **_) -> sharding.EinsumRule:
  """Two matmul_p einsums sharing X, biases over ``n`` (``b n`` per batch); K whole.

  >>> str(sharding_rule(trans_a=False, trans_b=False, ndims=(0, 2, 1, 1), bias="shared"))
  'm0 m1 k, k n, k n, n, n -> m0 m1 n'
  """
  base = matmul_primitive.sharding_rule(trans_a=trans_a, trans_b=trans_b, ndims=ndims)
  (x, w), out = base.operands, base.result
  batch = out[:ndims[0]]
  biases = {None: [], "shared": [out[-1:]] * 2, "batched": [batch + out[-1:]] * 2}[bias]
  return sharding.EinsumRule((x, w, w, *biases), out, replicated=("k",))


glu_p.def_impl(_impl)
glu_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[glu_p] = _jvp
batching.primitive_batchers[glu_p] = _batch_rule
glu_local_p = sharding.make_partitionable(
    glu_p, sharding_rule,
    {platform: rules.kernel_lowering(
        problem_of, lambda p: (p.a_shape, p.b_shape, p.b_shape, *p.extra_shapes),
        platform=platform, multiple_results=True) for platform in ("cuda", "cpu")},
    overlap=collective_matmul.ring_for)


def _call(problem: GluProblem, *operands, backend, variant, config):
  outs = bind(*operands, trans_a=problem.trans_a, trans_b=problem.trans_b,
              out_dtype=problem.out_dtype, acc_dtype=problem.acc_dtype,
              precision=problem.precision, backend=backend, variant=variant, config=config,
              activation=problem.activation, bias=problem.bias,
              save_preactivation=problem.save_preactivation)
  return outs[0] if len(outs) == 1 else tuple(outs)


def _example_operands(problem: GluProblem, key):
  return normal_operands(
      [(problem.a_shape, problem.dtype), (problem.b_shape, problem.dtype),
       (problem.b_shape, problem.dtype),
       *[(s, problem.out_dtype) for s in problem.extra_shapes]], key)


GLU = registry.register_op(Op(
    name="glu",
    primitive=glu_p,
    arity=lambda problem: 3 + len(problem.extra_shapes),
    problem_of=lambda avals, params: problem_of(*avals, **params),
    call=_call,
    example_operands=_example_operands,
))
