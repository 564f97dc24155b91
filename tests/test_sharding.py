"""Sharding: the rule mechanism (`jaxgemm.sharding`), real kernels on a 1-device mesh,
and, in processes of their own, the 8-device tests (`tests/sharding_on_8_devices.py`,
`tests/sharding_cost_on_8_devices.py`: the MLP layouts decided by cost, issue 44, and
`tests/collective_matmul_on_8_devices.py`: the rings of issue 46).

This process has one device (the suite's). What runs here with the real interpreted
Triton kernel: a sharded program on a 1-device mesh (Auto and Explicit axes, grad) and
a shard_map with check_vma=True (grad). On 8 devices the kernels cannot run interpreted
under jit's partitioning (a clear NotImplementedError; see sharding_on_8_devices.py):
there `backend="xla"` and the recorded local problems show what each kernel would get.
"""

from __future__ import annotations

import difflib
import importlib
import pathlib
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from gemm_testing import assert_gemm_close, matmul_reference, random_array, tolerance
from host_devices import run_on_8_host_devices
from jaxgemm import sharding
from jaxgemm.ops.matmul import primitive

F32 = np.float32
HIGHEST = lax.Precision.HIGHEST
MATMUL = sharding.EinsumRule.parse("m k, k n -> m n")
EIGHT_DEVICE_TESTS = pathlib.Path(__file__).with_name("sharding_on_8_devices.py")
COST_TESTS = pathlib.Path(__file__).with_name("sharding_cost_on_8_devices.py")
RING_TESTS = pathlib.Path(__file__).with_name("collective_matmul_on_8_devices.py")
MODEL_TESTS = pathlib.Path(__file__).with_name("models_on_8_devices.py")


# ---------------------------------------------------------------- 8 devices


@pytest.mark.parametrize("tests", [EIGHT_DEVICE_TESTS, COST_TESTS, RING_TESTS, MODEL_TESTS],
                         ids=["rules", "cost", "rings", "models"])
def test_on_8_host_devices(tests):
  """Runs a file of 8-device tests (the rules' `tests/sharding_on_8_devices.py`, the
  cost-decided MLPs' `tests/sharding_cost_on_8_devices.py`, the collective matmuls'
  `tests/collective_matmul_on_8_devices.py`, the models suite's data x tensor parallel
  rows' `tests/models_on_8_devices.py`) with 8 host CPU devices, in
  its own process (XLA_FLAGS is read once, when jax starts), with this session's seed."""
  run_on_8_host_devices(tests, timeout_s=540)


# ---------------------------------------------------------------- the rule


def test_rule_parses_einsum_text_and_names_its_reduction():
  rule = sharding.EinsumRule.parse("b m k, b k n, n -> b m n", replicated=("k",))
  assert rule.operands == (("b", "m", "k"), ("b", "k", "n"), ("n",))
  assert rule.result == ("b", "m", "n")
  assert rule.reduction == ("k",)
  assert str(rule) == "b m k, b k n, n -> b m n"


def test_rule_with_results_of_their_own_dimensions():
  """A cast-transpose: q keeps x's sharding and q^T takes its transpose; Shardy gets
  each result's factors."""
  rule = sharding.EinsumRule.parse("r c, -> r c, c r")
  assert rule.operands == (("r", "c"), ()) and rule.results == (("r", "c"), ("c", "r"))
  assert rule.reduction == () and str(rule) == "r c,  -> r c, c r"
  p = sharding.plan(rule, [P("d", "e"), P()])
  assert p.results == (P("d", "e"), P("e", "d"))
  text, _ = sharding.shardy_rule(rule, num_results=2)
  assert text.endswith("-> r c, c r")
  with pytest.raises(ValueError, match="has 2 results; the op has 3"):
    sharding.shardy_rule(rule, num_results=3)


