"""Fused epilogues of the persistent Pallas Mosaic GPU kernels: the math on fp32 registers.

Everything here runs inside a Mosaic GPU kernel on an fp32 register array (an
epilogue piece of the accumulator, (64, epi_tile_n)) and uses only ops that
lower there under warpgroup semantics (max, min, select, exp, tanh, division)
and in the Mosaic GPU interpreter on the CPU. The formulas are jax.nn's
(`jaxgemm.ops.activations`), written out:

    relu        max(z, 0)                          relu'(z) = 1 if z > 0 else 0
    gelu        z/2 (1 + tanh(c (z + 0.044715 z^3))), c = sqrt(2/pi)   (jax.nn.gelu, approximate)
    gelu_exact  z/2 (1 + erf(z / sqrt 2))
    silu        z sigmoid(z)
    sigmoid     1 / (1 + exp(-z))                  (lax.logistic as Mosaic GPU lowers it)
    tanh        tanh(z)                            tanh'(z) = (1 + t)(1 - t)

gelu_exact: jax.nn computes z erfc(-z / sqrt 2) / 2. Mosaic GPU lowers
neither erfc nor, under warpgroup semantics, erf ("No layout inference rule
defined for math.erf", jax 0.10.2), so `erf` here is the rational
approximation XLA and Eigen use for fp32 (x P(x^2) / Q(x^2), x clamped to
[-4, 4]; max abs error 4.2e-7 against math.erf), and gelu_exact is
z (1 + erf(z / sqrt 2)) / 2. On 400001 points of [-12, 12] in fp32 its max
abs error against jax.nn's formula in float64 is 1.2e-6 (jax.nn's own fp32:
3.8e-7), relative 1.0e-3 where |gelu| < 1e-3 (the fp32 cancellation of
1 + erf for z < -3); tests/test_fused_matmul_pallas.py::test_activation_formulas.

`Epilogue` describes one kernel's epilogue as compile-time switches; its
`combine` is the whole epilogue of one piece (bias, activation, residual,
the "out" gate, GLU's act(zg) * zu), returning the fp32 outputs to store.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

ACTIVATIONS = ("relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh")
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_INV_SQRT_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)


def erf(x):
  """erf in fp32 from +, *, / and max/min only (XLA's and Eigen's rational fp32 form)."""
  x = jnp.minimum(jnp.maximum(x, -4.0), 4.0)
  x2 = x * x
  p = x2 * _ERF_ALPHA[0] + _ERF_ALPHA[1]
  for c in _ERF_ALPHA[2:]:
    p = p * x2 + c
  q = x2 * _ERF_BETA[0] + _ERF_BETA[1]
  for c in _ERF_BETA[2:]:
    q = q * x2 + c
  return x * p / q


def _sigmoid(z):
  return 1.0 / (1.0 + jnp.exp(-z))


def activation(name: str | None, z):
  """name(z) on fp32 `z`, as jax.nn defines it (None: z)."""
  if name is None:
    return z
  if name == "relu":
    return jnp.maximum(z, 0.0)
  if name == "gelu":
    return z * (0.5 * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * (z * z * z)))))
  if name == "gelu_exact":
    return z * (0.5 * (1.0 + erf(z * _INV_SQRT_2)))
  if name == "silu":
    return z * _sigmoid(z)
  if name == "sigmoid":
    return _sigmoid(z)
  if name == "tanh":
    return jnp.tanh(z)
  raise NotImplementedError(f"activation {name!r} has no Pallas epilogue; valid: {ACTIVATIONS}")


def derivative(name: str | None, z):
  """d name / dz at fp32 `z`, as `jaxgemm.ops.activations.derivative` (relu'(0) = 0)."""
  if name is None:
    return jnp.ones_like(z)
  if name == "relu":
    return jnp.where(z > 0.0, 1.0, 0.0).astype(z.dtype)
  if name == "gelu":
    t = jnp.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * (z * z * z)))
    du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * (z * z))
    return 0.5 * (1.0 + t) + 0.5 * z * ((1.0 + t) * (1.0 - t)) * du
  if name == "gelu_exact":
    return (0.5 * (1.0 + erf(z * _INV_SQRT_2))
            + z * (_INV_SQRT_2PI * jnp.exp(-0.5 * (z * z))))
  if name == "silu":
    s = _sigmoid(z)
    return s + z * (s * (1.0 - s))
  if name == "sigmoid":
    s = _sigmoid(z)
    return s * (1.0 - s)
  if name == "tanh":
    t = jnp.tanh(z)
    return (1.0 + t) * (1.0 - t)
  raise NotImplementedError(f"activation {name!r} has no Pallas epilogue; valid: {ACTIVATIONS}")


@dataclasses.dataclass(frozen=True)
class Epilogue:
  """A persistent kernel's epilogue, as compile-time switches.

  Forward (`fused_matmul`): z = acc + bias; y = activation(z) + residual;
  outputs (y, z if save_preactivation). Gate "out": outputs (activation'(Z) * acc,)
  with Z a loaded tile (`gate` names the activation). GLU (`glu`): two
  accumulators, zg = acc_g + bias_g, zu = acc_u + bias_u, outputs
  (activation(zg) * zu, zg, zu if save_preactivation).

  Kernel operands after A and B, in order: B2 (glu), the biases (one, or two
  for glu; each (batch or 1, N padded) in the output dtype), the loaded tile
  tensor (residual or Z, (batch, M, N)); outputs: num_outputs arrays like C.
  """

  activation: str | None = None
  bias: str | None = None            # None, "shared" or "batched"
  residual: bool = False
  save_preactivation: bool = False
  gate: str | None = None            # the "out" gate's activation (its derivative multiplies)
  glu: bool = False

  def __post_init__(self):
    for name in (self.activation, self.gate):
      if name is not None and name not in ACTIVATIONS:
        raise NotImplementedError(
            f"activation {name!r} has no Pallas epilogue; valid: {ACTIVATIONS}")
    if self.gate is not None and (self.activation or self.bias or self.residual
                                  or self.save_preactivation or self.glu):
      raise ValueError("a gated epilogue has no bias, activation, residual or saved Z")
    if self.glu and self.residual:
      raise ValueError("the GLU epilogue takes no residual")

  @property
  def num_biases(self) -> int:
    return 0 if self.bias is None else (2 if self.glu else 1)

  @property
  def loads_tile(self) -> bool:
    """Whether each epilogue piece reads a (64, epi_tile_n) tile of a (batch, M, N) tensor."""
    return self.residual or self.gate is not None

  @property
  def num_outputs(self) -> int:
    if self.glu:
      return 3 if self.save_preactivation else 1
    return 2 if self.save_preactivation else 1

  def combine(self, accs, biases, loaded):
    """The fp32 outputs of one piece: `accs` the accumulator pieces (two for
    glu), `biases` the bias pieces (broadcast to the piece), `loaded` the
    loaded tile in fp32 (or None)."""
    if self.gate is not None:
      return [derivative(self.gate, loaded) * accs[0]]
    zs = [acc + b for acc, b in zip(accs, biases)] if biases else list(accs)
    if self.glu:
      h = activation(self.activation, zs[0]) * zs[1]
      return [h, *zs] if self.save_preactivation else [h]
    y = activation(self.activation, zs[0])
    if self.residual:
      y = y + loaded
    return [y, zs[0]] if self.save_preactivation else [y]
