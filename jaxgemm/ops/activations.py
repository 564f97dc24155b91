"""The epilogue activations of `fused_matmul` and `glu`, each exactly as `jax.nn` defines it.

One table for every backend: the XLA backend and the references call `apply`,
the kernels implement the same formulas (Triton:
`jaxgemm.kernels.triton.epilogue`, Pallas: `jaxgemm.kernels.pallas.epilogue`)
and are tested against `apply` and `derivative`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_FUNCTIONS = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}
ACTIVATIONS = tuple(_FUNCTIONS)


def check(activation, argument: str = "activation", *, allow_none: bool = True) -> None:
  """ValueError naming `argument` and the valid names unless `activation` is one."""
  if activation is None and allow_none:
    return
  if not isinstance(activation, str) or activation not in _FUNCTIONS:
    valid = ([None] if allow_none else []) + list(ACTIVATIONS)
    raise ValueError(f"unknown {argument}={activation!r}; valid activations: {valid}")


def apply(activation: str | None, z: jax.Array) -> jax.Array:
  """activation(z) as jax.nn computes it (None: z itself)."""
  return z if activation is None else _FUNCTIONS[activation](z)


def derivative(activation: str | None, z: jax.Array) -> jax.Array:
  """d activation / dz at z, elementwise (None: ones), itself differentiable.

  The derivative of jax.nn's own definition (relu'(0) = 0, as jax.grad has it).
  """
  if activation is None:
    return jnp.ones_like(z)
  return jax.jvp(_FUNCTIONS[activation], (z,), (jnp.ones_like(z),))[1]
