"""`jaxgemm.matmul`: one public function over three ops, each call routed to its op.

    plain                           -> `matmul_p`          (jaxgemm/ops/matmul/api.py)
    bias=, activation=, residual=   -> `fused_matmul_p`    (jaxgemm/ops/fused_matmul/api.py)
    fp8=                            -> three `scaled_matmul` GEMMs in a custom VJP
                                       (jaxgemm/ops/scaled_matmul/training.py)

and `jaxgemm.ragged_dot` likewise: plain to `ragged_dot_p` (jaxgemm/ops/ragged_dot/api.py),
`fp8=` to FP8 grouped GEMMs in a custom VJP (jaxgemm/ops/scaled_ragged_dot/training.py).

It sits above the ops, so no op imports another to reach it: each op's own function
takes only what that op computes. `jaxgemm.dot_general` has no epilogue or FP8
argument, so it is matmul's own (`jaxgemm.ops.matmul.api.dot_general`).
"""

from __future__ import annotations

import dataclasses

import jax

from jaxgemm import gemm
from jaxgemm.config import KernelConfig
from jaxgemm.ops.fused_matmul import api as fused_matmul_api
from jaxgemm.ops.matmul import api as matmul_api
from jaxgemm.ops.ragged_dot import api as ragged_dot_api
from jaxgemm.ops.scaled_matmul import training as fp8_training
from jaxgemm.ops.scaled_ragged_dot import training as fp8_grouped_training


def matmul(a, b, *, bias=None, activation: str | None = None, residual=None, fp8=None,
           precision=None, preferred_element_type=None, out_sharding=None,
           backend: str = "auto", variant: str | None = None,
           config: KernelConfig | None = None, overlap: bool | None = None) -> jax.Array:
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
    backend: "auto" (on a GPU, measured when first compiled: `jaxgemm.measure`;
      the fastest known choice, `lax.dot_general` for whatever the kernels do
      not take), or one of `jaxgemm.backends()`.
    variant: a kernel of the backend, one of `jaxgemm.variants(backend)`;
      None picks the backend's best.
    config: the backend's config dataclass, e.g. `jaxgemm.TritonConfig(...)`;
      None picks one for the problem.
    overlap: on a mesh, where the call must move data over one mesh axis (x on
      tokens meeting W on columns; a K-sharded product into a token-sharded
      result), run the all-gather or reduce-scatter as a ring of collective
      permutes under the local GEMMs, chunk by chunk (`jaxgemm.collective_matmul`),
      forward and backward; with an epilogue, each chunk is one fused kernel.
      True: wherever such a move is; False: never (XLA's collective, then one local
      GEMM); None: as False for now, since no ring has measured faster than XLA's
      collectives on H100s (`jaxgemm.collective_matmul` has the measurements). Not
      with `fp8`.

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
  a, b = gemm.matmul_operands(a, b)
  kwargs = dict(precision=precision, preferred_element_type=preferred_element_type,
                out_sharding=out_sharding, backend=backend, variant=variant, config=config)
  if overlap is not None and fp8 is not None:
    raise NotImplementedError(
        f"jaxgemm.matmul(overlap={overlap!r}) does not run fp8= GEMMs in a ring; with "
        f"fp8=, leave overlap=None")
  if fp8 is not None:
    return fp8_training.matmul(a, b, fp8, bias=bias, activation=activation,
                               residual=residual, **kwargs)
  if bias is not None or activation is not None or residual is not None:
    return fused_matmul_api.fused_matmul(a, b, bias=bias, activation=activation,
                                         residual=residual, overlap=overlap, **kwargs)
  return matmul_api.matmul(a, b, overlap=overlap, **kwargs)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, *,
               fp8=None, backend: str = "auto", variant: str | None = None,
               config: KernelConfig | None = None) -> jax.Array:
  """`jax.lax.ragged_dot` on jaxgemm's grouped GEMM kernels: a mixture-of-experts layer;
  with `fp8=`, its GEMMs run in FP8 on operands quantized on the fly.

  Without `fp8`, `jaxgemm.ops.ragged_dot.api.ragged_dot` (its docstring has the rows'
  rules, the backends and the example). With fp8 = "tensor", "block" or a
  `jaxgemm.Fp8Recipe`, the forward and the dgrad run as `jaxgemm.scaled_ragged_dot`
  and the weight gradient on the bf16 grouped kernels
  (`jaxgemm.ops.scaled_ragged_dot.training`); `preferred_element_type` is then the
  result's dtype, the recipe's backend runs the GEMMs, and precision, variant and config
  must be None.

  >>> import jax.numpy as jnp, jaxgemm
  >>> x = jnp.ones((6, 256), jnp.bfloat16); w = jnp.ones((2, 256, 8), jnp.bfloat16)
  >>> jaxgemm.ragged_dot(x, w, jnp.array([2, 3]), fp8="tensor")[:, 0].tolist()
  [256.0, 256.0, 256.0, 256.0, 256.0, 0.0]
  """
  if fp8 is None:
    return ragged_dot_api.ragged_dot(lhs, rhs, group_sizes, precision, preferred_element_type,
                                     backend=backend, variant=variant, config=config)
  for name, value in (("precision", precision), ("variant", variant), ("config", config)):
    if value is not None:
      raise ValueError(f"ragged_dot(fp8=...) takes no {name} (the recipe's GEMMs choose "
                       f"their own); got {name}={value!r}")
  recipe = fp8_training.Fp8Recipe.named(fp8)
  if backend != "auto":
    recipe = dataclasses.replace(recipe, backend=backend)
  return fp8_grouped_training.fp8_ragged_dot(lhs, rhs, group_sizes, recipe,
                                             preferred_element_type)