def test_result_only_factors_stay_whole():
  """A block quantizer's scales: their block counts are in no operand, so the rule
  replicates them; the plan leaves them whole wherever x is sharded, and Shardy is told
  they need replication."""
  rule = sharding.EinsumRule.parse("r c -> r c, r nc, c r, nc nr", replicated=("nr", "nc"))
  assert rule.factors == ("r", "c") and rule.reduction == ()
  p = sharding.plan(rule, [P("d", "e")])
  assert p.results == (P("d", "e"), P("d", None), P("e", "d"), P(None, None))
  text, sets = sharding.shardy_rule(rule, num_results=4)
  assert text == "r c -> r c, r nc, c r, nc nr"
  # In the order the factors appear (Shardy's verifier wants the indices sorted).
  assert sets["need_replication_factors"] == ("nc", "nr") and sets["reduction_factors"] == ()


@pytest.mark.parametrize("text, replicated, match", [
    ("m k, k n", (), "must read 'operand, operand -> result'"),
    ("m k, k n -> m, n", (), "reduces nothing"),
    ("m k, k n -> m x", (), r"result factors \['x'\] must appear in an operand or be "
                            r"replicated"),
    ("m k, k n -> m m", (), "must name each factor once"),
    ("m k-1, k n -> m n", (), "must be an identifier"),
    ("m k, k n -> m n", ("q",), r"replicated=\('q',\) must name the rule's factors"),
])
def test_rule_errors_name_the_argument(text, replicated, match):
  with pytest.raises(ValueError, match=match):
    sharding.EinsumRule.parse(text, replicated=replicated)


def test_shardy_gets_each_factor_in_one_set():
  """Shardy refuses a factor that is both a reduction and never sharded."""
  convert = sharding._internal("jax._src.custom_partitioning_sharding_rule",
                               "str_to_sdy_sharding_rule")
  rule = sharding.EinsumRule.parse("m k, g k n, s -> m n", replicated=("s",))
  text, factors = sharding.shardy_rule(rule)
  assert factors == dict(reduction_factors=("k", "g"), need_replication_factors=("s",))
  convert(text, **factors)   # raises on a factor in two sets


@pytest.mark.parametrize("flags, ndims, text", [
    ((False, False), (1, 1, 1, 1), "b m k, b k n -> b m n"),
    ((True, False), (1, 1, 1, 1), "b k m, b k n -> b m n"),
    ((False, True), (1, 1, 1, 1), "b m k, b n k -> b m n"),
    ((True, True), (0, 1, 1, 1), "k m, n k -> m n"),
    ((False, False), (2, 2, 1, 0), "b0 b1 m0 m1 k, b0 b1 k -> b0 b1 m0 m1"),
])
def test_matmul_p_declares_its_einsum(flags, ndims, text):
  """matmul_p's rule permutes with the transpose flags and spans each group's dims."""
  rule = primitive.sharding_rule(trans_a=flags[0], trans_b=flags[1], ndims=ndims)
  assert str(rule) == text


# ---------------------------------------------------------------- plan()


@pytest.mark.parametrize("a, b, result, operands, reduce_axes", [
    (P("d", None), P(), P("d", None), (P("d", None), P(None, None)), ()),          # M
    (P(), P(None, "d"), P(None, "d"), (P(None, None), P(None, "d")), ()),          # N
    (P(None, "d"), P("d", None), P(None, None), (P(None, "d"), P("d", None)), ("d",)),   # K
    # K sharded in one operand only: the other is sliced to match (no gather).
    (P(None, "d"), P(), P(None, None), (P(None, "d"), P("d", None)), ("d",)),
    # data x model: M over data, N over model, K whole.
    (P("data", None), P(None, "model"), P("data", "model"),
     (P("data", None), P(None, "model")), ()),
    # K over both axes of a 2-D mesh: one reduction over both.
    (P(None, ("x", "y")), P(("x", "y"), None), P(None, None),
     (P(None, ("x", "y")), P(("x", "y"), None)), ("x", "y")),
], ids=["M", "N", "K", "K in a only", "2-D mesh", "K over two axes"])
def test_plan_keeps_every_operand_sharding(a, b, result, operands, reduce_axes):
  p = sharding.plan(MATMUL, [a, b])
  assert (p.operands, p.result, p.reduce_axes, p.scatter_dim) == (
      operands, result, reduce_axes, None)


