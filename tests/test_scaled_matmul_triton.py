"""The Triton FP8 kernel of `scaled_matmul`: what is particular to this backend.

CPU: Triton's interpreter runs the kernel itself (fp8 loads and dots) on small
ragged problems: K steps of 32 and 64 inside the 128-wide scale blocks, the
operand relayout (K-major transposes, K padded to 16 bytes) against reading
the operands as stored, bf16 rounding; the config checks and the heuristic's
configs on large problems of every layout. The sm_90 PTX (wgmma, promotion)
is tests/test_triton_ptx.py's; the op-level contract is tests/test_scaled_matmul.py's
(which runs this kernel too). GPU tier: K = 16384 compiled, against float64.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from gemm_testing import as_f64, assert_gemm_close
from test_scaled_matmul import (A_BLOCK, ACC_TOL, B_BLOCK, BF16, E4M3, E5M2, F32, OUT_STEP,
                                operands, reference)

pytest.importorskip("triton")
from jaxgemm.kernels.triton.scaled_matmul import scaled, transpose  # noqa: E402
from jaxgemm.gemm import SMEM_CAPACITY_BYTES as SMEM_BYTES  # noqa: E402
from jaxgemm.ops.matmul.triton import TritonConfig  # noqa: E402
from jaxgemm.ops.scaled_matmul.problem import ScaledMatmulProblem  # noqa: E402
from jaxgemm.ops.scaled_matmul.triton import TritonScaledMatmul, fp8_smem_bytes  # noqa: E402

KINDS = ("tensor", "row_col", "block")
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
# Quantize blocks of an operand stored transposed (its scale comes transposed too).
A_BLOCK_T = {"tensor": None, "row_col": (None, 1), "block": (128, 1)}
B_BLOCK_T = {"tensor": None, "row_col": (1, None), "block": (128, 128)}
SMALL = TritonConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2,
                     align_operands=False)


def _problem(m, n, k, *, batch=1, kind="block", trans_a=False, trans_b=False,
             dtype=E4M3, b_dtype=E4M3, out_dtype=BF16):
  return ScaledMatmulProblem(batch, m, n, k, dtype, out_dtype, F32, trans_a, trans_b, None,
                             b_dtype=b_dtype, scale_kind=kind)


def _run(m, k, n, kind, config, rng, *, trans_a=False, trans_b=False, out_dtype=F32,
         batch=()):
  """The kernel on random operands stored as the flags say, checked against float64."""
  a, sa, a64 = operands(rng, (*batch, k, m) if trans_a else (*batch, m, k), E4M3,
                        (A_BLOCK_T if trans_a else A_BLOCK)[kind])
  b, sb, b64 = operands(rng, (*batch, n, k) if trans_b else (*batch, k, n), E5M2,
                        (B_BLOCK_T if trans_b else B_BLOCK)[kind])
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, trans_a=trans_a,
                              trans_b=trans_b, backend="triton", config=config)
  ref, bound = reference(np.swapaxes(a64, -1, -2) if trans_a else a64,
                         np.swapaxes(b64, -1, -2) if trans_b else b64)
  assert_gemm_close(out, ref, bound, OUT_STEP[np.dtype(out_dtype)] + ACC_TOL,
                    f"{kind} trans_a={trans_a} trans_b={trans_b} {config}")
  return out


# ---------------------------------------------------------------- the kernel


@pytest.mark.parametrize("block_k", [32, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_k_steps_inside_a_scale_block(kind, block_k, rng):
  """BLOCK_K < 128: 128 / BLOCK_K dots sum into one block's partial before it is
  promoted (times the block's scales); K = 300 ends in a partial block whose
  last step is past K (masked), N = 200 spans two 128-column scale blocks."""
  _run(20, 300, 200, kind, dataclasses.replace(SMALL, block_k=block_k), rng)


@pytest.mark.parametrize("kind", KINDS)
def test_tile_wider_than_a_scale_block(kind, rng):
  """A 256-column tile reads two column blocks of b_scale per K block."""
  config = TritonConfig(block_m=16, block_n=256, block_k=128, num_warps=4, num_stages=2,
                        align_operands=False)
  _run(24, 260, 300, kind, config, rng)


@pytest.mark.parametrize("k", [200, 256])
@pytest.mark.parametrize("align", [False, True], ids=["as-stored", "relaid"])
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
def test_layouts_as_stored_and_relaid(trans_a, trans_b, align, k, rng):
  """Every layout read in place (strides; an MN-major operand through f16 wgmma,
  `scaled.dot_f16`) and relaid K-major: K = 200 padded to 208 (whole 16-byte rows, an
  XLA pass), K = 256 transposed by the Triton kernel; block scales, batch 2: the same
  products."""
  config = TritonConfig(block_m=32, block_n=32, block_k=64, num_warps=4, num_stages=2,
                        align_operands=align)
  _run(36, k, 72, "block", config, rng, trans_a=trans_a, trans_b=trans_b, batch=(2,))


@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
def test_mn_major_operands_take_f16_math_or_registers(trans_a, trans_b):
  """FP8 wgmma reads shared memory K-major only: the kernel multiplies in f16 where it
  reads B stored (K, N) as it is, feeds an A stored (K, M) to FP8 wgmma from registers
  where B is K-major, and does neither after the relayout."""
  stored = _problem(128, 256, 512, trans_a=trans_a, trans_b=trans_b)
  assert scaled.dot_f16(stored) == (not trans_b)
  assert scaled.a_through_registers(stored) == (trans_a and trans_b)
  assert not scaled.dot_f16(scaled.laid_out(stored))
  assert not scaled.a_through_registers(scaled.laid_out(stored))


@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
def test_swapped_problem_exchanges_the_operands(trans_a, trans_b):
  """C^T = op(B)^T op(A)^T: M and N, the dtypes and the operands' roles trade places
  (a B stored (K, N) is an A stored (K, M') of the swapped problem); twice is once."""
  p = _problem(36, 72, 200, kind="row_col", trans_a=trans_a, trans_b=trans_b, b_dtype=E5M2)
  s = scaled.swapped(p)
  assert (s.m, s.n, s.k, s.dtype, s.b_dtype) == (72, 36, 200, E5M2, E4M3)
  assert (s.trans_a, s.trans_b) == (not trans_b, not trans_a)
  assert scaled.swapped(s) == p


@pytest.mark.parametrize("kind", ["tensor", "row_col"])
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
def test_swap_ab_every_layout(trans_a, trans_b, kind, rng):
  """config.swap_ab (C^T = B^T A^T, stored transposed) for every layout, read in place
  (NN: the weight through registers; TN and NT with f16 math) and relaid, per-tensor
  and row/column scales (which trade places), batch 2, ragged M, N and K."""
  for align in (False, True):
    config = TritonConfig(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=2,
                          align_operands=align, swap_ab=True)
    _run(36, 200, 72, kind, config, rng, trans_a=trans_a, trans_b=trans_b, batch=(2,))


def test_swap_ab_bf16_output_rounds_to_nearest(rng):
  """The transposed store rounds as the plain one: bf16 C is the fp32 C rounded."""
  a, sa, _ = operands(rng, (40, 300), E4M3, (1, None))
  b, sb, _ = operands(rng, (300, 100), E5M2, (None, 1))
  config = dataclasses.replace(SMALL, swap_ab=True)
  call = lambda out_dtype: jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype,
                                                 backend="triton", config=config)
  np.testing.assert_array_equal(as_f64(call(BF16)), as_f64(call(F32).astype(BF16)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtypes", [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2)],
                         ids=["e4m3", "e5m2", "mixed"])
def test_default_reads_a_kn_weight_in_place_up_to_128_rows(dtypes, kind, rng):
  """The heuristic's config for 100 rows against a (4096, 14336) weight stored (K, N)
  (in place: swapped, the weight through registers, but for block scales, f16 math),
  run on 100x384x136 operands of the same layout, every scale kind and dtype pair,
  against float64."""
  a, sa, a64 = operands(rng, (100, 384), dtypes[0], A_BLOCK[kind])
  b, sb, b64 = operands(rng, (384, 136), dtypes[1], B_BLOCK[kind])
  problem = _problem(100, 136, 384, kind=kind, dtype=dtypes[0], b_dtype=dtypes[1])
  config = TritonScaledMatmul(num_sms=132).default_config(
      dataclasses.replace(problem, n=14336, k=4096), "blocked")
  assert not config.align_operands
  if kind == "block":
    assert not config.swap_ab and scaled.dot_f16(problem)
  else:
    assert config.swap_ab and scaled.a_through_registers(scaled.swapped(problem))
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, backend="triton", config=config)
  ref, bound = reference(a64, b64)
  assert_gemm_close(out, ref, bound, OUT_STEP[np.dtype(F32)] + ACC_TOL, f"{kind} {dtypes}")


@pytest.mark.parametrize("shape", [(1, 128, 256), (2, 130, 300), (3, 7, 5), (1, 1, 64)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [E4M3, E5M2, np.dtype(np.uint8)], ids=lambda d: d.name)
def test_transpose_kernel_is_swapaxes_bit_for_bit(shape, dtype, rng):
  """The relayout's Triton transpose (whole and partial 128x128 tiles, batches)."""
  bits = jnp.asarray(rng.integers(0, 256, shape, dtype=np.uint8))
  x = jax.lax.bitcast_convert_type(bits, dtype) if dtype != np.uint8 else bits
  y = transpose.transpose(x, "cpu")
  assert y.dtype == x.dtype and y.shape == (shape[0], shape[2], shape[1])
  np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(y, jnp.uint8)),
                                np.swapaxes(np.asarray(bits), 1, 2))


def test_transpose_kernel_refuses_what_it_cannot_move():
  with pytest.raises(ValueError, match=r"one-byte dtype; got x.shape=\(2, 3\)"):
    transpose.transpose(jnp.zeros((2, 3), jnp.uint8), "cpu")
  with pytest.raises(ValueError, match="x.dtype=bfloat16"):
    transpose.transpose(jnp.zeros((1, 2, 3), jnp.bfloat16), "cpu")


def test_laid_out_problem():
  """What the relayout reads: A (M, K), B (N, K), K padded to 16; scales untouched
  (the number of 128-wide K blocks does not change)."""
  p = _problem(40, 72, 200, trans_a=True, trans_b=False)
  target = scaled.laid_out(p)
  assert (target.trans_a, target.trans_b, target.k, target.m, target.n) == (False, True, 208,
                                                                            40, 72)
  assert target.k_blocks == p.k_blocks and target.a_scale_shape == p.a_scale_shape
  native = _problem(40, 72, 256, trans_b=True)
  assert scaled.laid_out(native) == native   # read in place: no pass over the operands


def test_bf16_output_rounds_to_nearest(rng):
  """C is rounded once, to nearest: the bf16 result is the fp32 one rounded (the
  interpreter's own fp32 -> bf16 cast truncates; `scaled.stored_dtype`)."""
  a, sa, _ = operands(rng, (40, 300), E5M2, None)
  b, sb, _ = operands(rng, (300, 100), E5M2, None)
  call = lambda out_dtype: jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype,
                                                 backend="triton", config=SMALL)
  np.testing.assert_array_equal(as_f64(call(BF16)), as_f64(call(F32).astype(BF16)))


