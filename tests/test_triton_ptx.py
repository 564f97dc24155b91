"""Regression test for the jax-triton specialization bug, on a machine without a GPU.

jax-triton 0.3.1 gives integer kernel arguments no divisibility-16 attribute,
and the tutorial matmul then compiled without cp.async (0 in its sm_90 PTX,
56 with the integers marked) and ran at 33.7 instead of 750.6 TFLOP/s
(../shared/GPU_NOTES.md). Our kernels take every integer as a constexpr
(jaxgemm/triton_call.py). Here we compile the launches our backend
makes with jax-triton's own compilation function (`get_or_create_triton_kernel`,
Triton's CUDA backend targeting sm_90, no GPU needed) and read the PTX.
"""

import functools
import importlib.util
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxgemm import GemmProblem

triton = pytest.importorskip("triton")
from jaxgemm.ops.matmul.triton import TritonConfig  # noqa: E402
from jaxgemm.kernels.triton.matmul import tiled  # noqa: E402


@functools.cache
def _jax_triton_lib():
  """jax_triton.triton_lib, loaded past the package __init__ that insists on a GPU jaxlib."""
  spec = importlib.util.find_spec("jax_triton")
  if spec is None:
    pytest.skip("jax-triton is not installed")
  path = pathlib.Path(spec.submodule_search_locations[0]) / "triton_lib.py"
  module_spec = importlib.util.spec_from_file_location("_jaxgemm_test_triton_lib", path)
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[module_spec.name] = module  # dataclasses look their module up there
  module_spec.loader.exec_module(module)
  return module


class _CapturedKernel:
  def __init__(self, name, num_warps, num_ctas, shared_mem_bytes, ptx, ttir, compute_capability):
    self.name, self.ptx, self.shared_mem_bytes = name, ptx, shared_mem_bytes


def compile_like_jax_triton(launch, in_dtypes, monkeypatch) -> str:
  """PTX of `launch` as jax_triton.triton_call would compile it for sm_90."""
  lib = _jax_triton_lib()
  monkeypatch.setattr(lib.triton_kernel_call_lib, "TritonKernel", _CapturedKernel, raising=False)
  # triton_call passes arrays as pointers (inputs, then outputs) and keyword
  # arguments as constexpr metaparams; our launches have no scalar arguments.
  dtypes = [*in_dtypes, launch.out_shape.dtype]
  arg_types = [f"*{lib._JAX_TO_TRITON_TYPE_MAP[jnp.dtype(d)]}" for d in dtypes]
  kernel, _ = lib.get_or_create_triton_kernel(
      lib.get_cuda_backend, "cuda", launch.kernel, arg_types, (),
      num_warps=launch.num_warps, num_stages=launch.num_stages, num_ctas=1,
      compute_capability=90, enable_fp_fusion=True, metaparams=dict(launch.constexprs),
      dump=False)
  return kernel.ptx


def _problem(dtype, trans_a=False, trans_b=False, m=4096, n=4096, k=4096):
  return GemmProblem(1, m, n, k, np.dtype(dtype), np.dtype(dtype), np.dtype(np.float32),
                     trans_a, trans_b, None)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_tensorcore_launch_keeps_cp_async_and_wgmma(trans_a, trans_b, monkeypatch):
  problem = _problem(jnp.bfloat16, trans_a, trans_b)
  config = TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
  launch = tiled.blocked_launch(problem, config, "cuda", upcast=False, dot_precision="tf32")
  ptx = compile_like_jax_triton(launch, [problem.dtype, problem.dtype], monkeypatch)
  assert "wgmma.mma_async" in ptx, "no wgmma: the tensor-core rung fell off Hopper's MMA"
  # 16-byte cp.async copies are the pipeline jax-triton's unspecialized
  # integers used to lose (0 of them then).
  cp_async_16 = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async_16 >= 8, f"only {cp_async_16} cp.async in the PTX: specialization lost"


def test_integer_arguments_are_refused(monkeypatch):
  """Passing M, N, K as runtime integers would bring the bug back: `call` refuses."""
  from jaxgemm import triton_call
  problem = _problem(jnp.float16, m=64, n=64, k=64)
  launch = tiled.blocked_launch(problem, TritonConfig(), "cuda", upcast=False,
                                dot_precision="tf32")
  with pytest.raises(TypeError, match="constexpr"):
    triton_call.call(launch, jnp.ones((1, 64, 64), jnp.float16), 64, platform="cuda")


E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)


@pytest.mark.parametrize("a_dtype,b_dtype,kind", [
    (E4M3, E4M3, "block"), (E5M2, E5M2, "block"), (E4M3, E5M2, "block"), (E5M2, E4M3, "tensor")],
    ids=["e4m3-block", "e5m2-block", "e4m3xe5m2-block", "e5m2xe4m3-tensor"])
