"""The Triton dual-GEMM kernel of `glu`, called through the backend's impl directly.

CPU: Triton's interpreter on small problems, ragged against 16-wide tiles
(M = 20, N = 24, K = 40 or 36), batch 2, every activation, bias kinds,
save_preactivation, the four transposes, the operand relayout, against float64
references built from `jaxgemm.ops.activations`; the config checks; and the
sm_90 PTX of the launch (wgmma, cp.async), compiled without a GPU. The
op-level contract is tests/test_glu.py's.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from epilogue_testing import run_impl

pytest.importorskip("triton")
from jaxgemm.kernels.triton.glu import dual  # noqa: E402
from jaxgemm.ops import activations  # noqa: E402
from jaxgemm.ops.glu.problem import GluProblem  # noqa: E402
from jaxgemm.ops.glu.triton import TritonGlu  # noqa: E402
from jaxgemm.ops.matmul.triton import TritonConfig  # noqa: E402

BACKEND = TritonGlu()
BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
TINY = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2,
                    align_operands=False)


def _problem(dtype=F16, *, batch=2, m=20, n=24, k=40, trans_a=False, trans_b=False, **kw):
  return GluProblem(batch, m, n, k, np.dtype(dtype), np.dtype(dtype), F32, trans_a, trans_b,
                    None, **kw)


def run(problem, config=TINY, *, seed=0):
  return run_impl(BACKEND, problem, "dual", config, seed=seed)


@pytest.mark.parametrize("i,act", list(enumerate(activations.ACTIVATIONS)))
def test_every_activation(i, act):
  """Each activation, the bias kinds and save_preactivation rotating over them."""
  run(_problem(activation=act, bias=[None, "shared", "batched"][i % 3],
               save_preactivation=bool(i % 2)), seed=i)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False),
                                             (True, True)])
def test_transposes(trans_a, trans_b):
  run(_problem(activation="silu", bias="batched", save_preactivation=True,
               trans_a=trans_a, trans_b=trans_b))


@pytest.mark.parametrize("bias", [None, "shared", "batched"])
def test_fp32(bias):
  run(_problem(F32, activation="gelu", bias=bias, save_preactivation=True), seed=5)


@pytest.mark.parametrize("dtype,trans_a,trans_b,k", [
    (F16, False, False, 36),   # rows of 72 B: X, Wg and Wu padded along K
    (F16, True, True, 36),     # X (K, M) rows of 40 B: M padded too
    (F32, True, False, 40),    # TF32: X and both weights brought K-major
])
def test_operand_relayout(dtype, trans_a, trans_b, k):
  """align_operands: Wu is padded and transposed exactly like Wg, the biases stay."""
  config = TritonConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2,
                        align_operands=True)
  run(_problem(dtype, activation="gelu_exact", bias="shared", save_preactivation=True,
               trans_a=trans_a, trans_b=trans_b, k=k), config)


def test_batch_one_and_larger_tiles():
  config = TritonConfig(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2,
                        align_operands=False)
  run(_problem(batch=1, m=50, n=70, k=45, activation="silu"), config)


def test_interpreted_bf16():
  run(_problem(BF16, activation="silu", bias="shared"))


def test_too_much_shared_memory_is_a_clear_error():
  problem = _problem(BF16, m=4096, n=4096, k=4096, activation="silu")
  config = TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
  with pytest.raises(ValueError, match=r"shared memory .*2 x block_k x block_n"):
    BACKEND.check(problem, "dual", config)


@pytest.mark.parametrize("config,error,match", [
    (TritonConfig(split_k=2), NotImplementedError, "split"),
    (TritonConfig(tma=True), NotImplementedError, "TMA"),
    (TritonConfig(block_k=8), ValueError, "block_k >= 16"),
])
def test_refusals(config, error, match):
  with pytest.raises(error, match=match):
    BACKEND.check(_problem(), "dual", config)


def test_exact_fp32_is_refused():
  problem = GluProblem(1, 64, 64, 64, F32, F32, F32, precision=(lax.Precision.HIGHEST,) * 2)
  with pytest.raises(NotImplementedError, match="HIGHEST"):
    BACKEND.check(problem, "dual", BACKEND.default_config(problem, "dual"))


def test_default_config_is_the_half_width_tile_and_fits():
  backend = TritonGlu(num_sms=132)
  for dtype in (BF16, F32):
    problem = _problem(dtype, batch=1, m=8192, n=8192, k=8192, activation="silu",
                       save_preactivation=True)
    config = backend.default_config(problem, "dual")
    assert (config.block_m, config.block_n, config.num_warps) == (128, 128, 8)
    assert config.block_k == (64 if dtype == BF16 else 32)
    backend.check(problem, "dual", config)
    for variant, c in backend.tuning_candidates(problem):
      backend.check(problem, variant, c)


def test_launch_keeps_wgmma_and_cp_async(monkeypatch):
  from test_fused_matmul_triton import compile_ptx  # noqa: PLC0415
  problem = _problem(BF16, batch=1, m=4096, n=4096, k=4096, activation="silu", bias="shared",
                     save_preactivation=True)
  config = TritonConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)
  # X, Wg, Wu, bias_gate, bias_up, as `dual.glu` passes them
  ptx = compile_ptx(dual.launch(problem, config, "cuda"), [BF16] * 5, monkeypatch)
  assert ptx.count("wgmma.mma_async") >= 2, "no wgmma: the dual GEMM fell off Hopper's MMA"
  cp_async = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async >= 8, f"only {cp_async} cp.async in the PTX: specialization lost"
