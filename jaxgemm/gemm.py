"""The GEMM family's shared layer: what the GEMM ops and their kernels all use.

The ops `matmul`, `fused_matmul`, `glu`, `scaled_matmul` and `ragged_dot` (and the
kernels under `jaxgemm.kernels`) import these from here, not from one another. What
belongs here is what more than one op (or an op and a kernel) needs the same way:

* the hardware the tiles are sized for: `SMEM_CAPACITY_BYTES`, `DEFAULT_NUM_SMS`,
  and the tile helpers `pow2_at_least` and `tile_count`; `mosaic_gpu_error`, why
  the Pallas backends cannot run here;
* the canonical GEMM: `GemmProblem` (matmul's problem, which the epilogue and FP8
  problems extend) and `dimension_groups`, the (batch, M, K, N) groups of the
  primitives' operands;
* `jnp.matmul`'s contract, applied up front by every GEMM op's public function:
  `canonical_layout`, `matmul_dtypes`, `canonical_precision`, `gemm_problem` and
  `kernel_params` (the kernel choice checked before anything is traced);
* the FP8 formats: operand and scale dtypes, the 128-wide scale `BLOCK` and the
  block scales' shapes (`scale_shape`).

What one op alone uses stays in its package (`jaxgemm/ops/<op>/`). This module sits
below the ops and the kernels: it imports neither (`tests/test_imports.py`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import dispatch, registry
from jaxgemm.config import KernelConfig
from jaxgemm.ops.base import Problem, fp32_precision

# ---------------------------------------------------------------- hardware and tiles

# Hopper's (sm_90's) opt-in shared memory per CTA, 227 KiB: what a config may fill.
SMEM_CAPACITY_BYTES = 227 * 1024
# Streaming multiprocessors of an H100/H200, for persistent and split-K grids where
# the device cannot be asked (a GPU compile on a machine without one).
DEFAULT_NUM_SMS = 132


def pow2_at_least(x: int, lo: int, hi: int) -> int:
  """The least power-of-two multiple of `lo` that covers `x`, at most `hi`: a tile
  clamped to the problem (a tile larger than the problem only adds masked work).

  >>> pow2_at_least(100, 16, 256), pow2_at_least(1000, 16, 256), pow2_at_least(3, 16, 256)
  (128, 256, 16)
  """
  p = lo
  while p < x and p < hi:
    p *= 2
  return p


def tile_count(problem: GemmProblem, block_m: int, block_n: int) -> int:
  """The output tiles of `problem` at block_m x block_n (ragged edges count whole)."""
  return problem.batch * -(-problem.m // block_m) * -(-problem.n // block_n)


def mosaic_gpu_error() -> str | None:
  """Why Pallas Mosaic GPU does not import here, or None: the Pallas backends' check."""
  try:
    from jax.experimental.pallas import mosaic_gpu  # noqa: F401, PLC0415
  except Exception as e:  # noqa: BLE001 (ImportError, or a broken plugin)
    return f"jax.experimental.pallas.mosaic_gpu does not import ({type(e).__name__}: {e})"
  return None


# ---------------------------------------------------------------- the canonical GEMM

@dataclasses.dataclass(frozen=True)
class GemmProblem(Problem):
  """One canonical GEMM: C[b] = op(A[b]) @ op(B[b]), op = transpose if flagged.

  >>> import numpy as np, jaxgemm
  >>> p = jaxgemm.GemmProblem(1, 128, 256, 64, np.dtype("float32"), np.dtype("float32"),
  ...                         np.dtype("float32"), trans_b=True)
  >>> p.describe(), p.b_shape
  ('1x(128x64 @ 64x256) NT float32->float32', (1, 256, 64))
  """

  op = "matmul"

  batch: int
  m: int
  n: int
  k: int
  dtype: np.dtype        # of both operands
  out_dtype: np.dtype
  acc_dtype: np.dtype
  trans_a: bool = False
  trans_b: bool = False
  precision: tuple[lax.Precision, lax.Precision] | None = None

  @property
  def a_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.k, self.m) if self.trans_a else (self.batch, self.m, self.k)

  @property
  def b_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.n, self.k) if self.trans_b else (self.batch, self.k, self.n)

  @property
  def out_shape(self) -> tuple[int, int, int]:
    return (self.batch, self.m, self.n)

  @property
  def dims(self) -> dict[str, int]:
    return {"b": self.batch, "m": self.m, "n": self.n, "k": self.k}

  @property
  def layout(self) -> str:
    """"NN", "NT", "TN" or "TT": which operands are stored transposed."""
    return ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k

  @property
  def min_bytes(self) -> int:
    """Bytes moved when each operand is read once and the output written once."""
    elems_in = self.batch * (self.m * self.k + self.k * self.n)
    return (elems_in * np.dtype(self.dtype).itemsize
            + self.batch * self.m * self.n * np.dtype(self.out_dtype).itemsize)

  @property
  def aligned(self) -> bool:
    """Whether every operand's and the output's rows are 16-byte aligned."""
    item, out_item = np.dtype(self.dtype).itemsize, np.dtype(self.out_dtype).itemsize
    a_row = self.m if self.trans_a else self.k
    b_row = self.k if self.trans_b else self.n
    return a_row * item % 16 == 0 and b_row * item % 16 == 0 and self.n * out_item % 16 == 0

  @property
  def fp32_precision(self) -> str | None:
    """How fp32 operands are multiplied: "tf32", "tf32x3" or "ieee" (None if not fp32)."""
    return fp32_precision(self.dtype, self.precision)

  @property
  def accuracy_class(self) -> str:
    return self.fp32_precision or np.dtype(self.dtype).name

  def cache_fields(self) -> tuple[str, ...]:
    dtypes = f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}"
    return (dtypes, self.fp32_precision or "default", self.layout)

  def describe(self) -> str:
    return (f"{self.batch}x({self.m}x{self.k} @ {self.k}x{self.n}) {self.layout} "
            f"{np.dtype(self.dtype).name}->{np.dtype(self.out_dtype).name}")