def test_scaled_matmul_launch_runs_fp8_wgmma_and_promotes(a_dtype, b_dtype, kind, monkeypatch):
  """scaled_matmul's Triton launch, as the backend runs a 4096^3 NN problem (the
  heuristic's config; operands relaid K-major, `scaled.laid_out`), compiles to
  FP8 wgmma fed by cp.async, and promotes every 128 of K: each block's first
  wgmma starts from zero (scale-d 0) and each accumulator element takes one
  fp32 add (fma with block scales) per block. Not K-major, Triton 3.9 still
  emits FP8 wgmma but loads that operand outside the cp.async pipeline (16 of the
  32 cp.async left, 48 prmt), which is why the backend relays it, or reads it in
  place with f16 math (the next test)."""
  import re  # noqa: PLC0415
  from jaxgemm.kernels.triton.scaled_matmul import scaled  # noqa: PLC0415
  from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: PLC0415
  from jaxgemm.ops.scaled_matmul.triton import TritonScaledMatmul  # noqa: PLC0415
  stored = ScaledMatmulProblem(1, 4096, 4096, 4096, a_dtype, np.dtype(jnp.bfloat16),
                               np.dtype(np.float32), False, False, None, b_dtype=b_dtype,
                               scale_kind=kind)
  config = TritonScaledMatmul(num_sms=132).default_config(stored, "blocked")
  assert config.align_operands
  problem = scaled.laid_out(stored)
  assert (problem.trans_a, problem.trans_b) == (False, True)
  launch = scaled.launch(problem, config, "cuda")
  ptx = compile_like_jax_triton(launch, [a_dtype, b_dtype, np.float32, np.float32],
                                monkeypatch)
  names = {E4M3: "e4m3", E5M2: "e5m2"}
  assert f"wgmma.mma_async.sync.aligned.m64n128k32.f32.{names[a_dtype]}.{names[b_dtype]}" in ptx
  assert "mma.sync" not in ptx.replace("wgmma.mma_async.sync", "")
  cp_async_16 = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async_16 >= 16, f"only {cp_async_16} cp.async: an operand left the pipeline"
  # wgmma's operands end "..., scale-d, imm-scale-a, imm-scale-b;": 0 starts a new sum.
  assert re.search(r"wgmma\.mma_async[^;]*,\s*0,\s*1,\s*1;", ptx), "no wgmma starts a block"
  per_thread = config.block_m * config.block_n // (32 * config.num_warps)
  promotions = len(re.findall(r"\bfma\.rn\.f32" if kind == "block" else r"\badd\.(?:rn\.)?f32",
                              ptx))
  assert promotions >= per_thread, f"{promotions} fp32 adds for {per_thread} elements"


@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
def test_scaled_matmul_in_place_weight_keeps_the_pipeline(kind, monkeypatch):
  """128 rows against a B stored (K, N), as the heuristic runs it (read in place), keeps
  both operands in the cp.async pipeline with no byte-permute transposes (fp8 math on
  the unswapped launch: 16 cp.async and 96 prmt). Per tensor or row/column, swapped
  (`scaled.swapped`): FP8 wgmma with the weight as its register operand (two register
  lists in the instruction), promoted every 128 of K. Block scales: f16 wgmma, which
  reads the N-major B from shared memory (`scaled.dot_f16`)."""
  import re  # noqa: PLC0415
  from jaxgemm.kernels.triton.scaled_matmul import scaled  # noqa: PLC0415
  from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: PLC0415
  from jaxgemm.ops.scaled_matmul.triton import TritonScaledMatmul  # noqa: PLC0415
  problem = ScaledMatmulProblem(1, 128, 14336, 4096, E4M3, np.dtype(jnp.bfloat16),
                                np.dtype(np.float32), scale_kind=kind)
  config = TritonScaledMatmul(num_sms=132).default_config(problem, "blocked")
  assert not config.align_operands and config.swap_ab == (kind != "block")
  ptx = compile_like_jax_triton(scaled.launch(problem, config, "cuda"),
                                [E4M3, E4M3, np.float32, np.float32], monkeypatch)
  cp_async_16 = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
  assert cp_async_16 >= 32, f"only {cp_async_16} cp.async: an operand left the pipeline"
  assert "prmt" not in ptx
  if kind == "block":
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in ptx
    return
  wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3[^;]*;", ptx)
  assert wgmma and all(re.search(r"\},\s*\{", w) for w in wgmma), "A not from registers"
  assert re.search(r"wgmma\.mma_async[^;]*,\s*0,\s*1,\s*1;", ptx), "no wgmma starts a block"
  per_thread = config.block_m * config.block_n // (32 * config.num_warps)
  assert len(re.findall(r"\badd\.(?:rn\.)?f32", ptx)) >= per_thread, "no promotion"