def test_promotion_sums_blocks_in_fp32(rng):
  """Scales 2**30 apart between the three K blocks (per row of a, per block of b):
  each block's partial sum is multiplied by its own blocks' scales before the
  fp32 add, so the result is the float64 one to fp32 accuracy (a scale taken
  from the wrong block would be off by 2**10 or more)."""
  m, k, n = 16, 384, 24
  a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32).astype(E4M3)
  b = jnp.asarray(rng.standard_normal((k, n)), jnp.float32).astype(E4M3)
  sa = jnp.asarray(np.tile([2.0**20, 1.0, 2.0**-20], (m, 1)), jnp.float32)   # (M, 3)
  sb = jnp.asarray([[1.0], [2.0**-10], [2.0**20]], jnp.float32)                # (3, 1)
  out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=F32, backend="triton",
                              config=dataclasses.replace(SMALL, block_k=64))
  a64 = as_f64(a) * np.repeat(as_f64(sa), 128, axis=1)
  b64 = as_f64(b) * np.repeat(as_f64(sb), 128, axis=0)
  assert_gemm_close(out, *reference(a64, b64), 2.0**-20)


# ---------------------------------------------------------------- config and heuristic


def test_check_names_the_argument_and_valid_values():
  backend = TritonScaledMatmul()
  p = _problem(256, 256, 256)
  ok = TritonConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4)
  backend.check(p, "blocked", ok)
  with pytest.raises(ValueError, match=r"unknown variant='tiled'.*\['blocked'\]"):
    backend.check(p, "tiled", ok)
  with pytest.raises(ValueError, match=r"config.block_k=16 must be one of \[32, 64, 128\]"):
    backend.check(p, "blocked", dataclasses.replace(ok, block_k=16))
  with pytest.raises(ValueError, match=r"config.block_k=256 must be one of"):
    backend.check(p, "blocked", dataclasses.replace(ok, block_k=256))
  with pytest.raises(ValueError, match=r"393216 bytes of shared memory \(num_stages=8 x "
                                       r"\(block_m=128 \+ block_n=256\) x block_k=128"):
    backend.check(p, "blocked", dataclasses.replace(ok, block_n=256, num_stages=8))
  with pytest.raises(NotImplementedError, match=r"config.split_k must be 1, got 2"):
    backend.check(p, "blocked", dataclasses.replace(ok, split_k=2))
  with pytest.raises(NotImplementedError, match=r"config.tma must be False"):
    backend.check(p, "blocked", dataclasses.replace(ok, tma=True))
  with pytest.raises(NotImplementedError, match=r"config.warp_specialize must be False"):
    backend.check(p, "blocked", dataclasses.replace(ok, warp_specialize=True))
  with pytest.raises(NotImplementedError, match=r"config.epilogue_subtile must be 1, got 2"):
    backend.check(p, "blocked", dataclasses.replace(ok, epilogue_subtile=2))
  with pytest.raises(ValueError, match=r"config.swap_ab=True needs 'tensor' or 'row_col' "
                                       r"scales, got scale_kind='block'"):
    backend.check(p, "blocked", dataclasses.replace(ok, swap_ab=True))
  backend.check(dataclasses.replace(p, scale_kind="row_col"), "blocked",
                dataclasses.replace(ok, swap_ab=True))
  with pytest.raises(NotImplementedError, match=r"fp8 operands.*got b.dtype=bfloat16"):
    backend.check(dataclasses.replace(p, b_dtype=BF16), "blocked", ok)


