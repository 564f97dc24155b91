"""Helpers shared by every rung of the Pallas Mosaic GPU GEMM ladder.

One place for what all rungs need the same way:

* version shims (jax 0.10.2 on CPU/CI, 0.11.2 on the GPU machine): the GPU
  interpreter's params class and the SM count;
* swizzled shared-memory layouts (`smem_transforms`) for 16-bit operands;
* operand blocks for both transpose flags (`a_block`, `b_block` slice the GMEM
  ref as stored, `a_operand`, `b_operand` give wgmma its (tm, tk) / (tk, tn)
  view of the SMEM tile through `plgpu.transpose_ref`);
* `run_padded`: Mosaic GPU describes each GMEM array to TMA through the SMEM
  tile layout, whose (8, 128-byte) tiling must divide the whole array, so a
  stored dimension that is not such a multiple is zero-padded once in the
  wrapper (aligned problems are untouched); every other raggedness (M, N, K
  not multiples of the tiles) is left to TMA, which zero-fills out-of-bounds
  loads and skips out-of-bounds stores, so no kernel needs a tail path. C
  is padded and sliced too, unless the rung stores it exact (`stores_exact`);
* `tile_coords`: the L2-friendly tile order of the persistent rungs;
* `smem_bytes`: what a config puts in shared memory, checked before launch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


# ---------------------------------------------------------------- version shims

def interpret_params() -> Any:
  """The Mosaic GPU interpreter's params, to pass as `plgpu.kernel(interpret=)`.

  The class moved between releases (jax 0.10.2 has it only under
  `jax._src.pallas.mosaic_gpu.interpret.params`). Out-of-bounds reads return
  zeros, as TMA's zero fill does on the GPU, so the interpreter runs the very
  kernels whose ragged edges rely on it. (`interpret=True` would pick the plain
  HLO interpreter, which knows nothing of TMA, barriers or wgmma.)
  """
  _patch_interpreter()
  cls = getattr(plgpu, "InterpretGPUParams", None) or getattr(plgpu, "InterpretParams", None)
  if cls is None:
    from jax._src.pallas.mosaic_gpu.interpret import params as _params  # noqa: PLC0415
    cls = _params.InterpretGPUParams
  return cls(out_of_bounds_reads="uninitialized", uninitialized_memory="zero")


@functools.cache
def _patch_interpreter() -> None:
  """Teaches the Mosaic GPU interpreter two things the hardware does.

  Seen in jax 0.10.2's interpreter (`gpu_callbacks`), both gaps against what
  the GPU does with the same kernel:
  1. `wgmma` reads its operands through NDIndexer transforms only and fails on
     `plgpu.transpose_ref` (AttributeError: 'TransposeTransform' object has no
     attribute 'indices'), yet wgmma reads MN-major 16-bit operands natively:
     the transposed-operand GEMMs (trans_a, trans_b) need it.
  2. `copy_smem_to_gmem` drops a TMA store that is partly out of bounds
     entirely, where TMA writes the in-bounds part: ragged edge tiles need it.
  Both replacements do the same work as the originals plus that. When the
  interpreter's internals differ (another jax), nothing is patched.
  """
  try:
    from jax._src.pallas.mosaic.interpret import utils as iutils  # noqa: PLC0415
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks as gc  # noqa: PLC0415
    from jax._src.state.types import TransposeTransform  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    key_cls, noop = gc.HostAllocationKey, gc.NOOP_TRANSFORMS
    shared_memory, logging_info_cls = gc._get_shared_memory, iutils.GPULoggingInfo
    orig_wgmma, orig_store = gc.wgmma, gc.copy_smem_to_gmem
  except (ImportError, AttributeError):
    return

  def split(transforms):
    """(NDIndexer-only transforms, permutation to apply after the read or None)."""
    kept, perm = [], None
    for t in transforms:
      if isinstance(t, noop):
        continue
      if isinstance(t, TransposeTransform):
        p = tuple(t.permutation)
        perm = p if perm is None else tuple(perm[i] for i in p)
      else:
        if perm is not None:  # an index after a transpose: leave it to jax
          raise NotImplementedError
        kept.append(t)
    return tuple(kept), perm

  def read(mem, key_arr, transforms, tid, info):
    transforms, perm = split(jax.tree.map(int, transforms))
    val, _, _ = mem.get_buffer_content(key_cls.from_array(key_arr),
                                       iutils.to_range(transforms), tid, logging_info=info)
    return val if perm is None else np.transpose(val, perm)

  def wgmma(*, token, device_id, grid_point_coords, thread_id, acc_allocation_key_as_array,
            acc_transforms, acc_dtype, a_allocation_key_as_array, a_transforms,
            b_allocation_key_as_array, b_transforms, source_info=None):
    try:
      split(jax.tree.map(int, a_transforms)), split(jax.tree.map(int, b_transforms))
    except NotImplementedError:
      transposed = False
    else:
      transposed = any(isinstance(t, TransposeTransform)
                       for t in (*a_transforms, *b_transforms))
    if not transposed:
      return orig_wgmma(
          token=token, device_id=device_id, grid_point_coords=grid_point_coords,
          thread_id=thread_id, acc_allocation_key_as_array=acc_allocation_key_as_array,
          acc_transforms=acc_transforms, acc_dtype=acc_dtype,
          a_allocation_key_as_array=a_allocation_key_as_array, a_transforms=a_transforms,
          b_allocation_key_as_array=b_allocation_key_as_array, b_transforms=b_transforms,
          source_info=source_info)
    mem = shared_memory()
    tid = mem.get_global_thread_id(int(device_id), int(thread_id))
    info = logging_info_cls(device_id=int(device_id),
                            grid_point_coords=tuple(int(x) for x in grid_point_coords),
                            thread_id=int(thread_id), source_info=source_info)
    a = read(mem, a_allocation_key_as_array, a_transforms, tid, info)
    b = read(mem, b_allocation_key_as_array, b_transforms, tid, info)
    acc_key = key_cls.from_array(acc_allocation_key_as_array)
    acc_range = iutils.to_range(split(jax.tree.map(int, acc_transforms))[0])
    acc, _, _ = mem.get_buffer_content(acc_key, acc_range, tid, logging_info=info)
    mem.store_buffer_content(acc_key, acc_range, acc + np.matmul(a, b, dtype=acc_dtype),
                             tid, logging_info=info)
    return token

  def copy_smem_to_gmem(*, token, dst_allocation_key_as_array, dst_transforms,
                        predicate, reduction_op, **kwargs):
    # Run the original; if its store was dropped as out of bounds, write the
    # in-bounds part, as TMA does.
    result = orig_store(token=token, dst_allocation_key_as_array=dst_allocation_key_as_array,
                        dst_transforms=dst_transforms, predicate=predicate,
                        reduction_op=reduction_op, **kwargs)
    mem = shared_memory()
    dst_key = key_cls.from_array(dst_allocation_key_as_array)
    dst_range = iutils.to_range(split(jax.tree.map(int, dst_transforms))[0])
    with mem.lock:
      buf = mem.mem[dst_key]
      rnge = buf._normalize_range(dst_range)
      partial = iutils.is_range_out_of_bounds_for_shape(rnge, buf.shape)
    if partial:
      src_key = key_cls.from_array(kwargs["src_allocation_key_as_array"])
      src_range = iutils.to_range(split(jax.tree.map(int, kwargs["src_transforms"]))[0])
      tid = mem.get_global_thread_id(int(kwargs["device_id"]), int(kwargs["thread_id"]))
      val, _, _ = mem.get_buffer_content(src_key, src_range, tid)
      with mem.lock:
        mem.mem[dst_key].set_in_bounds_portion(dst_range, val)
    return result

  gc.wgmma = wgmma
  gc.copy_smem_to_gmem = copy_smem_to_gmem


# jax 0.10 takes load's index as an argument; 0.11 deprecates it (DeprecationWarning in the H200 GPU
# tier at 0834948) and
# takes the reference already indexed.
_LOAD_IDX = inspect.signature(plgpu.load).parameters.get("idx")
_LOAD_TAKES_INDEX = _LOAD_IDX is not None and _LOAD_IDX.default is inspect.Parameter.empty


def load_gmem(ref):
  """All of GMEM `ref` into registers, without a conflict-free plan (GMEM has none)."""
  if _LOAD_TAKES_INDEX:
    return plgpu.load(ref, (), optimized=False)
  return plgpu.load(ref, optimized=False)


def num_sms(interpret: bool) -> int:
  """SMs on the device (132 on an H200); a small grid in the interpreter.

  The interpreter simulates every CTA in turn on the CPU, so a persistent
  kernel there gets 2 CTAs: enough to exercise the tile loop's striding.
  (The stream-K tests give it 6, three 2-CTA clusters to share a round.)
  """
  if interpret:
    return 2
  device = jax.devices()[0]
  return getattr(device, "core_count", None) or 132


# ---------------------------------------------------------------- layouts

def swizzle_bytes(minor_elems: int, dtype) -> int:
  """The largest wgmma-compatible swizzle for a minor dimension of `minor_elems`."""
  return plgpu.find_swizzle(minor_elems * jnp.dtype(dtype).itemsize * 8)


def smem_transforms(minor_elems: int, dtype, swizzle: int | None = None) -> tuple[Any, ...]:
  """(8, swizzle) tiling + swizzle: the SMEM layout wgmma and TMA both read.

  `swizzle` defaults to the largest one `minor_elems` allows (`swizzle_bytes`).
  """
  swizzle = swizzle or swizzle_bytes(minor_elems, dtype)
  swizzle_elems = swizzle // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, swizzle_elems)), plgpu.SwizzleTransform(swizzle))


def a_tile_shape(tm: int, tk: int, trans_a: bool) -> tuple[int, int]:
  """A's SMEM tile as stored: (tm, tk), or (tk, tm) when A is stored (K, M)."""
  return (tk, tm) if trans_a else (tm, tk)


