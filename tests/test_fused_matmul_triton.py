"""The Triton kernels of `fused_matmul` (and the epilogue functions), through the backend's impl.

CPU: the kernels run in Triton's interpreter on small problems, ragged against
16-wide tiles (M = 20, N = 24, K = 40 or 36), batch 2, against float64
references built from `jaxgemm.ops.activations`. Also the activations alone on
a grid of values (tiny, large, negative), the refusals (split-K, TMA with an
operand gate, shared memory), and the sm_90 PTX of the fused launches (wgmma
and cp.async kept), compiled without a GPU. The op-level contract (AD rules,
dispatch) is tests/test_fused_matmul.py's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from epilogue_testing import act64, grad64, run_impl

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from jaxgemm import triton_call  # noqa: E402
from jaxgemm.kernels.triton.epilogue import activation, activation_grad  # noqa: E402
from jaxgemm.kernels.triton.matmul import persistent, tiled  # noqa: E402
from jaxgemm.ops import activations  # noqa: E402
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem  # noqa: E402
from jaxgemm.ops.fused_matmul import triton as fused_triton  # noqa: E402
from jaxgemm.ops.fused_matmul.triton import TritonFusedMatmul  # noqa: E402
from jaxgemm.ops.matmul.triton import TritonConfig  # noqa: E402

BACKEND = TritonFusedMatmul()
BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
TINY = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2,
                    align_operands=False)
ACTS = activations.ACTIVATIONS


@pytest.fixture(autouse=True)
def operand_gate_in_kernel(monkeypatch):
  """Gates "lhs"/"rhs" run in the kernel unless a test says otherwise (the backend's
  default is an XLA pre-pass, `OPERAND_GATE_IN_KERNEL`)."""
  monkeypatch.setattr(fused_triton, "OPERAND_GATE_IN_KERNEL", True)


def _problem(dtype=F16, *, batch=2, m=20, n=24, k=40, trans_a=False, trans_b=False, **kw):
  return FusedMatmulProblem(batch, m, n, k, np.dtype(dtype), np.dtype(dtype), F32, trans_a,
                            trans_b, None, **kw)


def run(problem, variant="tensorcore", config=TINY, *, seed=0, gate_dtype=None):
  return run_impl(BACKEND, problem, variant, config, seed=seed,
                  gate_dtype=gate_dtype or (problem.dtype if problem.gate else None))


# ------------------------------------------------------------ the activations


@triton.jit
def _activation_kernel(z_ptr, y_ptr, g_ptr, SIZE: tl.constexpr, ACTIVATION: tl.constexpr):
  offs = tl.arange(0, SIZE)
  z = tl.load(z_ptr + offs)
  tl.store(y_ptr + offs, activation(z, ACTIVATION))
  tl.store(g_ptr + offs, activation_grad(z, ACTIVATION))


def _grid_of_values():
  mags = np.concatenate([[0.0, 1e-30, 1e-7, 1e-4, 0.01, 0.1, 0.29, 0.3, 0.31, 0.5],
                         np.linspace(0.6, 8, 40), [10.0, 20.0, 40.0, 88.0, 100.0]])
  z = np.concatenate([mags, -mags[1:]])
  return np.pad(z, (0, 128 - z.size)).astype(np.float32)


@pytest.mark.parametrize("name", [*ACTS, None])
def test_activation_and_its_derivative_match_jax_nn(name):
  """Each activation and derivative against jax.nn's in float64, within a few fp32 ulps."""
  z = _grid_of_values()
  spec = jax.ShapeDtypeStruct(z.shape, jnp.float32)
  launch = triton_call.Launch.make(_activation_kernel, (1,), (spec, spec), num_warps=4,
                                   num_stages=1, SIZE=z.size, ACTIVATION=name or "")
  y, g = jax.jit(lambda z: triton_call.call(launch, z, platform="cpu"))(jnp.asarray(z))
  eps = np.finfo(np.float32).eps
  for got, want, scale, what in (
      # the formulas' own fp32 conditioning (as jax.nn's in fp32): relative to the
      # value, and absolute ~ |z| where terms cancel (gelu(-8) = -8 (1 + tanh(..)) / 2)
      (y, act64(name, z), np.abs(act64(name, z)) + np.abs(z), "activation"),
      (g, grad64(name, z), np.abs(grad64(name, z)) + 1 + np.abs(z), "derivative")):
    got = np.asarray(got, np.float64)
    bad = np.abs(got - want) > 8 * eps * scale
    assert not bad.any(), (f"{name} {what}: at z={z[bad][:5]} got {got[bad][:5]}, "
                           f"want {want[bad][:5]}")
  # near 0 the activation is relative to itself (tanh's series, not 1 - exp(-2|z|))
  small = (np.abs(z) < 0.5) & (z != 0)
  rel = np.abs(np.asarray(y, np.float64)[small] - act64(name, z)[small])
  assert (rel <= 8 * eps * np.abs(act64(name, z)[small]) + 1e-45).all(), (name, z[small])


