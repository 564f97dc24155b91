"""Public API: `ragged_dot` (lax.ragged_dot's contract) and `ragged_dot_general` (lax's).

Both check the call as lax does (with errors that name the argument and what
is valid), reduce it to `ragged_dot_p`'s canonical form (a leading batch
dimension, merged from any leading batch dimensions: a free reshape), choose
the kernel once, up front, and check the choice against the problem before
anything is traced. What the kernels do not take (integer operands, other
dimension numbers) runs on lax under `backend="auto"` and raises
NotImplementedError, with the reason, for a named backend.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import gemm, ragged_schedule, registry
from jaxgemm.config import KernelConfig
from jaxgemm.ops.ragged_dot.primitive import bind
from jaxgemm.ops.ragged_dot.problem import RaggedDotProblem

OP = RaggedDotProblem.op


def _check_group_sizes(group_sizes, groups: int, batch_shape: tuple[int, ...], what: str):
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"{what}: group_sizes must have an integer dtype, got "
                    f"group_sizes.dtype={group_sizes.dtype}")
  expected = (*batch_shape, groups)
  if tuple(group_sizes.shape) != expected:
    raise TypeError(f"{what}: group_sizes.shape={group_sizes.shape} must be {expected} "
                    f"(the batch dimensions, then one size per group of rhs)")


def _kernel_problem(lhs, rhs, out_dtype, *, batch, groups, m, k, n, trans_rhs,
                    ragged_contracting, precision):
  """(RaggedDotProblem or None, why not)."""
  if lhs.dtype == rhs.dtype:
    dtype = np.dtype(lhs.dtype)
  else:   # lax takes mixed dtypes in any promotion mode; the kernels, their promotion
    try:
      with jax.numpy_dtype_promotion("standard"):
        dtype = np.dtype(jnp.promote_types(lhs.dtype, rhs.dtype))
    except jax.dtypes.TypePromotionError:
      return None, (f"the kernels need one operand dtype, and {lhs.dtype} x {rhs.dtype} "
                    f"promote to none")
  if dtype not in registry.FLOAT_DTYPES or out_dtype not in registry.FLOAT_DTYPES:
    return None, (f"{gemm.floating_dtypes_taken()}; got lhs.dtype={lhs.dtype}, "
                  f"rhs.dtype={rhs.dtype}, out dtype={out_dtype.name}")
  try:
    precision = gemm.canonical_precision(precision)
  except NotImplementedError as e:
    return None, str(e)
  acc_dtype = np.dtype(np.float64 if np.float64 in (dtype, out_dtype) else np.float32)
  return RaggedDotProblem(batch, groups, m, k, n, dtype, out_dtype, acc_dtype, trans_rhs,
                          ragged_contracting, precision), None


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, *,
               backend: str = "auto", variant: str | None = None,
               config: KernelConfig | None = None) -> jax.Array:
  """`jax.lax.ragged_dot` on jaxgemm's grouped GEMM kernels: a mixture-of-experts layer.

  The rows of `lhs` are split, in order, into `len(group_sizes)` contiguous
  groups, and each group is multiplied by its own matrix of `rhs`:
  ``out[rows of g] = lhs[rows of g] @ rhs[g]``. Rows past ``sum(group_sizes)``
  are zeros; a group's rows end at M. `group_sizes` is a device array: under
  `jax.jit` it can change every step with no recompile and no host sync, and an
  empty group costs nothing (its weights are not read).

  NaN and Inf: the kernels (`triton`, `pallas`) never read an empty group's
  weights nor the rows past the groups, so a NaN or Inf there does not reach the
  result. `lax.ragged_dot` (`backend="xla"`, and `auto` wherever it runs XLA)
  may spread one from an empty group's weights: on the CPU the whole result
  became NaN. Matching it would mean reading weights no token uses.

  Differentiable in `lhs` and `rhs` (both backward GEMMs are grouped GEMMs on
  the same backend), and it composes with jit, grad, jvp and vmap.

  Args:
    lhs: (M, K) array, rows sorted by group.
    rhs: (G, K, N) array, one matrix per group (expert).
    group_sizes: (G,) integer array, rows per group.
    precision, preferred_element_type: as for `lax.ragged_dot` (the result dtype;
      accumulation is float32).
    backend: "auto" (on a GPU, measured when first compiled on a routing that
      spreads the rows over the groups: `jaxgemm.measure`; the fastest known
      choice, else `lax.ragged_dot`), or one of `jaxgemm.backends("ragged_dot")`.
    variant, config: a kernel of the backend and its config
      (`jaxgemm.RaggedDotTritonConfig(...)`, `jaxgemm.RaggedDotPallasConfig(...)`);
      None picks them for the problem.

  Example:
    >>> import jax, jax.numpy as jnp, jaxgemm
    >>> x = jnp.ones((6, 4)); w = jnp.stack([jnp.eye(4), 2 * jnp.eye(4)])
    >>> y = jaxgemm.ragged_dot(x, w, jnp.array([2, 3]))    # rows 0-1, rows 2-4; row 5 zero
    >>> y[:, 0].tolist()
    [1.0, 1.0, 2.0, 2.0, 2.0, 0.0]
    >>> jax.grad(lambda w: jaxgemm.ragged_dot(x, w, jnp.array([2, 3])).sum())(w).shape
    (2, 4, 4)
  """
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  if lhs.ndim != 2:
    raise TypeError(f"ragged_dot: lhs must be 2-D (M, K), got lhs.shape={lhs.shape}")
  if rhs.ndim != 3:
    raise TypeError(f"ragged_dot: rhs must be 3-D (G, K, N), got rhs.shape={rhs.shape}")
  if group_sizes.ndim != 1:
    raise TypeError(f"ragged_dot: group_sizes must be 1-D (G,), got "
                    f"group_sizes.shape={group_sizes.shape}")
  return ragged_dot_general(
      lhs, rhs, group_sizes, RAGGED_DOT_NUMBERS, precision=precision,
      preferred_element_type=preferred_element_type, backend=backend, variant=variant,
      config=config)


# lax.ragged_dot's own dimension numbers.
RAGGED_DOT_NUMBERS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([1], [1]), ([], [])), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[0])


def _layout(lhs_shape, rhs_shape, numbers: lax.RaggedDotDimensionNumbers):
  """(nb, ragged_contracting, trans_rhs), or None and the reason the kernels cannot
  take these dimension numbers.

  The kernels take leading batch dimensions (the same on both sides) and then
  lhs (M, K) with M ragged, and either rhs (G, K, N) / (G, N, K) (M not
  contracted) or rhs (M, N) (M contracted: the weight gradient).
  """
  (lc, rc), (lb, rb) = numbers.dot_dimension_numbers
  lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
  ragged, group = tuple(numbers.lhs_ragged_dimensions), tuple(numbers.rhs_group_dimensions)
  nb = len(lb)
  if lb != tuple(range(nb)) or rb != tuple(range(nb)):
    return None, f"batch dimensions {lb} x {rb} are not the leading dimensions of both"
  if len(lhs_shape) != nb + 2 or ragged != (nb,):
    return None, (f"lhs must be (*batch, M, K) with M ragged; got lhs.shape={lhs_shape}, "
                  f"lhs_ragged_dimensions={ragged}")
  if group == () and lc == (nb,) and rc == (nb,) and len(rhs_shape) == nb + 2:
    return (nb, True, False), None
  if group == (nb,) and lc == (nb + 1,) and len(rhs_shape) == nb + 3 and rc in (
      (nb + 1,), (nb + 2,)):
    return (nb, False, rc == (nb + 2,)), None
  return None, (f"dimension numbers {numbers} are not one of the grouped GEMM forms "
                f"(lhs (*B, M, K) ragged in M with rhs (*B, G, K, N) or (*B, G, N, K), "
                f"or M contracted with rhs (*B, M, N))")


def _problem(lhs, rhs, group_sizes, numbers: lax.RaggedDotDimensionNumbers, precision,
             preferred_element_type):
  """(RaggedDotProblem or None, result dtype, why not) of a ragged_dot_general call, after
  lax's checks (errors naming the argument): None and the reason where the kernels cannot
  take it."""
  layout, why_not = _layout(lhs.shape, rhs.shape, numbers)
  problem = None
  if layout is not None:
    nb, ragged_contracting, trans_rhs = layout
    batch_shape = lhs.shape[:nb]
    if rhs.shape[:nb] != batch_shape:
      raise TypeError(f"ragged_dot_general: batch dimensions differ: lhs.shape={lhs.shape}, "
                      f"rhs.shape={rhs.shape}")
    m, k = lhs.shape[nb:]
    if ragged_contracting:
      if rhs.shape[nb] != m:
        raise TypeError(f"ragged_dot_general: contracting dimensions differ: "
                        f"lhs.shape={lhs.shape} has M={m}, rhs.shape={rhs.shape} has "
                        f"{rhs.shape[nb]}")
      groups, n = group_sizes.shape[-1] if group_sizes.ndim else 0, rhs.shape[nb + 1]
    else:
      groups = rhs.shape[nb]
      rhs_k, n = ((rhs.shape[nb + 2], rhs.shape[nb + 1]) if trans_rhs
                  else (rhs.shape[nb + 1], rhs.shape[nb + 2]))
      if rhs_k != k:
        raise TypeError(f"ragged_dot: contracting dimensions differ: lhs.shape={lhs.shape} "
                        f"has K={k}, rhs.shape={rhs.shape} has K={rhs_k}")
    _check_group_sizes(group_sizes, groups, batch_shape, "ragged_dot")
  # lax's own checks and result dtype (mixed operand dtypes promote as lax does).
  out_dtype = np.dtype(jax.eval_shape(
      lambda l, r, g: lax.ragged_dot_general(l, r, g, numbers,
                                             preferred_element_type=preferred_element_type),
      lhs, rhs, group_sizes).dtype)
  if layout is not None:
    problem, why_not = _kernel_problem(
        lhs, rhs, out_dtype, batch=math.prod(batch_shape), groups=groups, m=m, k=k, n=n,
        trans_rhs=trans_rhs, ragged_contracting=ragged_contracting, precision=precision)
  return problem, out_dtype, why_not


def why_not_on_kernels(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                       preferred_element_type=None, *, backend: str = "auto") -> str | None:
  """None where `ragged_dot_general` with these arguments runs on `ragged_dot_p`, else why
  it does not: the reason `backend="auto"` hands the call to lax for, or the
  NotImplementedError's message of a named backend. The operands may be abstract
  (`jax.ShapeDtypeStruct`, a jaxpr's avals): nothing is computed.

  >>> import jax, jax.numpy as jnp
  >>> x, w = jax.ShapeDtypeStruct((6, 4), jnp.int8), jax.ShapeDtypeStruct((2, 4, 3), jnp.int8)
  >>> why_not_on_kernels(x, w, jax.ShapeDtypeStruct((2,), jnp.int32), RAGGED_DOT_NUMBERS)[:40]
  "jaxgemm's kernels take floating operands"
  """
  problem, _, why_not = _problem(lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                                 precision, preferred_element_type)
  try:
    params = gemm.kernel_params(problem, backend, None, None, why_not, op=OP)
  except NotImplementedError as e:
    return str(e)
  return why_not if params is None else None


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                       precision=None, preferred_element_type=None, *,
                       backend: str = "auto", variant: str | None = None,
                       config: KernelConfig | None = None) -> jax.Array:
  """`jax.lax.ragged_dot_general` on jaxgemm's grouped GEMM kernels.

  The forms the kernels run (with any leading batch dimensions, the same on
  both operands, and group_sizes (*batch, G)):

  * lhs (M, K) ragged in M, rhs (G, K, N) or (G, N, K): (M, N), as `ragged_dot`;
  * lhs (M, K) ragged in M, M contracted with rhs (M, N): (G, K, N), per group
    lhs[rows g]^T @ rhs[rows g] (a mixture-of-experts weight gradient).

  Other dimension numbers run on lax under backend="auto" and raise
  NotImplementedError for a named backend. `ragged_dot_dimension_numbers` is a
  `lax.RaggedDotDimensionNumbers` (TypeError otherwise). As in `ragged_dot`,
  the kernels read only the groups' own rows and weights: a NaN in an empty
  group's weights does not reach their result, where lax's may.

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> from jax import lax
    >>> x, dy = jnp.ones((5, 3)), jnp.ones((5, 2))
    >>> numbers = lax.RaggedDotDimensionNumbers(((([0], [0]), ([], []))), [0], [])
    >>> jaxgemm.ragged_dot_general(x, dy, jnp.array([2, 3]), numbers)[:, 0, 0].tolist()
    [2.0, 3.0]
  """
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  numbers = ragged_dot_dimension_numbers
  if not isinstance(numbers, lax.RaggedDotDimensionNumbers):
    # lax reads its fields by name and fails with an AttributeError on anything else.
    raise TypeError(
        f"ragged_dot_general: ragged_dot_dimension_numbers must be a "
        f"lax.RaggedDotDimensionNumbers, e.g. {RAGGED_DOT_NUMBERS} (ragged_dot's); got "
        f"{type(numbers).__name__} {numbers!r}. A tuple of its three fields "
        f"(dot_dimension_numbers, lhs_ragged_dimensions, rhs_group_dimensions) converts "
        f"with lax.RaggedDotDimensionNumbers(*numbers).")
  problem, out_dtype, why_not = _problem(lhs, rhs, group_sizes, numbers, precision,
                                        preferred_element_type)
  params = gemm.kernel_params(problem, backend, variant, config, why_not, op=OP)
  if params is None:
    return lax.ragged_dot_general(lhs, rhs, group_sizes, numbers, precision=precision,
                                  preferred_element_type=preferred_element_type)
  b, groups, m, k, n = problem.batch, problem.groups, problem.m, problem.k, problem.n
  ragged_contracting, trans_rhs = problem.ragged_contracting, problem.trans_rhs
  nb = lhs.ndim - 2   # lhs is (*batch, M, K) in every form the kernels take
  batch_shape = lhs.shape[:nb]
  out = bind(lhs.astype(problem.dtype).reshape(b, m, k),
             rhs.astype(problem.dtype).reshape(b, *rhs.shape[nb:]),
             ragged_schedule.group_bounds(group_sizes.reshape(b, groups), m),
             ragged_contracting=ragged_contracting,
             trans_rhs=trans_rhs, out_dtype=out_dtype, acc_dtype=problem.acc_dtype,
             precision=problem.precision, **params)
  if ragged_contracting:   # lax's result: (G, *batch, K, N)
    return jnp.moveaxis(out, 1, 0).reshape(groups, *batch_shape, k, n)
  return out.reshape(*batch_shape, m, n)