def dimension_groups(a_shape, b_shape, *, trans_a, trans_b, ndims):
  """The (batch, M, K) dims of a and the (batch, K, N) dims of b, as shape tuples.

  `ndims` counts the dimensions of each group (batch, M, K, N), as the GEMM
  primitives' param of that name (`jaxgemm.ops.matmul.primitive` has the form).

  >>> dimension_groups((2, 5, 7, 3), (2, 3, 4), trans_a=False, trans_b=False,
  ...                  ndims=(1, 2, 1, 1))
  (((2,), (5, 7), (3,)), ((2,), (3,), (4,)))
  """
  nb, nm, nk, nn = ndims
  a_rest, b_rest = tuple(a_shape[nb:]), tuple(b_shape[nb:])
  a_k, a_m = (a_rest[:nk], a_rest[nk:]) if trans_a else (a_rest[nm:], a_rest[:nm])
  b_n, b_k = (b_rest[:nn], b_rest[nn:]) if trans_b else (b_rest[nk:], b_rest[:nk])
  return (tuple(a_shape[:nb]), a_m, a_k), (tuple(b_shape[:nb]), b_k, b_n)


# ---------------------------------------------------------------- jnp.matmul's contract

@dataclasses.dataclass(frozen=True)
class MatmulLayout:
  """How `jnp.matmul(a, b)` maps onto the canonical form, with no copy of b."""

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