def b_tile_shape(tk: int, tn: int, trans_b: bool) -> tuple[int, int]:
  """B's SMEM tile as stored: (tk, tn), or (tn, tk) when B is stored (N, K)."""
  return (tn, tk) if trans_b else (tk, tn)


def operand_swizzle(tm: int, tn: int, tk: int, dtype, trans_a: bool, trans_b: bool) -> int:
  """The one swizzle (bytes) of A's and B's SMEM tiles, the largest all three allow.

  wgmma reads both operands with one swizzle and steps through K in groups of
  a swizzle span, so the swizzle must divide A's and B's stored minor
  dimensions and the K step. Each tile's own largest swizzle is not enough:
  on the H200 (jax 0.11.2) a 32-deep K step next to 128-wide tiles failed to
  compile, with a bare `AssertionError` for A @ B (jax 0.10.2 says "WGMMA rhs
  swizzle must match lhs swizzle") and "K must be a multiple of 64, got: 32"
  for A^T @ B (the 256x192-tile and swizzle probe at 0834948, H200).
  The tiles of the default and tuned configs (all >= 64 wide) get 128 bytes.
  """
  return min(swizzle_bytes(d, dtype) for d in (a_tile_shape(tm, tk, trans_a)[1],
                                               b_tile_shape(tk, tn, trans_b)[1], tk))