def test_plan_gives_a_mesh_axis_to_one_factor_only():
  """a's M and b's N both on 'd': M (first) keeps it, b is resharded (replicated on N)."""
  p = sharding.plan(MATMUL, [P("d", None), P(None, "d")])
  assert p.operands == (P("d", None), P(None, None)) and p.result == P("d", None)
  # The same factor on different axes in two operands: the first operand's wins.
  p = sharding.plan(MATMUL, [P(None, "x"), P("y", None)])
  assert p.operands == (P(None, "x"), P("x", None)) and p.reduce_axes == ("x",)


@pytest.mark.parametrize("result_spec, scatter_dim, result", [
    (P("d", None), 0, P("d", None)),
    (P(None, "d"), 1, P(None, "d")),
    (P(None, None), None, P(None, None)),
    (P("e", None), None, P("e", None)),   # another axis: rows split there, then all-reduce
])
def test_plan_scatters_a_reduction_into_the_result_sharding(result_spec, scatter_dim, result):
  p = sharding.plan(MATMUL, [P(None, "d"), P("d", None)], result_spec)
  assert (p.reduce_axes, p.scatter_dim, p.result) == (("d",), scatter_dim, result)


def test_plan_scatters_only_into_a_dimension_that_divides():
  """psum_scatter(tiled=True) needs equal pieces: 60 rows over 8 devices all-reduce."""
  specs = [P(None, "d"), P("d", None)]
  uneven = sharding.plan(MATMUL, specs, P("d", None), result_shape=(60, 48),
                         axis_sizes={"d": 8})
  even = sharding.plan(MATMUL, specs, P("d", None), result_shape=(64, 48), axis_sizes={"d": 8})
  assert (uneven.scatter_dim, even.scatter_dim) == (None, 0)
  assert uneven.result == P(None, None)


def test_plan_splits_replicated_operands_where_the_result_is_sharded():
  """A result factor no operand shards takes the result's axes: each device computes
  its block from locally sliced operands instead of the whole product."""
  p = sharding.plan(MATMUL, [P(), P()], P(None, "d"))
  assert p.operands == (P(None, None), P(None, "d")) and p.result == P(None, "d")


def test_plan_leaves_replicated_factors_whole():
  """A factor the op cannot split (an epilogue after the reduction) is gathered."""
  rule = sharding.EinsumRule.parse("m k, k n -> m n", replicated=("k",))
  p = sharding.plan(rule, [P("d", "e"), P("e", None)])
  assert p.operands == (P("d", None), P(None, None)) and p.reduce_axes == ()


def test_plan_checks_the_operand_count():
  with pytest.raises(ValueError, match="operand_specs has 1 entries; rule m k, k n -> m n "
                                       "takes 2 operands"):
    sharding.plan(MATMUL, [P()])


# ---------------------------------------------------------------- plan() by cost (issue 44)

TP4 = {"tp": 4}


def _types_of(rule, sizes, dtype=jnp.bfloat16):
  """Each operand's global type, from the rule's factors and `sizes` (factor -> size)."""
  return [jax.ShapeDtypeStruct(tuple(sizes[f] for f in dims), dtype) for dims in rule.operands]


def _specs_of(rule, axes):
  """Each operand's spec, its factors sharded as `axes` (factor -> mesh axis) says."""
  return [P(*(axes.get(f) for f in dims)) for dims in rule.operands]


def _cost(p, specs, types, axis_sizes, **kw):
  return sharding.moved_bytes(p, operand_specs=specs, operand_types=types,
                              axis_sizes=axis_sizes, **kw)


# Each op's own description of its dims (its sharding_rule), x's rows and W's columns
# both on "tp"; bias over N, a residual over (M, N).
OP_RULES = {
    "matmul": lambda: primitive.sharding_rule(trans_a=False, trans_b=False, ndims=(0, 1, 1, 1)),
    "matmul, W stored (N, K)": lambda: primitive.sharding_rule(trans_a=False, trans_b=True,
                                                               ndims=(0, 1, 1, 1)),
    "fused_matmul": lambda: importlib.import_module("jaxgemm.ops.fused_matmul.primitive")
        .sharding_rule(trans_a=False, trans_b=False, ndims=(0, 1, 1, 1), activation="gelu",
                       bias="shared", residual=True, gate=None),
    "glu": lambda: importlib.import_module("jaxgemm.ops.glu.primitive").sharding_rule(
        trans_a=False, trans_b=False, ndims=(0, 1, 1, 1), bias="shared"),
    "scaled_matmul": lambda: importlib.import_module("jaxgemm.ops.scaled_matmul.primitive")
        .sharding_rule(trans_a=False, trans_b=False, ndims=(0, 1, 1, 1), scale_kind="row_col"),
}