def test_explicit_bad_config_is_refused_before_running():
  a, b = jnp.ones((64, 256), E4M3), jnp.ones((256, 64), E4M3)
  with pytest.raises(ValueError, match=r"block_k=16 must be one of"):
    jaxgemm.scaled_matmul(a, b, jnp.float32(1), jnp.float32(1), backend="triton",
                          config=TritonConfig(block_k=16))


LARGE = [(8192, 8192, 8192, 1), (128, 14336, 4096, 1), (16, 8192, 8192, 1),
         (4095, 4093, 4097, 1), (1024, 2048, 512, 8), (64, 64, 65536, 1), (8192, 24, 1024, 1)]


@pytest.mark.parametrize("num_sms", [132, 0], ids=["h100", "interpreter"])
@pytest.mark.parametrize("m,n,k,batch", LARGE, ids=lambda v: str(v))
def test_default_configs_pass_check_on_large_problems(m, n, k, batch, num_sms):
  """The heuristic's config (and every tuning candidate) passes `check` for every
  layout, scale kind and dtype pairing, with tiles fit for FP8 wgmma."""
  backend = TritonScaledMatmul(num_sms=num_sms)
  for (trans_a, trans_b) in LAYOUTS:
    for kind in KINDS:
      for dtype, b_dtype in [(E4M3, E4M3), (E5M2, E4M3)]:
        p = _problem(m, n, k, batch=batch, kind=kind, trans_a=trans_a, trans_b=trans_b,
                     dtype=dtype, b_dtype=b_dtype)
        assert backend.default_variant(p) == "blocked"
        config = backend.default_config(p, "blocked")
        backend.check(p, "blocked", config)
        assert 128 % config.block_k == 0 and config.block_k >= 32, config
        rows, kernel_m = (config.block_n, n) if config.swap_ab else (config.block_m, m)
        assert rows >= 64 or kernel_m < 64, config          # wgmma's 64 rows
        assert config.block_m * config.block_n <= 128 * 128, config   # 2 fp32 tiles
        for variant, candidate in backend.tuning_candidates(p):
          backend.check(p, variant, candidate)


