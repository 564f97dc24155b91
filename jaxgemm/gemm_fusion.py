"""The epilogues `jaxgemm.accelerate(fn, fuse=True)` recognizes in a traced program.

A pattern starts at a GEMM of the form `x(..., K) @ w(K, N)` and follows the single use
of each value it produces:

* `x @ w + b` where `b` has shape (N,) and is broadcast over the rows: the bias;
* then an activation: `jax.nn.relu`, `jax.nn.gelu` (the tanh form, inlined as jax traces
  it, or a call named "gelu"), `jax.nn.silu` / `swish`, `jax.nn.sigmoid`, `jnp.tanh`;
* then `+ r` with `r` of the result's shape and dtype: the residual.

This gives `activation(x @ w + b) + r`, with any of the three parts present, as
`jaxgemm.matmul(x, w, bias=b, activation=..., residual=r)`. It also gives
`act(x @ wg [+ bg]) * (x @ wu [+ bu])`, with the same `x`, as `jaxgemm.glu`.

Each value inside a pattern has no use outside it and is not an output of the program,
so nothing else needs it. In `accelerate(jax.grad(f))`, the backward reads the forward's
pre-activation, so those forwards stay unfused. `jax.grad(accelerate(f))` fuses them,
and their gradients are the fused ops' own.

>>> import jax, jax.numpy as jnp
>>> f = lambda x, w, b: jax.nn.relu(x @ w + b)
>>> jaxpr = jax.make_jaxpr(f)(jnp.ones((4, 8)), jnp.ones((8, 16)), jnp.ones(16)).jaxpr
>>> [(e.kind, e.activation, e.bias is not None) for e in find(jaxpr, {0})]
[('epilogue', 'relu', True)]
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import numpy as np
from jax.extend import core as jcore

EPILOGUE, GLU = "epilogue", "glu"
# Calls jax.nn makes (a jit named after the function), and primitives jnp binds directly.
_NAMED_CALLS = {"relu": "relu", "silu": "silu", "swish": "silu", "sigmoid": "sigmoid",
                "gelu": "gelu", "tanh": "tanh"}
_PRIMITIVES = {"tanh": "tanh", "logistic": "sigmoid"}
_CALLS = frozenset({"jit", "pjit", "closed_call"})


@dataclasses.dataclass(frozen=True)
class Fusion:
  """A recognized pattern: the equations it replaces (`covered`, by index), the one whose
  output is its result (`result`), and the fused op's operands (jaxpr variables)."""

  kind: str                     # EPILOGUE or GLU
  dots: tuple[int, ...]         # the GEMM equations (GLU: gate, then up)
  covered: frozenset[int]
  result: int
  x: Any
  w: Any
  w_up: Any = None              # GLU's
  bias: Any = None              # EPILOGUE's bias, or GLU's gate bias
  bias_up: Any = None
  residual: Any = None
  activation: str | None = None

  def describe(self) -> str:
    if self.kind == GLU:
      biases = ", biases" if self.bias is not None or self.bias_up is not None else ""
      return f"jaxgemm.glu(activation={self.activation!r}{biases})"
    parts = [p for p, v in (("bias", self.bias), ("residual", self.residual)) if v is not None]
    if self.activation:
      parts.insert(1 if self.bias is not None else 0, f"activation={self.activation!r}")
    return f"jaxgemm.matmul({', '.join(parts)})"


class _Uses:
  """Who reads each variable: equation indices (an output of the program counts as -1)."""

  def __init__(self, jaxpr):
    self.eqns = jaxpr.eqns
    self.readers = collections.defaultdict(list)
    self.producer = {}
    for i, eqn in enumerate(jaxpr.eqns):
      for v in eqn.invars:
        if isinstance(v, jcore.Var):
          self.readers[v].append(i)
      for v in eqn.outvars:
        self.producer[v] = i
    for v in jaxpr.outvars:
      if isinstance(v, jcore.Var):
        self.readers[v].append(-1)

  def only_reader(self, v) -> int | None:
    readers = self.readers.get(v, [])
    return readers[0] if len(readers) == 1 and readers[0] >= 0 else None

  def other_operand(self, i: int, v):
    """The equation's operand beside `v` (a binary op), or None."""
    ins = self.eqns[i].invars
    if len(ins) != 2:
      return None
    return ins[1] if ins[0] is v else ins[0] if ins[1] is v else None