def a_smem_type(tm: int, tk: int, dtype, trans_a: bool, *lead: int, swizzle: int):
  shape = a_tile_shape(tm, tk, trans_a)
  return plgpu.SMEM((*lead, *shape), dtype,
                    transforms=smem_transforms(shape[1], dtype, swizzle))


def b_smem_type(tk: int, tn: int, dtype, trans_b: bool, *lead: int, swizzle: int):
  shape = b_tile_shape(tk, tn, trans_b)
  return plgpu.SMEM((*lead, *shape), dtype,
                    transforms=smem_transforms(shape[1], dtype, swizzle))


def out_smem_type(tm: int, tn: int, dtype, *lead: int):
  return plgpu.SMEM((*lead, tm, tn), dtype, transforms=smem_transforms(tn, dtype))


def a_block(a_gmem, m_start, k_start, tm: int, tk: int, trans_a: bool):
  """The (2-D, as stored) GMEM block of A holding rows [m_start, +tm), K [k_start, +tk)."""
  if trans_a:
    return a_gmem.at[pl.ds(k_start, tk), pl.ds(m_start, tm)]
  return a_gmem.at[pl.ds(m_start, tm), pl.ds(k_start, tk)]


def b_block(b_gmem, k_start, n_start, tk: int, tn: int, trans_b: bool):
  if trans_b:
    return b_gmem.at[pl.ds(n_start, tn), pl.ds(k_start, tk)]
  return b_gmem.at[pl.ds(k_start, tk), pl.ds(n_start, tn)]