def test_relu_derivative_at_zero_is_zero():
  assert grad64("relu", np.zeros(1))[0] == 0.0  # the reference the kernels are held to


# ------------------------------------------------------------ the epilogue


def _cover(values, i):
  return values[i % len(values)]


# Every activation (and none) with the bias kinds, residual and save_preactivation
# rotating, so that every value of each meets several activations.
EPILOGUE_CASES = [
    dict(activation=act, bias=_cover([None, "shared", "batched"], i),
         residual=bool(i % 2), save_preactivation=bool((i // 2) % 2))
    for i, act in enumerate([*ACTS, None])
]


@pytest.mark.parametrize("kw", EPILOGUE_CASES, ids=lambda kw: _problem(**kw).epilogue or "none")
def test_epilogue_every_activation(kw):
  run(_problem(**kw))


@pytest.mark.parametrize("bias", [None, "shared", "batched"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("save", [False, True])
def test_epilogue_bias_residual_save(bias, residual, save):
  run(_problem(F32, activation="silu", bias=bias, residual=residual, save_preactivation=save),
      seed=1)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False),
                                             (True, True)])
def test_epilogue_transposes(trans_a, trans_b):
  run(_problem(activation="gelu", bias="batched", residual=True, save_preactivation=True,
               trans_a=trans_a, trans_b=trans_b))


@pytest.mark.parametrize("kw", [
    dict(activation="gelu", bias="shared", residual=True, save_preactivation=True),
    dict(activation="relu", bias="batched"),
    dict(gate="out", gate_activation="gelu"),
    dict(gate="lhs", gate_activation="silu", trans_a=True),
    dict(gate="rhs", gate_activation="tanh", trans_b=True),
], ids=lambda kw: _problem(**kw).epilogue)
def test_persistent(kw):
  """The persistent rung, on two programs walking six tiles each, its epilogue in two
  column slices."""
  config = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2,
                        epilogue_subtile=2, align_operands=False)
  run(_problem(batch=2, m=40, n=48, k=40, **kw), "persistent", config, seed=3)


# ------------------------------------------------------------ the gates


@pytest.mark.parametrize("gate", ["out", "lhs", "rhs"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False),
                                             (True, True)])
@pytest.mark.parametrize("in_kernel", [True, False], ids=["in-kernel", "pre-pass"])
def test_gates(gate, trans_a, trans_b, in_kernel, monkeypatch):
  if gate == "out" and not in_kernel:
    pytest.skip("the out gate is always in the kernel")
  monkeypatch.setattr(fused_triton, "OPERAND_GATE_IN_KERNEL", in_kernel)
  act = {"out": "gelu", "lhs": "silu", "rhs": "gelu_exact"}[gate]
  run(_problem(gate=gate, gate_activation=act, trans_a=trans_a, trans_b=trans_b))


@pytest.mark.parametrize("act", [a for a in ACTS if a not in ("gelu", "silu", "gelu_exact")]
                         + [None])
def test_gates_other_activations(act):
  run(_problem(gate="lhs", gate_activation=act, k=36), seed=2)


def test_gate_z_of_another_dtype():
  """Z in fp32 gating fp16 operands: read as fp32 whatever its dtype."""
  run(_problem(F16, gate="rhs", gate_activation="sigmoid"), gate_dtype=F32)


@pytest.mark.parametrize("dtype,trans_a,trans_b,k", [
    (F16, False, False, 36),   # K rows of 72 B: A and B padded along K (and Z with them)
    (F16, True, True, 36),     # A (K, M) rows of 40 B: M padded too
    (F32, True, False, 40),    # TF32: A and B brought K-major (transposed, and Z with them)
])
@pytest.mark.parametrize("gate", ["lhs", "rhs", "out"])
def test_gates_through_the_operand_relayout(dtype, trans_a, trans_b, k, gate):
  """align_operands: an operand gate's Z is padded and transposed exactly like its operand."""
  config = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2,
                        align_operands=True)
  run(_problem(dtype, gate=gate, gate_activation="tanh", trans_a=trans_a, trans_b=trans_b, k=k),
      config=config)


def test_epilogue_through_the_operand_relayout():
  """Bias and residual stay in C's coordinates while the operands are padded."""
  config = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2,
                        align_operands=True)
  run(_problem(F16, m=20, n=20, k=36, trans_a=True, activation="sigmoid", bias="shared",
               residual=True, save_preactivation=True), config=config)


def test_interpreted_bf16():
  """bf16 operands in the interpreter go through the UPCAST path (see triton_call)."""
  run(_problem(BF16, activation="gelu", bias="shared", residual=True))
  run(_problem(BF16, gate="lhs", gate_activation="silu"))