def test_heuristic_tiles():
  """128x128x128 / 8 warps / 4 stages where one wave of them fills the SMs, smaller
  tiles (64 rows, 4 warps) for small M; relayout from a megabyte of operands."""
  gpu = TritonScaledMatmul(num_sms=132)
  big = gpu.default_config(_problem(8192, 8192, 8192), "blocked")
  assert (big.block_m, big.block_n, big.block_k, big.num_warps, big.num_stages) == (
      128, 128, 128, 8, 4)
  assert big.align_operands
  assert fp8_smem_bytes(big)[0] == 4 * 256 * 128 <= SMEM_BYTES
  # Up to 128 rows a B stored (K, N) is read in place: block scales with f16 wgmma on
  # 128x64x128 tiles.
  decode = gpu.default_config(_problem(16, 8192, 8192), "blocked")
  assert (decode.block_m, decode.block_n, decode.num_warps) == (16, 64, 4)
  assert not decode.align_operands
  rows128 = gpu.default_config(_problem(128, 14336, 4096), "blocked")
  assert (rows128.block_m, rows128.block_n, rows128.block_k, rows128.num_warps,
          rows128.num_stages, rows128.align_operands) == (128, 64, 128, 4, 3, False)
  # A B stored (N, K) is K-major already: the fp8 tiles of the one-wave rule (2 x 112
  # tiles of 64 rows fill the 132 SMs).
  rows128_nt = gpu.default_config(_problem(128, 14336, 4096, trans_b=True), "blocked")
  assert (rows128_nt.block_m, rows128_nt.block_n, rows128_nt.align_operands) == (64, 128, True)
  # With per-tensor or row/column scales, swapped up to 256 rows: up to 128 rows a tile
  # (wgmma's N) against 128 columns of the weight (its M) on 8 warps; 64 columns on 4
  # warps where 128 leave a quarter of the SMs idle; not below a megabyte of operands.
  for kind in ("tensor", "row_col"):
    for m, n, k, tile in ((128, 14336, 4096, (128, 128, 128, 8, 4)),
                          (16, 8192, 8192, (16, 64, 128, 4, 4)),
                          (256, 14336, 4096, (128, 128, 128, 8, 4)),
                          (128, 4096, 14336, (128, 64, 128, 4, 4))):
      swap = gpu.default_config(_problem(m, n, k, kind=kind), "blocked")
      assert (swap.block_m, swap.block_n, swap.block_k, swap.num_warps,
              swap.num_stages) == tile, (m, n, k, swap)
      assert swap.swap_ab and not swap.align_operands
      # Tuning tries the other swapped tile, never 128 columns on 4 warps (which spill).
      tried = {(c.block_n, c.num_warps) for _, c in gpu.tuning_candidates(
          _problem(m, n, k, kind=kind))}
      assert tried == {(128, 8), (64, 4)}, tried
    for p in (_problem(128, 14336, 4096, kind=kind, trans_a=True),
              _problem(512, 14336, 4096, kind=kind), _problem(32, 768, 1024, kind=kind)):
      assert not gpu.default_config(p, "blocked").swap_ab, p
  rows256 = gpu.default_config(_problem(256, 14336, 4096), "blocked")
  assert (rows256.block_m, rows256.block_n, rows256.align_operands) == (128, 128, True)
  small = gpu.default_config(_problem(100, 60, 200), "blocked")
  assert (small.block_m, small.block_n, small.block_k) == (128, 64, 128)
  assert not small.align_operands   # 32 KB of operands: read as stored
  # The interpreter has no SMs to fill: the largest tile, clamped to the problem (70 rows
  # of a B stored (N, K); (K, N) takes the in-place tile).
  cpu = TritonScaledMatmul(num_sms=0)
  nt = cpu.default_config(_problem(70, 200, 40, trans_b=True), "blocked")
  assert (nt.block_m, nt.block_n, nt.block_k) == (128, 128, 64)
  nn = cpu.default_config(_problem(70, 200, 40), "blocked")
  assert (nn.block_m, nn.block_n, nn.block_k, nn.align_operands) == (128, 64, 64, False)


