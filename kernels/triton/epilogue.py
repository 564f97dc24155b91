"""The fused epilogues of the Triton kernels: activations, their derivatives, bias/residual/gate.

Everything here runs on the fp32 accumulator (or an fp32 copy of a loaded
tile), before the one rounding at the store. The activations are the formulas
of `jaxgemm.ops.activations` (jax.nn's), named by a constexpr string:

    relu        max(z, 0)                          relu'(z) = 1 if z > 0 else 0
    gelu        z/2 (1 + tanh(c (z + 0.044715 z^3))), c = sqrt(2/pi)   (tanh approximation)
    gelu_exact  z/2 (1 + erf(z / sqrt(2)))
    silu        z sigmoid(z)
    sigmoid     1 / (1 + exp(-z))
    tanh        tanh(z)
    ""          z itself (derivative 1)

Triton has no portable tanh (libdevice's is CUDA only, and the interpreter
must run the same source), so `_tanh` is the exp form away from 0 and its
Taylor series near 0, where 1 - exp(-2|z|) would cancel: within 1e-7
relative of float64 everywhere (tests/test_fused_matmul_triton.py).
"""

import triton
import triton.language as tl

# Constants are literals in the jit functions below: a module-level tl.constexpr
# multiplied from the left (C * z) stays a constexpr in Triton's interpreter and
# breaks the call. sqrt(2/pi) = 0.7978845608028654, 1/sqrt(2) = 0.7071067811865476,
# 1/sqrt(2 pi) = 0.3989422804014327, gelu's cubic term 0.044715. Below |z| = 0.3
# the tanh series (to z^11) is exact to fp32; above it 1 - exp(-2|z|) loses at
# most a bit to cancellation.


@triton.jit
def _tanh(z):
  a = tl.abs(z)
  e = tl.exp(-2.0 * a)
  far = (1.0 - e) / (1.0 + e)
  s = tl.where(a < 0.3, a, 0.0)   # the series only where used (no overflow)
  z2 = s * s
  # tanh z = z (1 - z^2/3 + 2 z^4/15 - 17 z^6/315 + 62 z^8/2835 - 1382 z^10/155925 + ...)
  near = s * (1.0 + z2 * (-0.3333333333333333 + z2 * (0.13333333333333333 + z2 * (
      -0.05396825396825397 + z2 * (0.021869488536155203 + z2 * -0.008863235529902197)))))
  t = tl.where(a < 0.3, near, far)
  return tl.where(z < 0, -t, t)


@triton.jit
def _sigmoid(z):
  return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def activation(z, ACTIVATION: tl.constexpr):
  """ACTIVATION(z) on an fp32 tensor ("" or None: z)."""
  if ACTIVATION == "relu":
    return tl.maximum(z, 0.0)
  elif ACTIVATION == "gelu":
    return 0.5 * z * (1.0 + _tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
  elif ACTIVATION == "gelu_exact":
    return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
  elif ACTIVATION == "silu":
    return z * _sigmoid(z)
  elif ACTIVATION == "sigmoid":
    return _sigmoid(z)
  elif ACTIVATION == "tanh":
    return _tanh(z)
  else:
    return z


@triton.jit
def activation_grad(z, ACTIVATION: tl.constexpr):
  """d ACTIVATION / dz at z on an fp32 tensor ("" or None: ones), as jax.jvp of jax.nn's."""
  if ACTIVATION == "relu":
    return tl.where(z > 0, 1.0, 0.0)
  elif ACTIVATION == "gelu":
    t = _tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))
    return (0.5 * (1.0 + t)
            + 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * z * z))
  elif ACTIVATION == "gelu_exact":
    return 0.5 * (1.0 + tl.erf(z * 0.7071067811865476)) + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)
  elif ACTIVATION == "silu":
    s = _sigmoid(z)
    return s * (1.0 + z * (1.0 - s))
  elif ACTIVATION == "sigmoid":
    s = _sigmoid(z)
    return s * (1.0 - s)
  elif ACTIVATION == "tanh":
    t = _tanh(z)
    return 1.0 - t * t
  else:
    return tl.full(z.shape, 1.0, tl.float32)


