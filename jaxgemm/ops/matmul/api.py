"""Public API: `matmul` (jnp.matmul's contract) and `dot_general` (lax's).

Both reduce the call to the canonical `matmul_p` form (batch, M, K and N as
contiguous groups of dimensions, with transpose flags) without copying or
reshaping operands (a broadcast batch is the one copy, as in jnp), choose the
kernel (`backend`, `variant`, `config`) once, up front, and check it against
the problem before anything is traced or compiled. Without reshapes, a
sharded dimension stays a dimension that XLA's partitioner can keep split.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import dispatch, registry, sharding
from jaxgemm.config import KernelConfig
from jaxgemm.ops.matmul.primitive import bind
from jaxgemm.ops.matmul.problem import GemmProblem

def _canonical_precision(precision) -> tuple[lax.Precision, lax.Precision] | None:
  """A pair of lax.Precision, or None for the default.

  precision=None means what it means to jnp.matmul: the current
  `jax.default_matmul_precision` setting ("float32" makes fp32 products exact
  on every backend), else the backend's default (TF32 tensor cores for fp32).
  """
  if precision is None:
    precision = jax.config.jax_default_matmul_precision
    if precision is None:
      return None
  given = precision
  if isinstance(precision, (str, lax.Precision)):
    precision = (precision, precision)
  if isinstance(precision, tuple) and len(precision) == 2:
    try:
      precision = tuple(lax.Precision(p) if isinstance(p, str) else p for p in precision)
    except ValueError:
      pass
    if all(isinstance(p, lax.Precision) for p in precision):
      return precision
  _check_lax_takes(given)
  raise NotImplementedError(
      f"jaxgemm kernels take precision=None, a lax.Precision or a pair of them; "
      f"got precision={given!r} (backend='auto' hands it to lax.dot_general)")


def _check_lax_takes(precision) -> None:
  """lax's own ValueError, which lists the valid precisions, for a `precision` that
  jnp.matmul and lax.dot_general refuse as well (a value they take, such as a
  lax.DotAlgorithmPreset, passes: the kernels' NotImplementedError is then the answer)."""
  x = jax.ShapeDtypeStruct((1, 1), jnp.float32)
  jax.eval_shape(lambda a, b: lax.dot(a, b, precision=precision), x, x)


def _route(problem: GemmProblem | None, backend: str, variant, config,
           why_not_canonical: str | None) -> dict[str, Any] | None:
  """matmul_p's kernel params for `problem`, or None: compute with lax instead.

  The returned variant and config are the caller's (None when not given);
  either way the choice is checked against `problem` here, before tracing.

  None happens only under backend="auto"; a named backend that cannot run the
  problem raises (NotImplementedError for unsupported features, ValueError or
  TypeError for bad arguments).
  """
  dispatch.validate(GemmProblem.op if problem is None else problem.op, backend, variant, config)
  if problem is None:
    if backend == dispatch.AUTO:
      return None
    raise NotImplementedError(f"backend={backend!r} cannot run this call: "
                              f"{why_not_canonical}")
  dispatch.choose(problem, backend, variant, config)   # checks the choice before tracing
  # What the caller left open (None) is chosen per problem at lowering, so the
  # backward GEMMs, whose shapes differ, get their own variant and tiles.
  return dict(backend=backend, variant=variant, config=config)


def _dtypes(lhs, rhs, preferred_element_type):
  dtype = jnp.result_type(lhs, rhs)
  if not jnp.issubdtype(dtype, jnp.number) and dtype != jnp.bool_:
    raise TypeError(f"matmul needs numeric operands, got dtypes {lhs.dtype} and {rhs.dtype}")
  out_dtype = (dtype if preferred_element_type is None
               else np.dtype(jax.dtypes.canonicalize_dtype(preferred_element_type)))
  return np.dtype(dtype), np.dtype(out_dtype)


def _lax_dtypes(lhs, rhs, dimension_numbers, preferred_element_type, out_sharding):
  """(operand dtype for the kernels or None, result dtype), as lax.dot_general has them.

  lax takes mixed operand dtypes in any promotion mode (float32 x bfloat16
  under jax_numpy_dtype_promotion="strict", float8_e4m3fn x float8_e5m2) and
  its result dtype is not always jnp's promotion (bfloat16 x float16 gives
  bfloat16). The kernels take the operands converted to their standard
  promotion (exact: each converts into it without rounding), or leave the call
  to lax where there is none (two fp8 formats).
  """
  out_dtype = np.dtype(jax.eval_shape(
      lambda l, r: lax.dot_general(l, r, dimension_numbers,
                                   preferred_element_type=preferred_element_type,
                                   out_sharding=out_sharding),
      lhs, rhs).dtype)
  if lhs.dtype == rhs.dtype:
    return np.dtype(lhs.dtype), out_dtype
  try:
    with jax.numpy_dtype_promotion("standard"):
      return np.dtype(jnp.promote_types(lhs.dtype, rhs.dtype)), out_dtype
  except jax.dtypes.TypePromotionError:
    return None, out_dtype


def floating_dtypes_taken() -> str:
  """What the backends take, for the error of a dtype none of them does: float64 is XLA's
  alone (every kernel refuses it, naming its own dtypes, `registry.require_dtypes`)."""
  kernels = [d.name for d in registry.FLOAT_DTYPES if d != np.float64]
  return (f"jaxgemm's kernels take floating operands {kernels}, and backend='xla' float64 "
          f"as well")


def _problem(batch, m, n, k, dtype, out_dtype, trans_a, trans_b, precision):
  """The canonical problem, or None with a reason when matmul_p cannot take it."""
  if dtype not in registry.FLOAT_DTYPES or out_dtype not in registry.FLOAT_DTYPES:
    return None, f"{floating_dtypes_taken()}; got dtype={dtype.name}, out dtype={out_dtype.name}"
  try:
    precision = _canonical_precision(precision)
  except NotImplementedError as e:
    return None, str(e)
  acc_dtype = np.dtype(np.float64 if np.float64 in (dtype, out_dtype) else np.float32)
  return GemmProblem(batch, m, n, k, dtype, out_dtype, acc_dtype, trans_a, trans_b,
                     precision), None


def matmul(a, b, *, bias=None, activation: str | None = None, residual=None, fp8=None,
           precision=None, preferred_element_type=None, out_sharding=None,
           backend: str = "auto", variant: str | None = None,
           config: KernelConfig | None = None) -> jax.Array:
  """`jnp.matmul` on jaxgemm's kernels: same results, dtypes, shapes and errors;
  with an epilogue, `activation(a @ b + bias) + residual` in one kernel.

  Args:
    a, b: arrays of rank >= 1. 1-D operands and broadcast batch dimensions
      follow numpy.matmul's rules.
    bias: None or shape (N,) (N = b.shape[-1]), in the result's dtype.
    activation: None, "relu", "gelu" (jax.nn.gelu, approximate=True),
      "gelu_exact" (approximate=False), "silu", "sigmoid" or "tanh", as jax.nn.
    residual: None or an array of the result's shape and dtype, added last.
      With any of the three, the kernel applies them to its fp32 accumulator
      before its one store, and its gradient applies the activation's
      derivative inside the backward GEMMs (`jaxgemm.ops.fused_matmul`).
    fp8: None, or an FP8 training recipe: "tensor", "block" or a
      `jaxgemm.Fp8Recipe`. The forward GEMM and the backward's dgrad and wgrad
      GEMMs then run in FP8 (`jaxgemm.scaled_matmul`) on operands quantized on
      the fly (`jaxgemm.ops.scaled_matmul.training`); b must be 2-D (K, N), and
      an epilogue runs as XLA ops after the GEMM. `out_sharding` is the forward
      GEMM's; the gradients take their primals' shardings.
    precision: None, a `lax.Precision` (or its name) or a pair of them. For
      float32 operands, DEFAULT uses TF32 tensor cores on GPU and HIGHEST (or
      HIGH) exact fp32.
    preferred_element_type: the result dtype (accumulation is float32, or
      float64 for float64 problems).
    out_sharding: the result's sharding on a mesh with Explicit axes (a
      NamedSharding, or a PartitionSpec under `jax.set_mesh`), as for
      `jnp.matmul`; needed where K is sharded and the result's sharding is
      ambiguous. None: the rule's (see README, "Sharding").
    backend: "auto" (the fastest known choice; `lax.dot_general` for whatever
      the kernels do not take), or one of `jaxgemm.backends()`.
    variant: a kernel of the backend, one of `jaxgemm.variants(backend)`;
      None picks the backend's best.
    config: the backend's config dataclass, e.g. `jaxgemm.TritonConfig(...)`;
      None picks one for the problem.

  Example:
    >>> import jax, jax.numpy as jnp, jaxgemm
    >>> a = jnp.ones((4, 8, 16)); b = jnp.ones((16, 32))
    >>> jaxgemm.matmul(a, b, backend="xla").shape
    (4, 8, 32)
    >>> jax.grad(lambda a: jaxgemm.matmul(a, b).sum())(a).shape
    (4, 8, 16)
    >>> y = jaxgemm.matmul(a, b, bias=jnp.zeros(32), activation="gelu", backend="xla")
    >>> y8 = jaxgemm.matmul(a, b, fp8="block", backend="xla")   # FP8 GEMMs, forward and VJP
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  for i, x in enumerate((a, b)):
    if x.ndim < 1:
      raise ValueError(f"matmul input operand {i} must have ndim at least 1, "
                       f"but it has ndim {x.ndim}")
  if fp8 is not None:
    from jaxgemm.ops.scaled_matmul import training  # noqa: PLC0415 (imports this module)
    return training.matmul(
        a, b, fp8, bias=bias, activation=activation, residual=residual, precision=precision,
        preferred_element_type=preferred_element_type, out_sharding=out_sharding,
        backend=backend, variant=variant, config=config)
  if bias is not None or activation is not None or residual is not None:
    from jaxgemm.ops.fused_matmul import api as fused_api  # noqa: PLC0415 (it imports this module)
    return fused_api.fused_matmul(
        a, b, bias=bias, activation=activation, residual=residual, precision=precision,
        preferred_element_type=preferred_element_type, out_sharding=out_sharding,
        backend=backend, variant=variant, config=config)
  dtype, out_dtype = _dtypes(a, b, preferred_element_type)
  out_sharding = sharding.canonical_out_sharding(out_sharding, "matmul")

  layout = canonical_layout(a, b)
  problem, why_not = _problem(layout.batch, layout.rows, layout.n, layout.k, dtype, out_dtype,
                              False, False, precision)
  route = _route(problem, backend, variant, config, why_not)
  if route is None:
    return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type,
                      out_sharding=out_sharding)
  a3, b3 = layout.operands(a.astype(dtype), b.astype(dtype))
  return bind(a3, b3, out_dtype=out_dtype, acc_dtype=problem.acc_dtype,
              precision=problem.precision, ndims=layout.ndims, out_sharding=out_sharding,
              **route)


@dataclasses.dataclass(frozen=True)
class MatmulLayout:
  """How `jnp.matmul(a, b)` maps onto matmul_p's canonical form, with no copy of b."""

  batch_shape: tuple[int, ...]   # the broadcast batch dimensions
  m_dims: tuple[int, ...]        # () for a 1-D a
  n_dims: tuple[int, ...]        # () for a 1-D b
  k: int
  b_is_shared: bool              # b has no batch: a's batch dimensions join M

  @property
  def batch(self) -> int:
    return 1 if self.b_is_shared else math.prod(self.batch_shape)

  @property
  def rows(self) -> int:
    return math.prod(self.m_dims) * (math.prod(self.batch_shape) if self.b_is_shared else 1)

  @property
  def n(self) -> int:
    return math.prod(self.n_dims)

  @property
  def out_shape(self) -> tuple[int, ...]:
    return (*self.batch_shape, *self.m_dims, *self.n_dims)

  @property
  def ndims(self) -> tuple[int, int, int, int]:
    if self.b_is_shared:
      return (0, len(self.batch_shape) + len(self.m_dims), 1, len(self.n_dims))
    return (len(self.batch_shape), len(self.m_dims), 1, len(self.n_dims))

  def operands(self, a, b):
    """a and b in the canonical form (a broadcast batch is the one copy, as in jnp)."""
    a3 = jnp.broadcast_to(a, (*self.batch_shape, *self.m_dims, self.k))
    if self.b_is_shared:
      return a3, b.reshape(self.k, *self.n_dims)   # drops b's unit batch dimensions only
    return a3, jnp.broadcast_to(b, (*self.batch_shape, self.k, *self.n_dims))


def canonical_layout(a, b, api_name: str = "matmul") -> MatmulLayout:
  """The canonical layout of `jnp.matmul(a, b)`, or numpy's error for operands that do not fit."""
  # A 1-D operand contributes no M (N) dimension: an empty group, not a unit one.
  m_dims = a.shape[-2:-1] if a.ndim > 1 else ()
  n_dims = b.shape[-1:] if b.ndim > 1 else ()
  a_batch, b_batch = a.shape[:-2], b.shape[:-2]
  k, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
  if k != k_b:
    raise TypeError(f"{api_name} contracting dimensions differ: a.shape={a.shape} has "
                    f"K={k}, b.shape={b.shape} has K={k_b}")
  try:
    batch_shape = jnp.broadcast_shapes(a_batch, b_batch)
  except ValueError as e:
    raise ValueError(f"{api_name} batch dimensions do not broadcast: a.shape={a.shape}, "
                     f"b.shape={b.shape}") from e
  # b shared across the batch (as in x @ W): a's batch dimensions join M, one
  # GEMM with no copy of b.
  return MatmulLayout(tuple(batch_shape), tuple(m_dims), tuple(n_dims), k,
                      math.prod(b_batch) == 1)


def _dot_general_layout(lhs_shape, rhs_shape, dimension_numbers):
  """(trans_a, trans_b, batch_dims, m_dims, n_dims), or a reason it does not fit.

  It fits when batch dimensions lead both operands in the same order, each side
  contracts exactly one dimension, and that dimension sits at either end of the
  side's remaining (free) dimensions, so that the free dimensions are one
  contiguous group, M (or N), and the contracting position a transpose flag.
  """
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
  nb = len(lb)
  if len(lc) != 1 or len(rc) != 1:
    return None, f"it contracts {len(lc)} dimension(s); jaxgemm kernels contract exactly one"
  if lb != tuple(range(nb)) or rb != tuple(range(nb)):
    return None, (f"batch dimensions {lb} x {rb} are not the leading dimensions of "
                  f"both operands")
  (c_l,), (c_r,) = lc, rc
  if c_l == len(lhs_shape) - 1:
    trans_a = False
  elif c_l == nb:
    trans_a = True
  else:
    return None, f"lhs contracting dimension {c_l} is not first or last after the batch dims"
  if c_r == nb:
    trans_b = False
  elif c_r == len(rhs_shape) - 1:
    trans_b = True
  else:
    return None, f"rhs contracting dimension {c_r} is not first or last after the batch dims"
  m_dims = tuple(d for d in range(nb, len(lhs_shape)) if d != c_l)
  n_dims = tuple(d for d in range(nb, len(rhs_shape)) if d != c_r)
  return (trans_a, trans_b, lb, m_dims, n_dims), None


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None, *, backend: str = "auto", variant: str | None = None,
                config: KernelConfig | None = None) -> jax.Array:
  """`lax.dot_general` on jaxgemm's kernels, with the same signature and result.

  Pass it as the `dot_general=` of model layers (e.g. flax's `nn.Dense`).
  Dimension numbers whose batch dimensions lead both operands and which
  contract one dimension at either end of each side run on `matmul_p`;
  others run on `lax.dot_general` under backend="auto" and raise
  NotImplementedError for a named backend. `out_sharding` is lax's: the
  result's sharding on a mesh with Explicit axes.

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> x = jnp.ones((2, 5, 8)); w = jnp.ones((8, 3))
    >>> jaxgemm.dot_general(x, w, (((2,), (0,)), ((), ())), backend="xla").shape
    (2, 5, 3)
  """
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  (lc, rc), (lb, rb) = dimension_numbers
  for side, shape, dims in (("lhs", lhs.shape, (*lc, *lb)), ("rhs", rhs.shape, (*rc, *rb))):
    bad = [d for d in dims if not 0 <= int(d) < len(shape)]
    if bad:
      # TypeError, as lax.dot_general raises for the same mistake.
      raise TypeError(f"dot_general {side} dimension(s) {bad} out of range for "
                      f"{side}.shape={shape}: valid dimensions are 0..{len(shape) - 1}")
  if len(lc) != len(rc) or len(lb) != len(rb):
    raise TypeError(f"dot_general needs as many lhs as rhs dimensions of each kind; "
                    f"got dimension_numbers={dimension_numbers}")
  for what, ldims, rdims in (("contracting", lc, rc), ("batch", lb, rb)):
    lsizes = tuple(lhs.shape[d] for d in ldims)
    rsizes = tuple(rhs.shape[d] for d in rdims)
    if lsizes != rsizes:
      raise TypeError(f"dot_general {what} dimensions differ: lhs.shape={lhs.shape} has "
                      f"{lsizes} at {tuple(ldims)}, rhs.shape={rhs.shape} has {rsizes} "
                      f"at {tuple(rdims)}")

  out_sharding = sharding.canonical_out_sharding(out_sharding, "dot_general")
  # lax's own checks run here too: with Explicit mesh axes, a sharded K and no
  # out_sharding raises its ShardingTypeError.
  dtype, out_dtype = _lax_dtypes(lhs, rhs, dimension_numbers, preferred_element_type,
                                 out_sharding)
  if preferred_element_type is None:
    preferred_element_type = out_dtype
  layout, why_not = _dot_general_layout(lhs.shape, rhs.shape, dimension_numbers)
  if dtype is None:
    layout, why_not = None, (f"the kernels need one operand dtype, and {lhs.dtype} x "
                             f"{rhs.dtype} promote to none")
  problem = None
  if layout is not None:
    trans_a, trans_b, batch_dims, m_dims, n_dims = layout
    batch = math.prod(lhs.shape[d] for d in batch_dims)
    m = math.prod(lhs.shape[d] for d in m_dims)
    n = math.prod(rhs.shape[d] for d in n_dims)
    k = lhs.shape[lc[0]]
    problem, why_not = _problem(batch, m, n, k, dtype, out_dtype, trans_a, trans_b, precision)
  route = _route(problem, backend, variant, config, why_not)
  if route is None:
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type,
                           out_sharding=out_sharding)
  # matmul_p's result is dot_general's: batch, then lhs's free, then rhs's free dims.
  return bind(lhs.astype(dtype), rhs.astype(dtype), trans_a=trans_a, trans_b=trans_b,
              out_dtype=out_dtype, acc_dtype=problem.acc_dtype, precision=problem.precision,
              ndims=(len(batch_dims), len(m_dims), 1, len(n_dims)), out_sharding=out_sharding,
              **route)