def test_auto_runs_xla_until_measured():
  """No structural win is claimed: backend="auto" keeps XLA's program."""
  from jaxgemm import dispatch  # noqa: PLC0415
  p = _problem(8192, 8192, 8192)
  assert TritonScaledMatmul().structural_win(p, "NVIDIA H100 80GB HBM3") is None
  assert dispatch.choose(p, "auto").backend == "xla"


# ---------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_long_k_compiled_against_float64(kind, trans_a, trans_b, rng):
  """K = 16384 (and 16384 - 64: a partial last block) compiled for the GPU with the
  heuristic's config (the Triton transpose before K-major fp8 tiles; at 96 rows against a
  B stored (K, N), in place: swapped, the weight through registers, or f16 math with block
  scales): the error stays within ACC_TOL of |A| @ |B| (unpromoted FP8
  wgmma accumulation would exceed it, tests/test_scaled_matmul.py), for every
  layout (relaid K-major) and scale kind."""
  # 96 rows: a B stored (K, N) is read in place (swapped, or f16 math with block scales).
  for m, n, k in ((256, 384, 16384), (200, 136, 16384 - 64), (96, 256, 16384)):
    a_block = (A_BLOCK_T if trans_a else A_BLOCK)[kind]
    b_block = (B_BLOCK_T if trans_b else B_BLOCK)[kind]
    a, sa, a64 = operands(rng, (k, m) if trans_a else (m, k), E4M3, a_block, spread=False)
    b, sb, b64 = operands(rng, (n, k) if trans_b else (k, n), E4M3, b_block, spread=False)
    for out_dtype in (F32, BF16):
      out = jaxgemm.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, trans_a=trans_a,
                                  trans_b=trans_b, backend="triton")
      ref, bound = reference(a64.T if trans_a else a64, b64.T if trans_b else b64)
      assert_gemm_close(out, ref, bound, OUT_STEP[out_dtype] + ACC_TOL,
                        f"{kind} {m}x{k}x{n} {out_dtype}")
