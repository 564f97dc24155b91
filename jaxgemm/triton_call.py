"""Calling our Triton kernels from JAX: on GPU through jax-triton, on CPU in Triton's interpreter.

Why integers are constexprs
---------------------------
jax-triton 0.3.1 compiles a kernel with the divisibility-16 attribute on every
pointer but on none of the integer arguments, while Triton's own launcher marks
an integer divisible by 16 when it is. Without that, Triton cannot prove that
rows of A and B start 16-byte aligned, so it drops vectorized loads and the
cp.async software pipeline: the Triton tutorial matmul ran at 33.7 TFLOP/s
through jax-triton against 750.6 natively on the H200 (4096^3 bf16,
../shared/GPU_NOTES.md), and its sm_90 PTX had 0 cp.async against 56.

Shapes are static under jit, so we hand Triton more than its launcher would:
every integer a kernel takes (M, N, K, strides) is a `tl.constexpr`, passed as
a keyword. Triton then knows exact divisibility (and folds the index math);
the price is one compilation per distinct shape, which XLA pays anyway.
`call` refuses positional integers so the mistake cannot come back silently,
and tests/test_triton_ptx.py compiles a kernel the way jax-triton does and
checks its PTX for cp.async and wgmma.

CPU: the same kernel source runs in Triton's interpreter inside a
`jax.pure_callback` on torch CPU tensors. The interpreter stores bfloat16 as raw
uint16 bits and only decodes them in explicit casts; its dot and arithmetic run
on the bits (a relative error ~1e10 was seen). Kernels therefore take an
`UPCAST_OPERANDS` constexpr that `interpreting_bf16` turns on for bf16 under
the interpreter: tiles are converted to fp32 right after loading, which is
exact, so the interpreted result is the GPU's bf16 x bf16 -> fp32 product.
A callback cannot run inside jit's partitioned program on several devices (the
process crashed): `jaxgemm.sharding` refuses that case when it lowers, before this
module is reached, and runs XLA there under `backend="auto"`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:
  import triton
except ImportError:  # the backend reports itself unavailable
  triton = None


@dataclasses.dataclass(frozen=True)
class Launch:
  """One kernel launch: what `call` needs besides the operands."""

  kernel: Any                    # a triton.JITFunction
  grid: tuple[int, ...]
  # One output, or a tuple of them (the kernel's last pointer arguments, in order).
  out_shape: jax.ShapeDtypeStruct | tuple[jax.ShapeDtypeStruct, ...]
  num_warps: int
  num_stages: int
  constexprs: tuple[tuple[str, Any], ...]

  @classmethod
  def make(cls, kernel, grid, out_shape, *, num_warps, num_stages, **constexprs):
    """None is a constexpr too: a pointer argument the kernel does not use (it must
    come after every array argument, which jax-triton passes by position)."""
    for name, value in constexprs.items():
      if (value is not None and not isinstance(value, (bool, int, str))
          or isinstance(value, np.generic)):
        raise TypeError(f"constexpr {name}={value!r} must be a Python bool, int, str or None")
    return cls(kernel, tuple(int(g) for g in grid), out_shape, num_warps, num_stages,
               tuple(sorted(constexprs.items())))


def interpreting_bf16(dtype, platform: str) -> bool:
  """Whether a kernel must upcast its tiles to fp32 (bf16 in the interpreter)."""
  return platform == "cpu" and np.dtype(dtype) == jnp.bfloat16


def call(launch: Launch, *arrays: jax.Array, platform: str):
  """Runs `launch` on `arrays` (device pointers in order, outputs appended last).

  Returns one array, or a tuple where `launch.out_shape` is a tuple."""
  for i, x in enumerate(arrays):
    if isinstance(x, (bool, int, float)):
      raise TypeError(f"argument {i} is a Python scalar ({x!r}): pass integers as "
                      f"constexpr keywords, jax-triton drops their divisibility")
  if platform == "cpu":
    return _interpret(launch, *arrays)
  import jax_triton  # noqa: PLC0415 (imports only where a GPU jaxlib is installed)
  return jax_triton.triton_call(
      *arrays, kernel=launch.kernel, out_shape=launch.out_shape, grid=launch.grid,
      num_warps=launch.num_warps, num_stages=launch.num_stages, **dict(launch.constexprs))


# ------------------------------------------------------------------ the interpreter

# Triton's interpreter patches `triton.language` globally while a kernel runs,
# so two launches at once corrupt each other ("Cannot call @triton.jit'd
# outside of the scope of a kernel"); XLA:CPU runs independent callbacks of
# one program on several threads (the tuner's rotated input sets do).
_INTERPRETER_LOCK = threading.Lock()


def _interpret(launch: Launch, *arrays):
  def on_host(*host_arrays):
    import torch  # noqa: PLC0415 (tests-only dependency: the interpreter's tensors)
    tensors = [_to_torch(np.array(x)) for x in host_arrays]  # writable copies for torch
    shapes = launch.out_shape if isinstance(launch.out_shape, tuple) else (launch.out_shape,)
    outs = [np.empty(s.shape, s.dtype) for s in shapes]
    with _INTERPRETER_LOCK, _interpreted_language():
      _interpreted(launch.kernel)[launch.grid](*tensors, *map(_to_torch, outs),
                                               **dict(launch.constexprs))
    # the torch tensors share the arrays' memory
    return tuple(outs) if isinstance(launch.out_shape, tuple) else outs[0]
  return jax.pure_callback(on_host, launch.out_shape, *arrays)


def _to_torch(x: np.ndarray):
  import torch  # noqa: PLC0415
  if x.dtype == jnp.bfloat16:
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
  return torch.from_numpy(np.ascontiguousarray(x))


_INTERPRETED: dict[Any, Any] = {}  # python function -> its InterpretedFunction clone


def _interpreted(fn):
  """`fn` as an InterpretedFunction whose @triton.jit helpers are interpreted too.

  Our kernel modules are imported with real @triton.jit objects (the GPU path
  compiles them), and the interpreter cannot call those as device functions
  ("Cannot call @triton.jit'd outside of the scope of a kernel"). So we clone
  the function tree, giving each clone globals in which every JITFunction is
  its interpreted clone. The modules themselves are untouched.
  """
  from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415

  fn = getattr(fn, "fn", fn)  # a JITFunction's python function
  if fn not in _INTERPRETED:
    fn_globals = dict(fn.__globals__)
    copy = types.FunctionType(fn.__code__, fn_globals, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    _INTERPRETED[fn] = InterpretedFunction(copy)
    for name, value in fn.__globals__.items():
      if isinstance(value, triton.JITFunction):
        fn_globals[name] = _interpreted(value)
  return _INTERPRETED[fn]


@contextlib.contextmanager
def _interpreted_language():
  """triton.language switched to the interpreter while a kernel runs, and back after.

  Two things, both undone on exit so that compiling for the GPU later in the
  same process sees the real language (a PTX test after an interpreted run
  failed before this):
  * triton.language's own @jit functions (tl.zeros, tl.cdiv, ...) are swapped
    for interpreted clones: kernels reach them as attributes of `tl`;
  * the interpreter patches tl and tl.core with its builtins at each device
    function call and restores only the outermost call's patches, so we take
    one patch scope over both modules first and restore it last;
  * a scalar tensor's `__index__` takes the value of its one-element array
    (`_patch_lang_tensor_index`): the loop bounds of our kernels depend on it.
  """
  import triton.language as tl  # noqa: PLC0415
  from triton.runtime import interpreter  # noqa: PLC0415

  originals = {n: v for n, v in vars(tl).items() if isinstance(v, triton.JITFunction)}
  patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
  if patch_tensor is not None:
    interpreter._patch_lang_tensor = _patch_lang_tensor_index(patch_tensor)
  try:
    scope = interpreter._patch_lang(
        types.SimpleNamespace(__globals__={"tl": tl, "core": tl.core}))
    try:
      for name, jit_fn in originals.items():
        setattr(tl, name, _interpreted(jit_fn))
      yield
    finally:
      for name, jit_fn in originals.items():
        setattr(tl, name, jit_fn)
      scope.restore()
  finally:
    if patch_tensor is not None:
      interpreter._patch_lang_tensor = patch_tensor


def _patch_lang_tensor_index(patch_tensor):
  """The interpreter's `_patch_lang_tensor` (run at every device function call),
  then `tensor.__index__` as Triton 3.9 has it: int of the squeezed array.

  The interpreter holds a scalar as a one-element 1-D numpy array: program_id,
  and under Triton 3.6 every assigned value (its AST rewrite wraps the right
  side of each `x = ...` in `to_tensor`). Triton 3.6's `__index__` is
  `int(array)`, which NumPy 2.4 refuses for ndim > 0 ("only 0-dimensional arrays
  can be converted to Python scalars"), so `range(0, tl.cdiv(k_len, BLOCK_K))`
  (split-K, the fused epilogue kernel) and the persistent
  `tl.range(tl.program_id(0), ...)` failed there. Host-side only: compiled
  kernels never see this.
  """
  def patched(tensor, scope):
    patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
  return patched