@triton.jit
def load_out_tile(ptr, batch, offs_m, offs_n, M: tl.constexpr, N: tl.constexpr,
                  INDEX_64: tl.constexpr):
  """A (rows, cols) tile of a (B, M, N) tensor in output coordinates, as fp32 (0 past the edges)."""
  mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
  if INDEX_64:
    batch = batch.to(tl.int64)
    offs_m = offs_m.to(tl.int64)
  ptrs = ptr + batch * (M * N) + offs_m[:, None] * N + offs_n[None, :]
  return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def load_bias(bias_ptr, batch, offs_n, N: tl.constexpr, BIAS: tl.constexpr):
  """The (cols,) fp32 bias of `batch` at columns offs_n: BIAS 1 shared (N,), 2 batched (B, N)."""
  if BIAS == 2:
    bias_ptr += batch.to(tl.int64) * N
  return tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)


@triton.jit
def apply_epilogue(acc, batch, offs_m, offs_n, bias_ptr, res_ptr, gate_ptr,
                   M: tl.constexpr, N: tl.constexpr, BIAS: tl.constexpr,
                   ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr, GATE_OUT: tl.constexpr,
                   GATE_ACTIVATION: tl.constexpr, INDEX_64: tl.constexpr):
  """(y, z) of the fp32 tile `acc` of C (B, M, N) at rows offs_m, columns offs_n.

  z = acc + bias (BIAS 0 none, 1 shared, 2 batched); y = ACTIVATION(z) + residual
  (RESIDUAL: read at res_ptr, shaped like C). GATE_OUT: y = GATE_ACTIVATION'(Z) * acc
  with Z at gate_ptr, shaped like C (no bias, activation or residual then).
  Unused pointers are never read.
  """
  z = acc
  if GATE_OUT:
    g = activation_grad(load_out_tile(gate_ptr, batch, offs_m, offs_n, M, N, INDEX_64),
                        GATE_ACTIVATION)
    y = g * acc
  else:
    if BIAS != 0:
      z = z + load_bias(bias_ptr, batch, offs_n, N, BIAS)[None, :]
    y = activation(z, ACTIVATION)
    if RESIDUAL:
      y = y + load_out_tile(res_ptr, batch, offs_m, offs_n, M, N, INDEX_64)
  return y, z


@triton.jit
def gate_operand(x, gate_ptrs, mask, GATE_ACTIVATION: tl.constexpr, MASKED: tl.constexpr):
  """An operand tile x multiplied by GATE_ACTIVATION'(Z) (Z's tile at gate_ptrs, read as fp32),
  in fp32, rounded back to x's dtype: the gated forms "lhs" / "rhs"."""
  if MASKED:
    zt = tl.load(gate_ptrs, mask=mask, other=0.0)
  else:
    zt = tl.load(gate_ptrs)
  g = activation_grad(zt.to(tl.float32), GATE_ACTIVATION)
  return (x.to(tl.float32) * g).to(x.dtype)


# ------------------------------------------------------------ the launch side

BIAS_CODES = {None: 0, "shared": 1, "batched": 2}


def is_fused(problem) -> bool:
  """Whether `problem` carries an epilogue or a gate (a `FusedMatmulProblem`)."""
  return getattr(problem, "op", None) == "fused_matmul"


def constexprs(problem) -> dict:
  """The epilogue's constexprs of a kernel launch for a `FusedMatmulProblem`."""
  return dict(BIAS=BIAS_CODES[problem.bias], ACTIVATION=problem.activation or "",
              RESIDUAL=bool(problem.residual), GATE=problem.gate or "",
              GATE_ACTIVATION=problem.gate_activation or "",
              SAVE_PREACTIVATION=bool(problem.save_preactivation))


def pointer_arrays(problem, a, extras) -> tuple:
  """(bias, residual, gate Z) for the kernel's pointer arguments, from the operands after
  A and B in `problem.extra_shapes` order; `a` stands in for those the problem lacks
  (a pointer argument must be an array; the kernel never reads it)."""
  extras = list(extras)
  if len(extras) != len(problem.extra_shapes):
    raise ValueError(f"{problem.describe()} takes {len(problem.extra_shapes)} operands after A "
                     f"and B, got {len(extras)}")
  if problem.gate:
    return a, a, extras[0]
  bias = extras.pop(0) if problem.bias else a
  residual = extras.pop(0) if problem.residual else a
  return bias, residual, a


def extra_roles(problem) -> tuple[str, ...]:
  """How `matmul.layout.tensor_core_layout` relays each operand after A and B: a gate's
  Z like the operand it gates ("a", "b"), the rest in C's coordinates ("out")."""
  if problem.gate:
    return ({"lhs": "a", "rhs": "b", "out": "out"}[problem.gate],)
  return ("out",) * len(problem.extra_shapes)