@pytest.mark.parametrize("op", list(OP_RULES))
@pytest.mark.parametrize("tokens", [8192, 65536])
def test_cost_conflict_gathers_the_smaller_operand_of_every_op(op, tokens):
  """Issue 44's Megatron sequence-parallel GEMM at Llama-3-70B sizes: x (tokens, 8192) on
  tokens and W (8192, 28672) on columns, both over "tp" (4). At 8192 tokens x (128 MiB)
  is smaller than W (448 MiB): x is gathered and W stays split, as XLA does; at 65536
  tokens x (1 GiB) is the larger and W is gathered. Every op that uses the rule decides
  by its own einsum (extra operands over M or N move with them), and the choice moves
  fewer bytes than the other one."""
  rule = OP_RULES[op]()
  sizes = {"m": tokens, "k": 8192, "n": 28672, "one": 1}
  specs = _specs_of(rule, {"m": "tp", "n": "tp"})
  types = _types_of(rule, sizes)
  p = sharding.plan(rule, specs, operand_types=types, axis_sizes=TP4)
  keep = "n" if tokens == 8192 else "m"
  assert p.factor_axes == {keep: ("tp",)}, p.factor_axes
  assert p.result == P(*({keep: "tp"}.get(f) for f in rule.result))
  other = sharding.Plan(rule, {"m" if keep == "n" else "n": ("tp",)})
  assert _cost(p, specs, types, TP4) < _cost(other, specs, types, TP4)
  # Without the global types, the first operand's sharding wins (the old rule).
  assert sharding.plan(rule, specs).factor_axes == {"m": ("tp",)}


def test_cost_sequence_parallel_moves_what_xla_moves():
  """The chosen plan's bytes are a gather of x: (n - 1) / n of 8192 x 8192 bf16 per
  device, 96 MiB, where keeping x would gather W1's 448 MiB (336 MiB sent)."""
  specs = [P("tp", None), P(None, "tp")]
  types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((8192, 8192), (8192, 28672))]
  p = sharding.plan(MATMUL, specs, operand_types=types, axis_sizes=TP4,
                    result_shape=(8192, 28672))
  assert p.operands == (P(None, None), P(None, "tp"))
  assert _cost(p, specs, types, TP4, result_shape=(8192, 28672)) == 96 * 2**20
  old = sharding.plan(MATMUL, specs)
  assert _cost(old, specs, types, TP4, result_shape=(8192, 28672)) == 336 * 2**20


@pytest.mark.parametrize("tokens, want", [
    # FSDP training: the weight (4096 x 14336) is smaller than the tokens' activations
    # (16384 x 4096) and their product: it is gathered (what FSDP means).
    (16384, dict(operands=(P("d", None), P(None, None)), reduce_axes=(), scatter_dim=None)),
    # Decode: 4 tokens meet the same weight, K-split: x moves to K (all-to-all) and the
    # partial (4, 14336) is reduce-scattered into the rows asked for; W stays in place.
    (4, dict(operands=(P(None, "d"), P("d", None)), reduce_axes=("d",), scatter_dim=0)),
])
def test_cost_fsdp_weight_on_k_gathers_or_reduces_by_size(tokens, want):
  """x on rows and W on K over one axis "d" (4): gather W, or move x to K and reduce."""
  specs, axis_sizes = [P("d", None), P("d", None)], {"d": 4}
  types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((tokens, 4096), (4096, 14336))]
  p = sharding.plan(MATMUL, specs, P("d", None), result_shape=(tokens, 14336),
                    axis_sizes=axis_sizes, operand_types=types)
  assert dict(operands=p.operands, reduce_axes=p.reduce_axes, scatter_dim=p.scatter_dim) == want
  assert p.result == P("d", None)


