"""Running our Pallas Mosaic GPU kernels on the CPU: the interpreter behind a pure callback.

On a GPU a backend's kernel function is lowered in place of the op's
primitive. Mosaic GPU's interpreter simulates TMA, barriers and wgmma with
*ordered* io callbacks, whose effect tokens a primitive's lowering (our ops'
primitives are effect-free) cannot thread through. So on the CPU the
interpreted kernel is compiled on its own and called from a `jax.pure_callback`:
the same kernel source, and the op stays pure for jit, grad and vmap. A callback
cannot run inside jit's partitioned program on several devices (the process
crashed): `jaxgemm.sharding` refuses that case when it lowers, and runs XLA there
under `backend="auto"`.
"""

from __future__ import annotations

import threading
from typing import Callable

import jax
import numpy as np

# The interpreter simulates a whole GPU's shared state; XLA:CPU may run
# independent callbacks of one program on several threads (the tuner's rotated
# input sets do): one interpreted kernel at a time, as for Triton's.
INTERPRETER_LOCK = threading.Lock()


def interpreted(kernel_fn: Callable[..., jax.Array],
                out_shape: jax.ShapeDtypeStruct) -> Callable[..., jax.Array]:
  """`kernel_fn` (run with interpret=True) as a function callable inside a lowering.

  `out_shape` may be a tuple of them (a kernel with several outputs)."""
  run = jax.jit(kernel_fn)

  def on_host(*operands):
    with INTERPRETER_LOCK:
      return jax.tree.map(np.asarray, run(*operands))

  return lambda *operands: jax.pure_callback(on_host, out_shape, *operands)