def plain_gemm(eqn) -> bool:
  """x(..., K) @ w(K, N): no batch dimensions, x contracting its last, w 2-D contracting 0."""
  if eqn.primitive.name != "dot_general":
    return False
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  x, w = (v.aval for v in eqn.invars)
  return (not lb and not rb and w.ndim == 2 and tuple(rc) == (0,)
          and tuple(lc) == (x.ndim - 1,) and x.ndim >= 1)


def _bias_of(uses: _Uses, operand, out_aval):
  """The (N,) variable `operand` broadcasts over the rows, or None."""
  if not isinstance(operand, jcore.Var) or operand not in uses.producer:
    return None
  producer = uses.eqns[uses.producer[operand]]
  if producer.primitive.name != "broadcast_in_dim":
    return None
  (b,) = producer.invars
  n, last = out_aval.shape[-1], producer.outvars[0].aval.ndim - 1
  if (not isinstance(b, jcore.Var) or b.aval.shape != (n,) or b.aval.dtype != out_aval.dtype
      or tuple(producer.params["broadcast_dimensions"]) != (last,)):
    return None
  return b


def _literal(v) -> float | None:
  if isinstance(v, jcore.Literal):
    return float(np.asarray(v.val))
  return None


def _close(a: float | None, b: float) -> bool:
  return a is not None and math.isclose(a, b, rel_tol=2e-2)   # bf16 rounds the constants


def _gelu_chain(uses: _Uses, z) -> tuple[list[int], Any] | None:
  """jax.nn.gelu's tanh form as jax traces it inline:
  0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))); (covered equations, result)."""
  readers = sorted(uses.readers.get(z, []))
  if len(readers) != 3 or min(readers) < 0:
    return None
  eqns = uses.eqns
  i = readers[0]
  names = [eqns[j].primitive.name for j in range(i, i + 8)] if i + 8 <= len(eqns) else []
  if names != ["integer_pow", "mul", "add", "mul", "tanh", "add", "mul", "mul"]:
    return None
  e = eqns[i:i + 8]
  chained = all(e[k + 1].invars[-1] is e[k].outvars[0] or e[k + 1].invars[0] is e[k].outvars[0]
                for k in range(7))
  consts = [_literal(e[1].invars[0]), _literal(e[3].invars[0]), _literal(e[5].invars[0]),
            _literal(e[6].invars[0])]
  if not (chained and e[0].params.get("y") == 3 and e[2].invars[0] is z
          and e[7].invars[0] is z and set(readers) == {i, i + 2, i + 7}
          and _close(consts[0], 0.044715) and _close(consts[1], math.sqrt(2 / math.pi))
          and _close(consts[2], 1.0) and _close(consts[3], 0.5)):
    return None
  if any(uses.only_reader(x.outvars[0]) is None for x in e[:7]):
    return None
  return list(range(i, i + 8)), e[7].outvars[0]


def _is_relu(eqn) -> bool:
  """jax.nn.relu: a custom_jvp call of max(z, 0), or of a call named relu around it."""
  inner = eqn.params.get("call_jaxpr")
  inner = getattr(inner, "jaxpr", inner)
  if inner is None or len(inner.eqns) != 1:
    return False
  (only,) = inner.eqns
  if only.primitive.name in _CALLS and only.params.get("name") == "relu":
    return True
  return only.primitive.name == "max" and any(_literal(v) == 0.0 for v in only.invars)


def _named_activation(eqn) -> str | None:
  name = eqn.primitive.name
  if name in _PRIMITIVES:
    return _PRIMITIVES[name]
  if name.startswith("custom_jvp_call") and _is_relu(eqn):
    return "relu"
  if name in _CALLS:
    act = _NAMED_CALLS.get(str(eqn.params.get("name")))
    if act == "gelu":
      inner = eqn.params["jaxpr"]
      inner = getattr(inner, "jaxpr", inner)
      if any(e.primitive.name in ("erf", "erfc") for e in inner.eqns):
        act = "gelu_exact"
    return act
  return None


def _activation(uses: _Uses, z) -> tuple[list[int], Any, str] | None:
  """The activation applied to `z` alone: (covered equations, its result, its name)."""
  reader = uses.only_reader(z)
  if reader is not None:
    act = _named_activation(uses.eqns[reader])
    if act is not None and len(uses.eqns[reader].outvars) == 1:
      return [reader], uses.eqns[reader].outvars[0], act
  chain = _gelu_chain(uses, z)
  return None if chain is None else (*chain, "gelu")