def test_cost_reduce_scatter_is_chosen_over_all_reduce_where_the_result_is_split():
  """In a conflict whose cheapest plan reduces, the reduction is scattered into the
  dimension the result is wanted split on (half an all-reduce's bytes), and all-reduced
  where the result is wanted whole."""
  specs = [P("d", None), P("d", None)]
  types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((4, 4096), (4096, 14336))]
  kw = dict(result_shape=(4, 14336), axis_sizes={"d": 4}, operand_types=types)
  split = sharding.plan(MATMUL, specs, P(None, "d"), **kw)
  whole = sharding.plan(MATMUL, specs, P(), **kw)
  assert (split.reduce_axes, split.scatter_dim, split.result) == (("d",), 1, P(None, "d"))
  assert (whole.reduce_axes, whole.scatter_dim, whole.result) == (("d",), None, P(None, None))


@pytest.mark.parametrize("tokens, experts, keep", [
    (65536, 8, "m"),     # many tokens, small experts: the experts are gathered
    (64, 64, "g"),       # decode against large experts: expert parallel, tokens gathered
])
def test_cost_ragged_dot_tokens_or_experts_by_size(tokens, experts, keep):
  """ragged_dot's own einsum ("b m k, b g k n, b t g -> b m n"), tokens and experts both
  on "d": the larger of the two stays split (experts split: each device its own groups,
  summed over "d")."""
  rule = importlib.import_module("jaxgemm.ops.ragged_dot.primitive").sharding_rule(
      ragged_contracting=False, trans_rhs=False)
  sizes = {"b": 1, "m": tokens, "k": 2048, "g": experts, "n": 1536, "t": 2}
  specs = _specs_of(rule, {"m": "d", "g": "d"})
  types = _types_of(rule, sizes)
  types[2] = jax.ShapeDtypeStruct(types[2].shape, jnp.int32)   # the group bounds
  p = sharding.plan(rule, specs, operand_types=types, axis_sizes={"d": 8},
                    result_shape=(1, tokens, 1536))
  assert p.factor_axes == {keep: ("d",)}
  assert p.reduce_axes == (("d",) if keep == "g" else ())


def test_cost_keeps_every_device_busy_before_saving_bytes():
  """A plan that leaves a mesh axis unused repeats the GEMM's work over it; it is not
  chosen for its fewer bytes. x's K on ("x", "y") and W's on "x" conflict; keeping K on
  both axes all-reduces a (64, 65536) partial, which moves more than gathering both
  operands would, but the gathered plan runs the whole GEMM on every device."""
  specs, axis_sizes = [P(None, ("x", "y")), P("x", None)], {"x": 2, "y": 4}
  types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((64, 8), (8, 65536))]
  kw = dict(result_shape=(64, 65536), axis_sizes=axis_sizes)
  p = sharding.plan(MATMUL, specs, operand_types=types, **kw)
  assert p.factor_axes == {"k": ("x", "y")} and p.reduce_axes == ("x", "y")
  gathered = sharding.Plan(MATMUL, {})
  assert _cost(gathered, specs, types, **kw) < _cost(p, specs, types, **kw)


def test_cost_plan_checks_the_operand_types_count():
  with pytest.raises(ValueError, match="operand_types has 1 entries; rule m k, k n -> m n "
                                       "takes 2 operands"):
    sharding.plan(MATMUL, [P(), P()], operand_types=[jax.ShapeDtypeStruct((2, 2), F32)],
                  axis_sizes={})


def test_cost_reshard_bytes_counts_gathers_all_to_alls_and_free_slices():
  sizes = {"x": 2, "y": 4}
  assert sharding.reshard_bytes((64, 32), 4, P(("x", "y"), None), P("x", None), sizes) == (
      64 * 32 * 4 / 2 * 3 / 4)                      # all-gather over y within each x
  assert sharding.reshard_bytes((64, 32), 4, P("x", "y"), P("y", "x"), sizes) == (
      64 * 32 * 4 / 8 * 7 / 8)                      # both axes move: one all-to-all of 8
  assert sharding.reshard_bytes((64, 32), 4, P("x", None), P("x", "y"), sizes) == 0