# ------------------------------------------------------------ refusals and configs


def test_split_k_refuses_epilogues():
  problem = _problem(activation="gelu")
  with pytest.raises(NotImplementedError, match="split-K"):
    BACKEND.check(problem, "tensorcore", TritonConfig(split_k=2))
  with pytest.raises(NotImplementedError, match="split-K"):
    tiled.blocked_launch(problem, TritonConfig(split_k=2), "cpu", upcast=False,
                         dot_precision="tf32")


def test_tma_refuses_operand_gates_in_the_kernel():
  problem = _problem(gate="lhs", gate_activation="relu", m=32, n=32, k=32)
  with pytest.raises(NotImplementedError, match="TMA"):
    BACKEND.check(problem, "persistent", TritonConfig(tma=True))


def test_too_much_shared_memory_is_a_clear_error():
  problem = _problem(activation="gelu", save_preactivation=True, m=4096, n=4096, k=4096)
  config = TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=5)
  with pytest.raises(ValueError, match="shared memory"):
    BACKEND.check(problem, "persistent", config)
  # the heuristic's tile keeps its 3 stages with Z saved (see `_smem_bytes`)
  config = TritonFusedMatmul(num_sms=132).default_config(problem, "persistent")
  assert (config.block_n, config.num_stages) == (256, 3)


def test_defaults_fit_and_delegate_to_the_matmul():
  for kw in (dict(activation="gelu", bias="shared", save_preactivation=True),
             dict(gate="lhs", gate_activation="silu")):
    problem = _problem(BF16, batch=1, m=8192, n=8192, k=8192, **kw)
    backend = TritonFusedMatmul(num_sms=132)
    variant = backend.default_variant(problem)
    assert variant == "persistent"
    config = backend.default_config(problem, variant)
    backend.check(problem, variant, config)
    for v, c in backend.tuning_candidates(problem):
      backend.check(problem, v, c)
  # the matmul would split K here; the fused op cannot
  small = _problem(BF16, batch=1, m=16, n=1024, k=8192, activation="relu")
  backend = TritonFusedMatmul(num_sms=132)
  assert backend.default_variant(small) == "tensorcore"
  assert backend.default_config(small, "tensorcore").split_k == 1


# ------------------------------------------------------------ sm_90 PTX


def compile_ptx(launch, in_dtypes, monkeypatch) -> str:
  """PTX of `launch` as jax_triton.triton_call compiles it for sm_90 (see test_triton_ptx)."""
  from test_triton_ptx import _CapturedKernel, _jax_triton_lib  # noqa: PLC0415
  lib = _jax_triton_lib()
  monkeypatch.setattr(lib.triton_kernel_call_lib, "TritonKernel", _CapturedKernel,
                      raising=False)
  outs = launch.out_shape if isinstance(launch.out_shape, tuple) else (launch.out_shape,)
  dtypes = [*in_dtypes, *(o.dtype for o in outs)]
  arg_types = [f"*{lib._JAX_TO_TRITON_TYPE_MAP[jnp.dtype(d)]}" for d in dtypes]
  kernel, _ = lib.get_or_create_triton_kernel(
      lib.get_cuda_backend, "cuda", launch.kernel, arg_types, (),
      num_warps=launch.num_warps, num_stages=launch.num_stages, num_ctas=1,
      compute_capability=90, enable_fp_fusion=True, metaparams=dict(launch.constexprs),
      dump=False)
  return kernel.ptx


@pytest.mark.parametrize("kw", [
    dict(activation="gelu", bias="shared", residual=True, save_preactivation=True),
    dict(gate="lhs", gate_activation="silu"),
], ids=["epilogue", "gate-lhs"])
def test_fused_launch_keeps_wgmma_and_cp_async(kw, monkeypatch):
  problem = _problem(BF16, batch=1, m=4096, n=4096, k=4096, **kw)
  config = TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
  launch = tiled.blocked_launch(problem, config, "cuda", upcast=False, dot_precision="tf32")
  # A, B, then bias, residual, gate Z (stand-ins where absent), as blocked_matmul passes them
  ptx = compile_ptx(launch, [BF16] * 5, monkeypatch)
  assert "wgmma.mma_async" in ptx, "no wgmma: the fused kernel fell off Hopper's MMA"
  cp_async = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async >= 8, f"only {cp_async} cp.async in the PTX: specialization lost"


def test_persistent_fused_launch_keeps_wgmma(monkeypatch):
  problem = _problem(BF16, batch=1, m=4096, n=4096, k=4096, activation="silu", bias="shared")
  config = TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3,
                        epilogue_subtile=2)
  ptx = compile_ptx(persistent.launch(problem, config, "cuda"), [BF16] * 5, monkeypatch)
  assert "wgmma.mma_async" in ptx