def _add_bias(uses: _Uses, z, out_aval):
  """`z + b` with b broadcast over rows: (equation, sum, b), or None."""
  reader = uses.only_reader(z)
  if reader is None or uses.eqns[reader].primitive.name != "add":
    return None
  bias = _bias_of(uses, uses.other_operand(reader, z), out_aval)
  return None if bias is None else (reader, uses.eqns[reader].outvars[0], bias)


def _epilogue(uses: _Uses, i: int) -> Fusion | None:
  eqn = uses.eqns[i]
  out = eqn.outvars[0]
  covered, z = [i], out
  bias = residual = activation = None
  if (found := _add_bias(uses, z, out.aval)) is not None:
    j, z, bias = found
    covered.append(j)
  if (found := _activation(uses, z)) is not None:
    js, z, activation = found
    covered += js
  reader = uses.only_reader(z)
  if reader is not None and uses.eqns[reader].primitive.name == "add":
    r = uses.other_operand(reader, z)
    if (isinstance(r, jcore.Var) and r.aval.shape == z.aval.shape
        and r.aval.dtype == z.aval.dtype and uses.producer.get(r) not in covered):
      residual, z = r, uses.eqns[reader].outvars[0]
      covered.append(reader)
  if len(covered) == 1:
    return None
  x, w = eqn.invars
  return Fusion(EPILOGUE, (i,), frozenset(covered), uses.producer[z], x, w, bias=bias,
                residual=residual, activation=activation)


def _glu(uses: _Uses, gate: int, up_dots: dict) -> Fusion | None:
  """act(x @ wg [+ bg]) * (x @ wu [+ bu]), starting at the gate's GEMM."""
  eqn = uses.eqns[gate]
  covered, z, bias = [gate], eqn.outvars[0], None
  if (found := _add_bias(uses, z, z.aval)) is not None:
    j, z, bias = found
    covered.append(j)
  if (found := _activation(uses, z)) is None:
    return None
  js, z, activation = found
  covered += js
  mul = uses.only_reader(z)
  if mul is None or uses.eqns[mul].primitive.name != "mul":
    return None
  u = uses.other_operand(mul, z)
  up_bias = None
  producer = uses.producer.get(u)
  if producer is not None and uses.eqns[producer].primitive.name == "add":
    # (x @ wu) + bu: the up GEMM is the add's other operand
    add = uses.eqns[producer]
    for dot_out, b_operand in ((add.invars[0], add.invars[1]), (add.invars[1], add.invars[0])):
      if uses.producer.get(dot_out) in up_dots:
        up_bias = _bias_of(uses, b_operand, u.aval)
        if (up_bias is not None and uses.only_reader(dot_out) == producer
            and uses.only_reader(u) == mul):
          covered.append(producer)
          u = dot_out
        break
  up = uses.producer.get(u)
  if (up not in up_dots or up == gate or uses.only_reader(u) not in (mul, producer)
      or uses.eqns[up].invars[0] is not eqn.invars[0]):
    return None
  covered += [up, mul]
  return Fusion(GLU, (gate, up), frozenset(covered), mul, eqn.invars[0], eqn.invars[1],
                w_up=uses.eqns[up].invars[1], bias=bias, bias_up=up_bias,
                activation=activation)


def find(jaxpr, eligible: set[int], glu: bool = True) -> list[Fusion]:
  """The patterns of one program level that start at the `eligible` GEMMs (equation
  indices of plain `x @ w` GEMMs that go to jaxgemm), none overlapping: GLUs first, then
  epilogues, in program order."""
  uses = _Uses(jaxpr)
  eligible = {i for i in eligible if plain_gemm(jaxpr.eqns[i])}
  found, taken = [], set()
  if glu:
    for i in sorted(eligible):
      fusion = _glu(uses, i, eligible - {i})
      if fusion is not None and not fusion.covered & taken:
        found.append(fusion)
        taken |= fusion.covered
  for i in sorted(eligible - taken):
    fusion = _epilogue(uses, i)
    if fusion is not None and not fusion.covered & taken:
      found.append(fusion)
      taken |= fusion.covered
  return found