def transposed(ref):
  """`ref` viewed transposed (2-D), for wgmma's MN-major operand reads.

  `plgpu.transpose_ref` is what both jax 0.10.2 and 0.11.2 have; 0.11 marks it
  deprecated in favour of `ref.transpose(...)`, whose signature differs
  between ref types in 0.10.2, so we keep the one call and mute the warning.
  """
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return plgpu.transpose_ref(ref, (1, 0))


def a_operand(a_smem, trans_a: bool):
  """wgmma's (tm, tk) view of A's SMEM tile: 16-bit wgmma reads K-major or MN-major."""
  return transposed(a_smem) if trans_a else a_smem


def b_operand(b_smem, trans_b: bool):
  return transposed(b_smem) if trans_b else b_smem


def a_block_spec_args(tm: int, tk: int, trans_a: bool):
  """(block_shape, index_map(mi, ki)) of A for emit_pipeline-style BlockSpecs."""
  if trans_a:
    return (tk, tm), lambda mi, ki: (ki, mi)
  return (tm, tk), lambda mi, ki: (mi, ki)


def b_block_spec_args(tk: int, tn: int, trans_b: bool):
  if trans_b:
    return (tn, tk), lambda ni, ki: (ni, ki)
  return (tk, tn), lambda ni, ki: (ki, ni)


def smem_bytes(*buffers: tuple[tuple[int, ...], Any]) -> int:
  """Bytes of the SMEM buffers given as (shape, dtype) pairs."""
  return sum(math.prod(shape) * jnp.dtype(dtype).itemsize for shape, dtype in buffers)


# ---------------------------------------------------------------- tile order

def tile_coords(lin_idx, m_tiles: int, n_tiles: int, batch: int, grid_minor_m: bool,
                group: int):
  """(batch, m tile, n tile) of the `lin_idx`-th tile in an L2-friendly order.

  Batch-major (batches share no operand), then within the batch: bands of
  `group` tiles across the minor dimension (M if `grid_minor_m`, else N),
  each band walked along the major dimension, every other band backwards (a
  snake), so CTAs in flight at once touch `group` tiles of one operand and a
  run of the other's, and a band change reuses the tiles just loaded.

  Our own rather than `plgpu.planar_snake`: that one evaluates its partial-
  band branch with a remainder by zero when `group` divides the minor size
  (harmless on the GPU, a SIGFPE in the CPU interpreter).
  """
  del batch
  minor_size, major_size = (m_tiles, n_tiles) if grid_minor_m else (n_tiles, m_tiles)
  w = max(1, min(group, minor_size))
  full_bands = minor_size // w
  w_last = max(1, minor_size - full_bands * w)   # the partial band's width (if any)
  i32 = jnp.int32
  lin_idx = lin_idx.astype(i32) if hasattr(lin_idx, "astype") else i32(lin_idx)
  bi = lax.div(lin_idx, i32(m_tiles * n_tiles))
  r = lax.rem(lin_idx, i32(m_tiles * n_tiles))
  band = lax.div(r, i32(w * major_size))
  in_full = band < full_bands
  width = jnp.where(in_full, i32(w), i32(w_last))
  j = r - band * i32(w * major_size)
  minor = band * i32(w) + lax.rem(j, width)
  major = lax.div(j, width)
  major = jnp.where(lax.rem(band, i32(2)) == 0, major, i32(major_size - 1) - major)
  return (bi, minor, major) if grid_minor_m else (bi, major, minor)


# ---------------------------------------------------------------- wrapper

def _pad_to(x, row_multiple: int, col_multiple: int):
  """Zero-pads the last two dimensions of `x` up to the given multiples."""
  pads = [(0, 0)] * (x.ndim - 2) + [(0, -x.shape[-2] % row_multiple),
                                    (0, -x.shape[-1] % col_multiple)]
  if all(p == (0, 0) for p in pads):
    return x
  return jnp.pad(x, pads)


# Mosaic GPU describes a GMEM array to TMA through the SMEM tile's layout:
# an (8 rows, swizzle) tiling, which must divide the whole array (jax raises
# "dimension 2 must have size smaller or a multiple of its tiling 64"
# otherwise). 128 bytes covers every swizzle we pick.
ROW_MULTIPLE = 8
SWIZZLE_SPAN_BYTES = 128


def col_multiple(dtype) -> int:
  return SWIZZLE_SPAN_BYTES // jnp.dtype(dtype).itemsize