def test_vmapped_dim_is_inserted_with_its_explicit_axes():
  mesh = jax.sharding.AbstractMesh((1, 1), ("d", "e"), axis_types=(AxisType.Explicit,) * 2)
  s = NamedSharding(mesh, P("e", None))
  mapped = lambda axes: types.SimpleNamespace(explicit_mesh_axis=axes)
  assert sharding.with_vmapped_dim(s, mapped(("d",)), 1).spec == P("e", "d", None)
  assert sharding.with_vmapped_dim(s, mapped(None), 0).spec == P(None, "e", None)
  assert sharding.with_vmapped_dim(None, mapped(("d",)), 0) is None


# ---------------------------------------------------------------- API arguments


def test_out_sharding_is_read_as_jnp_reads_it():
  """A PartitionSpec needs jax.set_mesh; Auto axes cannot be named: jnp's errors."""
  a, b = jnp.ones((8, 4)), jnp.ones((4, 8))
  for call in (jnp.matmul, jaxgemm.matmul):
    with pytest.raises(ValueError, match="PartitionSpec when you are not under a mesh"):
      call(a, b, out_sharding=P("d"))
  auto = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Auto,))
  with jax.set_mesh(auto):
    for call in (jnp.matmul, jaxgemm.matmul):
      with pytest.raises(ValueError, match="cannot contain axis names that are of type Auto"):
        call(a, b, out_sharding=P("d"))


# ---------------------------------------------------------------- 1 device, real kernels


def _program(compiled) -> str:
  """The compiled HLO's entry computation without names and metadata."""
  quoted = r'"(?:[^"\\]|\\.)*"'
  text = compiled.as_text().split("ENTRY")[-1]
  text = re.sub(rf",? ?(metadata|sharding|frontend_attributes)=\{{(?:{quoted}|[^{{}}\"])*\}}",
                "", text)
  return re.sub(r"[%\w.-]*\.\d+\b", "x", text)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=str)
def test_one_device_mesh_runs_the_triton_kernel_on_the_whole_problem(axis_type, rng):
  """On a 1-device mesh the partitioned lowering is the kernel itself: the interpreted
  Triton GEMM and its two backward GEMMs run on the whole problem, with no
  custom-partitioning call left in the program, and match float64."""
  mesh = jax.make_mesh((1,), ("d",), axis_types=(axis_type,))
  a, b = random_array(rng, (24, 16), F32), random_array(rng, (16, 40), F32)
  ct = random_array(rng, (24, 40), F32)
  mm = lambda a, b: jaxgemm.matmul(a, b, precision=HIGHEST, backend="triton")
  tol = tolerance(F32, precision=HIGHEST)
  with jax.set_mesh(mesh):
    sa, sb = jax.device_put(a, P("d", None)), jax.device_put(b, P())
    with sharding.recording_local_problems() as seen:
      compiled = jax.jit(mm).lower(sa, sb).compile()
      grads = jax.jit(lambda a, b: jax.vjp(mm, a, b)[1](ct))(sa, sb)
    out = compiled(sa, sb)
  assert "CustomSPMDPartitioning" not in compiled.as_text()
  assert out.sharding.spec == P("d", None) or axis_type == AxisType.Auto
  assert_gemm_close(out, *matmul_reference(a, b), tol, "forward")
  a64, b64, ct64 = np.float64(a), np.float64(b), np.float64(ct)
  assert_gemm_close(grads[0], ct64 @ b64.T, np.abs(ct64) @ np.abs(b64.T), tol, "dA")
  assert_gemm_close(grads[1], a64.T @ ct64, np.abs(a64.T) @ np.abs(ct64), tol, "dB")
  assert sorted(x.problem.describe() for x in seen) == [
      "1x(16x24 @ 24x40) TN float32->float32", "1x(24x16 @ 16x40) NN float32->float32",
      "1x(24x40 @ 40x16) NT float32->float32"]