def matmul_operands(a, b) -> tuple[jax.Array, jax.Array]:
  """a and b as arrays, or numpy's error where one is a scalar (matmul needs a dimension)."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  for i, x in enumerate((a, b)):
    if x.ndim < 1:
      raise ValueError(f"matmul input operand {i} must have ndim at least 1, "
                       f"but it has ndim {x.ndim}")
  return a, b


def canonical_layout(a, b, api_name: str = "matmul") -> MatmulLayout:
  """The canonical layout of `jnp.matmul(a, b)`, or numpy's error for operands that do not fit.

  >>> canonical_layout(jnp.ones((4, 8, 16)), jnp.ones((16, 32))).ndims
  (0, 2, 1, 1)
  """
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


def matmul_dtypes(lhs, rhs, preferred_element_type) -> tuple[np.dtype, np.dtype]:
  """(operand dtype, result dtype) of `jnp.matmul(lhs, rhs, preferred_element_type=...)`.

  >>> matmul_dtypes(jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float32), None)
  (dtype('float32'), dtype('float32'))
  """
  dtype = jnp.result_type(lhs, rhs)
  if not jnp.issubdtype(dtype, jnp.number) and dtype != jnp.bool_:
    raise TypeError(f"matmul needs numeric operands, got dtypes {lhs.dtype} and {rhs.dtype}")
  out_dtype = (dtype if preferred_element_type is None
               else np.dtype(jax.dtypes.canonicalize_dtype(preferred_element_type)))
  return np.dtype(dtype), np.dtype(out_dtype)


def canonical_precision(precision) -> tuple[lax.Precision, lax.Precision] | None:
  """A pair of lax.Precision, or None for the default.

  precision=None means what it means to jnp.matmul: the current
  `jax.default_matmul_precision` setting ("float32" makes fp32 products exact
  on every backend), else the backend's default (TF32 tensor cores for fp32).

  >>> canonical_precision("highest") == (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
  True
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
  check_lax_takes_precision(given)
  raise NotImplementedError(
      f"jaxgemm kernels take precision=None, a lax.Precision or a pair of them; "
      f"got precision={given!r} (backend='auto' hands it to lax.dot_general)")


def check_lax_takes_precision(precision) -> None:
  """lax's own ValueError, which lists the valid precisions, for a `precision` that
  jnp.matmul and lax.dot_general refuse as well (a value they take, such as a
  lax.DotAlgorithmPreset, passes: the kernels' NotImplementedError is then the answer)."""
  x = jax.ShapeDtypeStruct((1, 1), jnp.float32)
  jax.eval_shape(lambda a, b: lax.dot(a, b, precision=precision), x, x)


def floating_dtypes_taken() -> str:
  """What the backends take, for the error of a dtype none of them does: float64 is XLA's
  alone (every kernel refuses it, naming its own dtypes, `registry.require_dtypes`)."""
  kernels = [d.name for d in registry.FLOAT_DTYPES if d != np.float64]
  return (f"jaxgemm's kernels take floating operands {kernels}, and backend='xla' float64 "
          f"as well")


def gemm_problem(batch, m, n, k, dtype, out_dtype, trans_a, trans_b,
                 precision) -> tuple[GemmProblem | None, str | None]:
  """(the canonical problem, None), or (None, why the kernels cannot take the call).

  >>> f32 = np.dtype("float32")
  >>> gemm_problem(2, 8, 16, 32, f32, f32, False, True, None)[0].describe()
  '2x(8x32 @ 32x16) NT float32->float32'
  """
  if dtype not in registry.FLOAT_DTYPES or out_dtype not in registry.FLOAT_DTYPES:
    return None, f"{floating_dtypes_taken()}; got dtype={dtype.name}, out dtype={out_dtype.name}"
  try:
    precision = canonical_precision(precision)
  except NotImplementedError as e:
    return None, str(e)
  acc_dtype = np.dtype(np.float64 if np.float64 in (dtype, out_dtype) else np.float32)
  return GemmProblem(batch, m, n, k, dtype, out_dtype, acc_dtype, trans_a, trans_b,
                     precision), None


def kernel_params(problem: Problem | None, backend: str, variant, config: KernelConfig | None,
                  why_not_canonical: str | None, *, op: str = GemmProblem.op
                  ) -> dict[str, Any] | None:
  """The primitive's kernel params for `problem`, or None: compute with lax instead.

  The returned variant and config are the caller's (None when not given);
  either way the choice is checked against `problem` here, before tracing.
  `problem` None means the kernels cannot take the call, `why_not_canonical` says
  why; `op` names the op whose backends `backend` and `variant` are then checked
  against (and, other than matmul, the call in the error).

  None happens only under backend="auto"; a named backend that cannot run the
  problem raises (NotImplementedError for unsupported features, ValueError or
  TypeError for bad arguments).
  """
  dispatch.validate(op if problem is None else problem.op, backend, variant, config)
  if problem is None:
    if backend == dispatch.AUTO:
      return None
    call = "call" if op == GemmProblem.op else op
    raise NotImplementedError(f"backend={backend!r} cannot run this {call}: "
                              f"{why_not_canonical}")
  dispatch.choose(problem, backend, variant, config)   # checks the choice before tracing
  # What the caller left open (None) is chosen per problem at lowering, so the
  # backward GEMMs, whose shapes differ, get their own variant and tiles.
  return dict(backend=backend, variant=variant, config=config)


# ---------------------------------------------------------------- FP8 formats

# The operand dtypes: Hopper's FP8 wgmma takes e4m3 and e5m2 in any pairing.
FP8_DTYPES = (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))
SCALE_DTYPE = np.dtype(np.float32)
# Scales come in float32, or as powers of two in the MX scale type (`quantize`'s
# scale_dtype); kernels read both as float32.
SCALE_DTYPES = (SCALE_DTYPE, np.dtype(jnp.float8_e8m0fnu))
# The width of a scale block along K (and N for b's 128x128 blocks): the interval
# at which the kernels promote their partial sums to fp32.
BLOCK = 128


def dtype_names(dtypes) -> list[str]:
  """The dtypes' names, as errors list what is valid.

  >>> dtype_names(FP8_DTYPES)
  ['float8_e4m3fn', 'float8_e5m2']
  """
  return [np.dtype(d).name for d in dtypes]


def dtype_among(value, allowed, op: str, arg: str) -> np.dtype:
  """`value` as a numpy dtype where it is one of `allowed`; else a TypeError naming
  the op's argument and the valid dtypes.

  >>> dtype_among("float32", SCALE_DTYPES, "quantize", "scale_dtype")
  dtype('float32')
  """
  try:
    dtype = np.dtype(value)
  except TypeError:
    dtype = None
  if dtype not in allowed:
    raise TypeError(f"{op}'s {arg} must be one of {dtype_names(allowed)}; got {arg}={dtype}")
  return dtype


def scale_shape(mode: str, rows: int, cols: int) -> tuple[int, int]:
  """The scales' shape of quantizing a (rows, cols) array in block `mode`: "row"
  (1x128 blocks) or "tile" (128x128).

  >>> scale_shape("row", 300, 300), scale_shape("tile", 300, 300)
  ((300, 3), (3, 3))
  """
  return (rows if mode == "row" else math.ceil(rows / BLOCK), math.ceil(cols / BLOCK))