def round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Dims:
  """The kernel's view of the problem: sizes of the (padded) stored arrays."""

  batch: int
  m: int        # rows of C (M rounded up to 8, or M itself when C is stored exact)
  n: int        # columns of C (N rounded up to the 128-byte swizzle span, or N)
  k: int        # the contracting size the K loop covers


def tma_storable(problem, out_dtype) -> bool:
  """Whether C at its true shape is describable to TMA (see `run_padded`)."""
  return problem.m % ROW_MULTIPLE == 0 and problem.n % col_multiple(out_dtype) == 0


def stores_exact(problem, out_dtype) -> bool:
  """Whether a persistent rung should write C at its true shape with plain stores.

  When C's shape is not TMA-describable, the padded C would have to be cut
  down by XLA: for an odd element count that slice is an unvectorized copy
  (4095x4093 bf16: 80 us against the kernel's own 174 us, while a
  (4096, 4093) slice of the same array takes 21 us;
  the Pallas padding and slice probe at 0834948, H200). The persistent
  rungs then store each tile straight from registers to C, their edge tiles
  in windows that end at C's edge (`warp_specialized.store_exact`).
  """
  return not tma_storable(problem, out_dtype)


def run_padded(kernel_fn, a, b, problem, *, out_dtype, exact_out: bool = False):
  """Calls `kernel_fn(a, b, dims) -> c` on TMA-describable operands; slices C.

  Aligned problems (every dimension a multiple of 64) pass through untouched.
  Otherwise the two stored dimensions of each operand are zero-padded to the
  multiples above (one pad copy per operand); zeros in K contribute nothing.
  C is computed padded and sliced (one more copy), unless `exact_out`: then
  the kernel writes C at its true shape itself (`stores_exact`). What stays
  ragged relative to the *tiles* (a 4096-row array under 256-row tiles is
  fine, a 4104-row one is not a multiple) is TMA's: out-of-bounds loads are
  zero-filled, out-of-bounds stores dropped.
  """
  cm = col_multiple(a.dtype)
  a = _pad_to(a, ROW_MULTIPLE, cm)
  b = _pad_to(b, ROW_MULTIPLE, cm)
  k = max(a.shape[1] if problem.trans_a else a.shape[2],
          b.shape[2] if problem.trans_b else b.shape[1])
  if exact_out:
    return kernel_fn(a, b, Dims(problem.batch, problem.m, problem.n, k))
  m_out = round_up(problem.m, ROW_MULTIPLE)
  n_out = round_up(problem.n, col_multiple(out_dtype))
  c = kernel_fn(a, b, Dims(problem.batch, m_out, n_out, k))
  if (m_out, n_out) != (problem.m, problem.n):   # C, or each output of an epilogue
    c = jax.tree.map(lambda x: x[:, :problem.m, :problem.n], c)
  return c


def k_major_operands(a, b, problem):
  """(A, B, problem) with both operands K-major when they are 32-bit (TF32 wgmma).

  wgmma multiplies fp32 operands as TF32 and reads them only K-major from
  shared memory (A stored (M, K), B stored (N, K)): Mosaic GPU raises "Only
  f16 WGMMA supports transposes" otherwise. An operand stored the other way
  is transposed once by XLA (one pass over it: 2 x 4 x K x N bytes for B in
  A @ B, against the GEMM's 2 x M x N x K FLOPs), as Triton's rungs do
  (`jaxgemm.kernels.triton.matmul.layout`). 16-bit operands pass untouched:
  wgmma reads them MN-major too.
  """
  if jnp.dtype(a.dtype).itemsize != 4:
    return a, b, problem
  if problem.trans_a:
    a = jnp.swapaxes(a, 1, 2)
  if not problem.trans_b:
    b = jnp.swapaxes(b, 1, 2)
  return a, b, dataclasses.replace(problem, trans_a=False, trans_b=True)


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def store_tile(acc, out_smem, c_gmem_tile):
  """The basic epilogue: f32 registers -> out dtype in SMEM -> TMA store.

  TMA skips the rows and columns of `c_gmem_tile` past the array's end, so a
  ragged edge tile needs no mask.
  """
  out_smem[...] = acc.astype(out_smem.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem, c_gmem_tile)


compiler_params = functools.partial(
    plgpu.CompilerParams, lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