def test_one_device_mesh_compiles_the_unsharded_program():
  """The rule costs nothing where nothing is split (research/sharding/one_gpu.py times it
  on a GPU): a 1-device mesh compiles to the same program as the plain call."""
  mesh = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Auto,))
  a, b = jnp.ones((64, 32)), jnp.ones((32, 48))
  f = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend="xla"))
  placed = (jax.device_put(a, NamedSharding(mesh, P("d", None))),
            jax.device_put(b, NamedSharding(mesh, P())))
  assert _program(f.lower(*placed).compile()) == _program(f.lower(a, b).compile())


def test_shard_map_grad_with_check_vma_runs_the_triton_kernel(rng):
  """Under shard_map the kernel runs on the shard; grad with check_vma=True needs the
  varying-axes type through the transposes (pvary in bind)."""
  mesh = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Auto,))
  a, w = random_array(rng, (24, 16), F32), random_array(rng, (16, 40), F32)
  ct = random_array(rng, (24, 40), F32)
  mm = lambda a, b: jaxgemm.matmul(a, b, precision=HIGHEST, backend="triton")
  f = jax.shard_map(mm, mesh=mesh, in_specs=(P("d", None), P()), out_specs=P("d", None),
                    check_vma=True)
  da, dw = jax.jit(jax.grad(lambda a, w: jnp.vdot(f(a, w), ct), argnums=(0, 1)))(a, w)
  tol = tolerance(F32, precision=HIGHEST)
  a64, w64, ct64 = np.float64(a), np.float64(w), np.float64(ct)
  assert_gemm_close(da, ct64 @ w64.T, np.abs(ct64) @ np.abs(w64.T), tol, "dA")
  assert_gemm_close(dw, a64.T @ ct64, np.abs(a64.T) @ np.abs(ct64), tol, "dW")


def _gpu_one_device_programs(backend, rng):
  """(plain, sharded, placed inputs, inputs, local problems) of one GEMM on a 1-device mesh."""
  mesh = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Auto,))
  a = random_array(rng, (512, 256), jnp.bfloat16)
  b = random_array(rng, (256, 384), jnp.bfloat16)
  f = jax.jit(lambda a, b: jaxgemm.matmul(a, b, backend=backend))
  placed = (jax.device_put(a, NamedSharding(mesh, P("d", None))),
            jax.device_put(b, NamedSharding(mesh, P())))
  with sharding.recording_local_problems() as seen:
    plain, sharded = f.lower(a, b).compile(), f.lower(*placed).compile()
  return plain, sharded, placed, (a, b), seen


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "pallas", "xla"])
def test_one_device_mesh_runs_the_unsharded_kernel_on_the_gpu(backend, rng):
  """On the GPU: a 1-device mesh chooses the kernel for the whole problem, as the
  unsharded call does, and computes the same result (research/sharding/one_gpu.py
  also times the two: equal within 1% on the H200, the GPU tier at da991c2)."""
  plain, sharded, placed, args, seen = _gpu_one_device_programs(backend, rng)
  problems = [x.problem.describe() for x in seen]
  assert problems == ["1x(512x256 @ 256x384) NN bfloat16->bfloat16"] * 2, problems
  np.testing.assert_array_equal(np.asarray(sharded(*placed), np.float32),
                                np.asarray(plain(*args), np.float32))


@pytest.mark.gpu
@pytest.mark.xfail(strict=False, reason=(
    "research/sharding/one_gpu.py on the H200 (jax 0.11.2, 2026-11-25) printed 'same "
    "program: False' for triton, pallas and xla, at equal results and times; the "
    "difference was not inspected (no device time left): the assertion prints it"))
@pytest.mark.parametrize("backend", ["triton", "pallas", "xla"])
def test_one_device_mesh_compiles_the_unsharded_program_on_the_gpu(backend, rng):
  """The stronger claim: the very same compiled program, names and metadata aside."""
  plain, sharded, _, _, _ = _gpu_one_device_programs(backend, rng)
  diff = "\n".join(difflib.unified_diff(_program(plain).splitlines(),
                                        _program(sharded).splitlines(), lineterm=""))
  assert not diff, diff


# ---------------------------------------------------------------- collective matmuls


