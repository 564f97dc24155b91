"""The plain GEMM's functions: `matmul` (jnp.matmul's contract) and `dot_general` (lax's).

Both reduce the call to the canonical `matmul_p` form (batch, M, K and N as
contiguous groups of dimensions, with transpose flags) without copying or
reshaping operands (a broadcast batch is the one copy, as in jnp), choose the
kernel (`backend`, `variant`, `config`) once, up front, and check it against
the problem before anything is traced or compiled. Without reshapes, a
sharded dimension stays a dimension that XLA's partitioner can keep split.

`jaxgemm.matmul` is `jaxgemm.ops.router.matmul`, which sends a call with an
epilogue or `fp8=` to its op and a plain one here.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import collective_matmul, gemm, sharding
from jaxgemm.config import KernelConfig
from jaxgemm.ops.matmul.primitive import bind


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


def matmul(a, b, *, precision=None, preferred_element_type=None, out_sharding=None,
           backend: str = "auto", variant: str | None = None,
           config: KernelConfig | None = None, overlap: bool | None = None) -> jax.Array:
  """`jnp.matmul` on `matmul_p`: same results, dtypes, shapes and errors.

  The arguments are `jaxgemm.matmul`'s (its docstring has them) without the
  epilogue and `fp8=`, which `jaxgemm.ops.router.matmul` sends to their ops.

  Example:
    >>> import jax.numpy as jnp
    >>> matmul(jnp.ones((4, 8, 16)), jnp.ones((16, 32)), backend="xla").shape
    (4, 8, 32)
  """
  a, b = gemm.matmul_operands(a, b)
  collective_matmul.check_overlap(overlap)
  dtype, out_dtype = gemm.matmul_dtypes(a, b, preferred_element_type)
  out_sharding = sharding.canonical_out_sharding(out_sharding, "matmul")

  layout = gemm.canonical_layout(a, b)
  problem, why_not = gemm.gemm_problem(layout.batch, layout.rows, layout.n, layout.k, dtype,
                                       out_dtype, False, False, precision)
  params = gemm.kernel_params(problem, backend, variant, config, why_not)
  if params is None:
    return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type,
                      out_sharding=out_sharding)
  a3, b3 = layout.operands(a.astype(dtype), b.astype(dtype))
  return bind(a3, b3, out_dtype=out_dtype, acc_dtype=problem.acc_dtype,
              precision=problem.precision, ndims=layout.ndims, out_sharding=out_sharding,
              overlap=overlap, **params)


def _dot_general_layout(lhs_shape, rhs_shape, dimension_numbers):
  """(trans_a, trans_b, batch_dims, m_dims, k_dims, n_dims), or a reason it does not fit.

  It fits when batch dimensions lead both operands in the same order, and each side
  contracts one contiguous, increasing run of dimensions (K: one, or several, as the
  weight gradient of a (batch, seq, d) activation contracts batch and seq) at either
  end of its remaining (free) dimensions, so that the free dimensions are one
  contiguous group, M (or N), and the contracting position a transpose flag.

  >>> _dot_general_layout((2, 5, 8), (2, 5, 3), (((0, 1), (0, 1)), ((), ())))[0]
  (True, False, (), (2,), (0, 1), (2,))
  """
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
  nb, nk = len(lb), len(lc)
  if nk == 0 or len(rc) != nk:
    return None, f"it contracts {nk} dimension(s); jaxgemm kernels contract at least one"
  if lb != tuple(range(nb)) or rb != tuple(range(nb)):
    return None, (f"batch dimensions {lb} x {rb} are not the leading dimensions of "
                  f"both operands")
  for side, dims in (("lhs", lc), ("rhs", rc)):
    if dims != tuple(range(dims[0], dims[0] + nk)):
      return None, (f"{side} contracting dimensions {dims} are not one increasing run of "
                    f"adjacent dimensions")
  if lc[-1] == len(lhs_shape) - 1:
    trans_a = False
  elif lc[0] == nb:
    trans_a = True
  else:
    return None, (f"lhs contracting dimension(s) {lc} are not first or last after the "
                  f"batch dims")
  if rc[0] == nb:
    trans_b = False
  elif rc[-1] == len(rhs_shape) - 1:
    trans_b = True
  else:
    return None, (f"rhs contracting dimension(s) {rc} are not first or last after the "
                  f"batch dims")
  m_dims = tuple(d for d in range(nb, len(lhs_shape)) if d not in lc)
  n_dims = tuple(d for d in range(nb, len(rhs_shape)) if d not in rc)
  return (trans_a, trans_b, lb, m_dims, lc, n_dims), None


def _dot_general_problem(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                         out_sharding):
  """(problem, layout, operand dtype, result dtype, why not) of a dot_general call whose
  dimension numbers are in range: the GemmProblem the kernels would run and its
  `_dot_general_layout`, or problem None and why the kernels cannot take the call.
  `out_sharding` as `sharding.canonical_out_sharding` returns it."""
  # lax's own checks run here too: with Explicit mesh axes, a sharded K and no
  # out_sharding raises its ShardingTypeError.
  dtype, out_dtype = _lax_dtypes(lhs, rhs, dimension_numbers, preferred_element_type,
                                 out_sharding)
  layout, why_not = _dot_general_layout(lhs.shape, rhs.shape, dimension_numbers)
  if dtype is None:
    layout, why_not = None, (f"the kernels need one operand dtype, and {lhs.dtype} x "
                             f"{rhs.dtype} promote to none")
  problem = None
  if layout is not None:
    trans_a, trans_b, batch_dims, m_dims, k_dims, n_dims = layout
    batch = math.prod(lhs.shape[d] for d in batch_dims)
    m = math.prod(lhs.shape[d] for d in m_dims)
    n = math.prod(rhs.shape[d] for d in n_dims)
    k = math.prod(lhs.shape[d] for d in k_dims)
    problem, why_not = gemm.gemm_problem(batch, m, n, k, dtype, out_dtype, trans_a, trans_b,
                                         precision)
  return problem, layout, dtype, out_dtype, why_not


def why_not_on_kernels(lhs, rhs, dimension_numbers, precision=None,
                       preferred_element_type=None, out_sharding=None, *,
                       backend: str = "auto") -> str | None:
  """None where `dot_general` with these arguments runs on `matmul_p`, else why it does
  not: the reason that `backend="auto"` hands the call to `lax.dot_general` for, or the
  NotImplementedError's message of a named backend. lhs and rhs may be abstract
  (`jax.ShapeDtypeStruct`, a jaxpr's avals): nothing is computed.

  >>> import jax, jax.numpy as jnp
  >>> i8 = jax.ShapeDtypeStruct((4, 8), jnp.int8)
  >>> why_not_on_kernels(i8, i8, (((1,), (1,)), ((), ())))[:40]
  "jaxgemm's kernels take floating operands"
  """
  out_sharding = sharding.canonical_out_sharding(out_sharding, "dot_general")
  problem, _, _, _, why_not = _dot_general_problem(
      lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding)
  try:
    params = gemm.kernel_params(problem, backend, None, None, why_not)
  except NotImplementedError as e:
    return str(e)
  return why_not if params is None else None


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None, *, backend: str = "auto", variant: str | None = None,
                config: KernelConfig | None = None, overlap: bool | None = None) -> jax.Array:
  """`lax.dot_general` on jaxgemm's kernels, with the same signature and result.

  Pass it as the `dot_general=` of model layers (e.g. flax's `nn.Dense`).
  Dimension numbers whose batch dimensions lead both operands and which
  contract one run of adjacent dimensions at either end of each side run on `matmul_p`;
  others run on `lax.dot_general` under backend="auto" and raise
  NotImplementedError for a named backend. `out_sharding` is lax's: the
  result's sharding on a mesh with Explicit axes. `overlap` is `jaxgemm.matmul`'s:
  on a mesh, whether a collective the call needs runs as a ring under the local
  GEMMs (`jaxgemm.collective_matmul`; None: not yet, as False).

  Example:
    >>> import jax.numpy as jnp, jaxgemm
    >>> x = jnp.ones((2, 5, 8)); w = jnp.ones((8, 3))
    >>> jaxgemm.dot_general(x, w, (((2,), (0,)), ((), ())), backend="xla").shape
    (2, 5, 3)
  """
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  collective_matmul.check_overlap(overlap)
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
  problem, layout, dtype, out_dtype, why_not = _dot_general_problem(
      lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding)
  if preferred_element_type is None:
    preferred_element_type = out_dtype
  params = gemm.kernel_params(problem, backend, variant, config, why_not)
  if params is None:
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type,
                           out_sharding=out_sharding)
  trans_a, trans_b, batch_dims, m_dims, k_dims, n_dims = layout
  # matmul_p's result is dot_general's: batch, then lhs's free, then rhs's free dims.
  return bind(lhs.astype(dtype), rhs.astype(dtype), trans_a=trans_a, trans_b=trans_b,
              out_dtype=out_dtype, acc_dtype=problem.acc_dtype, precision=problem.precision,
              ndims=(len(batch_dims), len(m_dims), len(k_dims), len(n_dims)),
              out_sharding=out_sharding,
              overlap=overlap, **params)