def _sp_plan(tokens, d, ff, tp):
  """The Megatron-SP MLP's first GEMM: x on tokens meets W1 on columns over "tp"."""
  specs = [P("tp", None), P(None, "tp")]
  types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((tokens, d), (d, ff))]
  return sharding.plan(MATMUL, specs, operand_types=types, axis_sizes={"tp": tp}), specs, types


def test_ring_for_follows_overlap():
  """overlap=True rings the gather of x, at any size; False never, and None (the default)
  never: no ring has measured faster than XLA's collectives (jaxgemm.collective_matmul)."""
  from jaxgemm import collective_matmul as cm
  big, specs, types = _sp_plan(8192, 8192, 28672, 2)
  axes = {"tp": 2}
  ring = cm.ring_for(big, specs, types, axes, {"overlap": True})
  assert isinstance(ring, cm.GatherRing) and ring.operand == 0 and ring.dim == 0
  assert ring.result_dim == 0 and ring.operands == (P("tp", None), P(None, "tp"))
  assert cm.ring_for(big, specs, types, axes, {"overlap": False}) is None
  assert cm.ring_for(big, specs, types, axes, {"overlap": None}) is None
  assert cm.ring_for(big, specs, types, axes, {}) is None   # an op without the param
  small, specs, types = _sp_plan(64, 32, 128, 2)
  assert cm.ring_for(small, specs, types, axes, {"overlap": True}) is not None


def test_ring_for_scatter_and_what_it_leaves_to_xla():
  """A K-split product into token-sharded rows is a scatter ring; a plan that moves over
  two axes at once, or an uneven split, keeps XLA's collective."""
  from jaxgemm import collective_matmul as cm
  types = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((8192, 28672), (28672, 8192))]
  specs = [P(None, "tp"), P("tp", None)]
  p = sharding.plan(MATMUL, specs, P("tp", None), result_shape=(8192, 8192),
                    axis_sizes={"tp": 4})
  ring = cm.ring_for(p, specs, types, {"tp": 4}, {"overlap": True})
  assert isinstance(ring, cm.ScatterRing) and ring.result_dim == 0 and ring.sliced == ((0, 0),)
  uneven = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((8190, 8192), (8192, 28672))]
  gather = [P("tp", None), P(None, "tp")]
  p = sharding.plan(MATMUL, gather, operand_types=uneven, axis_sizes={"tp": 4})
  assert cm.ring_for(p, gather, uneven, {"tp": 4}, {"overlap": True}) is None
  two = [P(("a", "b"), None), P(None, ("a", "b"))]
  even = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((8192, 8192), (8192, 28672))]
  p = sharding.plan(MATMUL, two, operand_types=even, axis_sizes={"a": 2, "b": 2})
  assert p.operands == (P(None, None), P(None, ("a", "b")))   # x gathered over a and b
  assert cm.ring_for(p, two, even, {"a": 2, "b": 2}, {"overlap": True}) is None
  p = sharding.plan(MATMUL, gather, operand_types=even, axis_sizes={"tp": 4})
  assert cm.ring_for(p, gather, even, {"tp": 4}, {"overlap": True}) is not None


def test_overlap_argument_errors_name_it():
  a, b = jnp.ones((8, 16)), jnp.ones((16, 4))
  with pytest.raises(TypeError, match=r"overlap='yes' must be None"):
    jaxgemm.matmul(a, b, overlap="yes")
  with pytest.raises(TypeError, match=r"overlap=1 must be None"):
    jaxgemm.dot_general(a, b, (((1,), (0,)), ((), ())), overlap=1)
  with pytest.raises(NotImplementedError, match=r"overlap=True\) does not run fp8= GEMMs"):
    jaxgemm.matmul(a, b, fp8="tensor", overlap=True)
  with pytest.raises(TypeError, match=r"overlap='no' must be None"):
    jaxgemm.glu(a, b, b, overlap="no")
  with pytest.raises(TypeError, match=r"overlap=0 must be None"):
    jaxgemm.matmul(a, b, bias=jnp.ones(4), overlap=0)
  # One device: nothing moves, so overlap changes nothing.
  np.testing.assert_array_equal(jaxgemm.matmul(a, b, overlap=True, backend="xla"), a @ b)
