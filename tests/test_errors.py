"""Bad input: every mistake raises a clear exception, of the type jnp/lax raise,
naming the shapes/values involved and the valid choices, before compiling.

Errors are provoked under `jax.eval_shape` (tracing only) as well as eagerly:
raising there proves the check runs before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm
from jaxgemm import config as cfg
from jaxgemm import registry
from gemm_testing import all_kernels, best_setting

pytestmark = pytest.mark.op("matmul")

F32 = jnp.float32


def _sds(shape, dtype=F32):
  return jax.ShapeDtypeStruct(shape, dtype)


def _raises_everywhere(exc, fn, *args, match=()):
  """`fn(*args)` raises `exc` eagerly and under eval_shape; returns the message."""
  concrete = [jnp.ones(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a
              for a in args]
  with pytest.raises(exc) as eager:
    fn(*concrete)
  with pytest.raises(exc) as traced:
    jax.eval_shape(fn, *args)
  msg = str(eager.value)
  assert str(traced.value) == msg
  for m in match:
    assert re.search(m, msg), f"{m!r} not in the message: {msg}"
  return msg


def _backend_kws():
  """auto, and every registered backend by name (variant=None)."""
  return [pytest.param({}, id="auto")] + [
      pytest.param(dict(backend=b), id=b) for b in jaxgemm.backends()]


def _same_type_as(reference, exc_type, *args):
  with pytest.raises(exc_type):
    reference(*args)


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize("kw", _backend_kws())
def test_mismatched_contracting_sizes(kw):
  a, b = _sds((8, 24)), _sds((40, 16))
  _same_type_as(jnp.matmul, TypeError, jnp.ones(a.shape), jnp.ones(b.shape))
  _raises_everywhere(TypeError, lambda a, b: jaxgemm.matmul(a, b, **kw), a, b,
                     match=[r"\(8, 24\)", r"\(40, 16\)", "24", "40"])
  # 1-D operands: the vector's length is the contracting size.
  _raises_everywhere(TypeError, lambda a, b: jaxgemm.matmul(a, b, **kw), _sds((7,)),
                     _sds((8, 16)), match=[r"\(7,\)", r"\(8, 16\)"])


@pytest.mark.parametrize("kw", _backend_kws())
def test_batch_dims_do_not_broadcast(kw):
  a, b = _sds((2, 8, 24)), _sds((3, 24, 16))
  _same_type_as(jnp.matmul, ValueError, jnp.ones(a.shape), jnp.ones(b.shape))
  _raises_everywhere(ValueError, lambda a, b: jaxgemm.matmul(a, b, **kw), a, b,
                     match=[r"\(2, 8, 24\)", r"\(3, 24, 16\)", "broadcast"])


@pytest.mark.parametrize("kw", _backend_kws())
@pytest.mark.parametrize("which", [0, 1])
def test_rank0_operand(kw, which):
  args = [_sds((8, 8)), _sds((8, 8))]
  args[which] = _sds(())
  _same_type_as(jnp.matmul, ValueError, *(jnp.ones(a.shape) for a in args))
  _raises_everywhere(ValueError, lambda a, b: jaxgemm.matmul(a, b, **kw), *args,
                     match=[f"operand {which}", "ndim"])


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("backend", jaxgemm.backends())
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.bool_, np.complex64, np.uint8],
                         ids=lambda d: np.dtype(d).name)
def test_unsupported_dtype_with_named_backend(backend, dtype):
  a, b = _sds((8, 16), dtype), _sds((16, 8), dtype)
  _raises_everywhere(NotImplementedError, lambda a, b: jaxgemm.matmul(a, b, backend=backend),
                     a, b, match=[np.dtype(dtype).name, "float32", "bfloat16", backend])
  # The same call under backend="auto" is jnp.matmul's.
  out = jaxgemm.matmul(jnp.ones(a.shape, dtype), jnp.ones(b.shape, dtype))
  assert out.dtype == jnp.matmul(jnp.ones(a.shape, dtype), jnp.ones(b.shape, dtype)).dtype


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_unsupported_preferred_element_type_with_named_backend(backend):
  a, b = _sds((8, 16)), _sds((16, 8))
  _raises_everywhere(
      NotImplementedError,
      lambda a, b: jaxgemm.matmul(a, b, preferred_element_type=jnp.int32, backend=backend),
      a, b, match=["int32", "float32"])


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_unsupported_precision_with_named_backend(backend):
  a, b = _sds((8, 16)), _sds((16, 8))
  algo = lax.DotAlgorithmPreset.BF16_BF16_F32
  _raises_everywhere(
      NotImplementedError, lambda a, b: jaxgemm.matmul(a, b, precision=algo, backend=backend),
      a, b, match=["BF16_BF16_F32", "lax.Precision"])


@pytest.mark.parametrize("kw", _backend_kws())
def test_non_numeric_dtype(kw):
  keys = jax.random.split(jax.random.key(0), 16)
  with pytest.raises(TypeError, match="numeric") as e:
    jaxgemm.matmul(keys.reshape(4, 4), keys.reshape(4, 4), **kw)
  assert "key" in str(e.value)


@pytest.mark.parametrize("dtype,precision", [
    (np.float32, None), (np.float32, lax.Precision.HIGHEST), (np.float32, lax.Precision.HIGH),
    (np.float16, None), (jnp.bfloat16, None), (np.float16, lax.Precision.HIGHEST)],
    ids=["f32", "f32-highest", "f32-high", "f16", "bf16", "f16-highest"])
def test_variant_limits_are_clear(kernel, dtype, precision):
  """A (dtype, precision) a variant cannot run: NotImplementedError naming it.

  On an aligned shape of several output tiles (Pallas `clusters` pairs two),
  so the dtype/precision is the only problem; backend="auto" takes them all.
  """
  a, b = _sds((40, 24), dtype), _sds((24, 264), dtype)
  f = lambda a, b: jaxgemm.matmul(a, b, precision=precision, **kernel.kw)
  try:
    out = jax.eval_shape(f, a, b)
  except NotImplementedError as e:
    assert not kernel.is_xla, "the xla backend takes every float problem"
    msg = str(e)
    names = [np.dtype(dtype).name] + ([] if precision is None else [precision.name, "precision"])
    assert kernel.backend in msg and any(n.lower() in msg.lower() for n in names), msg
  else:
    assert out.dtype == dtype and out.shape == (40, 264)
  jax.eval_shape(lambda a, b: jaxgemm.matmul(a, b, precision=precision), a, b)


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_float64_with_x64(backend, x64):
  """float64 runs on xla; a kernel backend without it names the dtype."""
  a, b = _sds((8, 16), np.float64), _sds((16, 8), np.float64)
  f = lambda a, b: jaxgemm.matmul(a, b, backend=backend)
  try:
    out = jax.eval_shape(f, a, b)
  except NotImplementedError as e:
    assert backend != "xla"
    assert "float64" in str(e)
  else:
    assert out.dtype == np.float64
  assert jax.eval_shape(jaxgemm.matmul, a, b).dtype == np.float64


# ------------------------------------------------------- backend/variant


@pytest.mark.parametrize("bad", ["nope", "XLA", "", None, 3])
def test_unknown_backend(bad):
  msg = _raises_everywhere(ValueError, lambda a, b: jaxgemm.matmul(a, b, backend=bad),
                           _sds((8, 8)), _sds((8, 8)), match=[re.escape(repr(bad)), "auto"])
  for b in jaxgemm.backends():
    assert repr(b) in msg
  with pytest.raises(ValueError, match="valid backends"):
    jaxgemm.variants(bad)
  with pytest.raises(ValueError, match=re.escape(repr(bad))):
    jaxgemm.dot_general(jnp.ones((8, 8)), jnp.ones((8, 8)), (((1,), (0,)), ((), ())),
                        backend=bad)


@pytest.mark.parametrize("backend", jaxgemm.backends())
@pytest.mark.parametrize("bad", ["nope", "", 0])
def test_unknown_variant(backend, bad):
  msg = _raises_everywhere(
      ValueError, lambda a, b: jaxgemm.matmul(a, b, backend=backend, variant=bad),
      _sds((8, 8)), _sds((8, 8)), match=[re.escape(repr(bad)), backend])
  for v in jaxgemm.variants(backend):
    assert repr(v) in msg


@pytest.mark.parametrize("kw", [dict(variant="dot_general"), dict(config=jaxgemm.XlaConfig()),
                                dict(variant="dot_general", config=jaxgemm.XlaConfig())],
                         ids=["variant", "config", "both"])
def test_variant_or_config_with_auto(kw):
  msg = _raises_everywhere(ValueError, lambda a, b: jaxgemm.matmul(a, b, **kw),
                           _sds((8, 8)), _sds((8, 8)), match=["auto", "named|Name"])
  for b in jaxgemm.backends():
    assert repr(b) in msg
  with pytest.raises(ValueError, match="auto"):
    jaxgemm.dot_general(jnp.ones((8, 8)), jnp.ones((8, 8)), (((1,), (0,)), ((), ())), **kw)


def test_unavailable_backend(monkeypatch):
  """A backend that cannot run here is left out of backends() and named with its reason."""

  class Gone(registry.Backend):
    op = "matmul"
    name = "gone"
    config_cls = jaxgemm.XlaConfig
    variants = ("only",)

    def unavailable_reason(self):
      return "the gone package is not installed"

    def check(self, problem, variant, config):
      pass

    def default_config(self, problem, variant):
      return jaxgemm.XlaConfig()

    def impl(self, problem, variant, config, platform):
      raise AssertionError("never lowered")

  monkeypatch.setitem(registry._BACKENDS["matmul"], "gone", Gone())
  assert "gone" not in jaxgemm.backends()
  _raises_everywhere(ValueError, lambda a, b: jaxgemm.matmul(a, b, backend="gone"),
                     _sds((8, 8)), _sds((8, 8)), match=["gone package is not installed", "xla"])


# ----------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class TinyConfig(cfg.KernelConfig):
  """A config with one field of each kind of constraint (tests only)."""

  backend = "tiny"
  block: int = cfg.power_of_two(16, 256, default=64)
  stages: int = cfg.int_range(1, 8, default=2)
  parity: int = cfg.check(lambda v: v % 2 == 0, "an even number", default=2)
  flag: bool = False


@pytest.mark.parametrize("field,value,exc,match", [
    ("block", 48, ValueError, r"TinyConfig\.block=48 .*a power of two in \[16, 256\]"),
    ("block", 512, ValueError, r"block=512 .*a power of two in \[16, 256\]"),
    ("block", 8, ValueError, r"block=8 .*\[16, 256\]"),
    ("stages", 0, ValueError, r"stages=0 .*an integer in \[1, 8\]"),
    ("stages", 9, ValueError, r"stages=9 .*an integer in \[1, 8\]"),
    ("parity", 3, ValueError, r"parity=3 .*an even number"),
    ("block", 64.0, TypeError, r"TinyConfig\.block must be an int, got 64\.0"),
    ("block", True, TypeError, r"block must be an int, got True"),
    ("stages", "2", TypeError, r"stages must be an int, got '2'"),
    ("flag", 1, TypeError, r"flag must be a bool, got 1"),
])
def test_config_validation(field, value, exc, match):
  with pytest.raises(exc, match=match):
    TinyConfig(**{field: value})
  TinyConfig()   # the defaults are valid


def test_config_frozen_and_from_dict_errors():
  c = TinyConfig(block=128)
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.block = 64
  with pytest.raises(ValueError, match=r"no field\(s\) \['blk'\].*valid fields.*'block'"):
    TinyConfig.from_dict({"blk": 64})
  with pytest.raises(ValueError, match="backend='tiny'.*backend='xla'"):
    TinyConfig.from_dict({"backend": "xla", "block": 64})
  with pytest.raises(ValueError, match="block=3"):
    TinyConfig.from_json('{"backend": "tiny", "block": 3}')


CANDIDATE_BAD_INTS = (0, -1, 3, 6, 12, 10**6)


def _config_classes():
  return [pytest.param(registry.get_backend(b).config_cls, id=b) for b in jaxgemm.backends()]


@pytest.mark.parametrize("config_cls", _config_classes())
def test_registered_config_validation(config_cls):
  """Each backend's config rejects bad field values, naming the field and constraint."""
  for f in dataclasses.fields(config_cls):
    default = getattr(config_cls(), f.name)
    if isinstance(default, bool):
      with pytest.raises(TypeError, match=f"{f.name} must be a bool"):
        config_cls(**{f.name: int(default)})
      continue
    with pytest.raises(TypeError, match=f"{f.name} must be an int"):
      config_cls(**{f.name: float(default)})
    predicate = f.metadata.get("predicate")
    assert predicate is not None, f"{config_cls.__name__}.{f.name} has no constraint"
    bad = [v for v in CANDIDATE_BAD_INTS if not predicate(v)]
    assert bad, f"{config_cls.__name__}.{f.name} accepts any of {CANDIDATE_BAD_INTS}"
    for v in bad:
      with pytest.raises(ValueError, match=rf"{f.name}={v} is invalid: it must be "
                                           rf"{re.escape(f.metadata['constraint'])}"):
        config_cls(**{f.name: v})


@pytest.mark.parametrize("backend", jaxgemm.backends())
def test_config_of_wrong_type(backend):
  a, b = _sds((8, 8)), _sds((8, 8))
  cls = registry.get_backend(backend).config_cls
  for bad in (TinyConfig(), {"block_m": 64}, "default"):
    _raises_everywhere(TypeError, lambda a, b: jaxgemm.matmul(a, b, backend=backend, config=bad),
                       a, b, match=[cls.__name__, type(bad).__name__])


# ----------------------------------------------------------- dot_general


@pytest.mark.parametrize("kw", _backend_kws())
@pytest.mark.parametrize("lhs,rhs,dims,match", [
    ((8, 24), (24, 16), (((2,), (0,)), ((), ())), [r"\[2\]", r"\(8, 24\)", "0..1"]),
    ((8, 24), (24, 16), (((1,), (-1,)), ((), ())), [r"\[-1\]", r"\(24, 16\)"]),
    ((2, 8, 24), (2, 24, 16), (((2,), (1,)), ((3,), (0,))), [r"\[3\]", r"\(2, 8, 24\)"]),
], ids=["lhs-contracting", "rhs-negative", "lhs-batch"])
def test_dot_general_dims_out_of_range(kw, lhs, rhs, dims, match):
  _same_type_as(lax.dot_general, TypeError, jnp.ones(lhs), jnp.ones(rhs), dims)
  _raises_everywhere(TypeError, lambda l, r: jaxgemm.dot_general(l, r, dims, **kw),
                     _sds(lhs), _sds(rhs), match=match)


@pytest.mark.parametrize("kw", _backend_kws())
@pytest.mark.parametrize("lhs,rhs,dims,match", [
    ((8, 24), (40, 16), (((1,), (0,)), ((), ())), ["contracting", r"\(8, 24\)", r"\(40, 16\)"]),
    ((2, 8, 24), (3, 24, 16), (((2,), (1,)), ((0,), (0,))), ["batch", r"\(2,\)", r"\(3,\)"]),
    ((8, 24), (24, 16), (((1,), (0, 1)), ((), ())), ["as many"]),
], ids=["contracting", "batch", "count"])
def test_dot_general_size_mismatch(kw, lhs, rhs, dims, match):
  _same_type_as(lax.dot_general, TypeError, jnp.ones(lhs), jnp.ones(rhs), dims)
  _raises_everywhere(TypeError, lambda l, r: jaxgemm.dot_general(l, r, dims, **kw),
                     _sds(lhs), _sds(rhs), match=match)


@pytest.mark.parametrize("lhs,rhs,dims,match", [
    ((3, 2, 4), (3, 4, 5), (((0, 2), (0, 1)), ((), ())), "not one increasing run"),
    ((3, 2, 4), (2, 4, 5), (((2,), (1,)), ((1,), (0,))), "not the leading"),
    ((2, 3), (4, 5), (((), ()), ((), ())), "contracts 0"),
    ((2, 7, 3), (7, 5), (((1,), (0,)), ((), ())), "not first or last"),
    ((3, 8), (8, 5), (((1,), (0,)), ((), ())), None),    # maps: a control case
], ids=["two-contracting-apart", "batch-not-leading", "outer", "contract-middle", "control"])
def test_dot_general_unmapped_dims_named_backend(kernel, lhs, rhs, dims, match):
  """Dimension numbers matmul_p cannot express: NotImplementedError naming why."""
  f = lambda l, r, **kw: jaxgemm.dot_general(l, r, dims, **kw, **kernel.kw)
  if match is None:
    dtype, precision = best_setting(kernel, lhs, rhs,
                                   fn=lambda l, r, **kw: jaxgemm.dot_general(l, r, dims, **kw))
    jax.eval_shape(lambda l, r: f(l, r, precision=precision), _sds(lhs, dtype), _sds(rhs, dtype))
    return
  _raises_everywhere(NotImplementedError, f, _sds(lhs), _sds(rhs),
                     match=[match, repr(kernel.backend)])
  # ... while backend="auto" gives lax.dot_general's answer (see test_api.py).
  out = jax.eval_shape(lambda l, r: jaxgemm.dot_general(l, r, dims), _sds(lhs), _sds(rhs))
  assert out == jax.eval_shape(lambda l, r: lax.dot_general(l, r, dims), _sds(lhs), _sds(rhs))


# ------------------------------------------------------------- matmul_p


def test_matmul_p_abstract_eval_checks():
  bind = lambda a, b, **kw: jaxgemm.matmul_p.bind(
      a, b, **{**dict(trans_a=False, trans_b=False, out_dtype=np.dtype(F32),
                      acc_dtype=np.dtype(F32), precision=None, backend="xla",
                      variant="dot_general", config=None), **kw})
  with pytest.raises(TypeError, match=r"3-D.*a\.shape=\(8, 8\)"):
    jax.eval_shape(bind, _sds((8, 8)), _sds((1, 8, 8)))
  with pytest.raises(TypeError, match=r"contracting sizes differ.*K=8.*K=4"):
    jax.eval_shape(bind, _sds((1, 4, 8)), _sds((1, 4, 8)))
  with pytest.raises(TypeError, match="batch sizes differ"):
    jax.eval_shape(bind, _sds((2, 4, 8)), _sds((3, 8, 4)))
  with pytest.raises(TypeError, match="share a dtype"):
    jax.eval_shape(bind, _sds((1, 4, 8)), _sds((1, 8, 4), jnp.bfloat16))
  out = jax.eval_shape(lambda a, b: bind(a, b, trans_a=True, trans_b=True),
                       _sds((2, 8, 4)), _sds((2, 5, 8)))
  assert out.shape == (2, 4, 5)


def test_kernels_listed():
  """The test base sees every registered backend's variants (the parametrization source)."""
  kernels = all_kernels("matmul")
  assert ("matmul", "xla", "dot_general") in kernels
  assert {k.backend for k in kernels} == set(jaxgemm.backends())


# ------------------------------------------------------- issue 43's contract slips


def test_autotune_refuses_a_backend_no_op_has():
  """backends=["cuda"] was tuned as nothing at all ("no kernel passed; XLA")."""
  x = _sds((64, 32))
  for problems in ((), jaxgemm.problems_in(jaxgemm.matmul, x, x.update(shape=(32, 16)))):
    with pytest.raises(ValueError, match=r"backends=\['cuda'\] names 'cuda'") as e:
      jaxgemm.autotune(problems=problems, backends=["cuda"], cache_path=None, log=None)
    for name in jaxgemm.backends("matmul"):
      assert repr(name) in str(e.value)
  with pytest.raises(TypeError, match=r"did you mean backends=\['triton'\]"):
    jaxgemm.autotune(problems=(), backends="triton", cache_path=None, log=None)


@pytest.mark.parametrize("knob,value,exc,match", [
    ("iters", 0, ValueError, r"iters=0 must be at least 1"),
    ("iters", -3, ValueError, r"iters=-3 must be at least 1"),
    ("iters", 2.5, TypeError, r"iters must be an int"),
    ("iters", True, TypeError, r"iters must be an int"),
    ("time_budget_s", -1, ValueError, r"time_budget_s=-1 must be at least 0"),
    ("time_budget_s", float("nan"), ValueError, r"time_budget_s=nan must be at least 0"),
    ("time_budget_s", "60", TypeError, r"time_budget_s must be a number"),
    ("seed", 1.0, TypeError, r"seed must be an int"),
])
def test_autotune_numeric_knobs_are_checked(knob, value, exc, match):
  """iters=0 silently became the default (3) before."""
  with pytest.raises(exc, match=match):
    jaxgemm.autotune(problems=(), backends=[], cache_path=None, log=None, **{knob: value})
  # The same call with a valid value runs (nothing to tune).
  valid = {"iters": 1, "time_budget_s": 0, "seed": 7}[knob]
  assert jaxgemm.autotune(problems=(), backends=[], cache_path=None, log=None,
                          **{knob: valid}).tuned == []


def test_ragged_dot_general_takes_its_dimension_numbers_type_only():
  """A plain tuple raised AttributeError (lax.ragged_dot_general in jax 0.10.2 too: it
  reads the fields by name); now a TypeError naming the argument and the type."""
  lhs, rhs, sizes = _sds((6, 4)), _sds((2, 4, 3)), _sds((2,), jnp.int32)
  fields = ((([1], [1]), ([], [])), [0], [0])
  with pytest.raises(AttributeError):
    lax.ragged_dot_general(jnp.ones(lhs.shape), jnp.ones(rhs.shape), jnp.array([2, 4]),
                           ((((1,), (1,)), ((), ())), (0,), (0,)))
  for bad in (fields, None, "ragged"):
    for kw in ({}, dict(backend="xla")):
      _raises_everywhere(
          TypeError, lambda l, r, g: jaxgemm.ragged_dot_general(l, r, g, bad, **kw),
          lhs, rhs, sizes, match=["ragged_dot_dimension_numbers must be a "
                                  "lax.RaggedDotDimensionNumbers", type(bad).__name__])
  # The conversion the message suggests is the call lax takes.
  numbers = lax.RaggedDotDimensionNumbers(*fields)
  assert jax.eval_shape(lambda l, r, g: jaxgemm.ragged_dot_general(l, r, g, numbers),
                        lhs, rhs, sizes).shape == (6, 3)


@pytest.mark.parametrize("call", [
    lambda x, w, activation: jaxgemm.glu(x, w, w, activation=activation),
    lambda x, w, activation: jaxgemm.matmul(x, w, activation=activation),
], ids=["glu", "matmul-epilogue"])
def test_activation_that_refuses_integers_is_named(call):
  """silu (and sigmoid) of an int32 GEMM: the jnp expression raises lax's "logistic does
  not accept dtype int32"; so do we, naming the activation and what works."""
  x, w = _sds((4, 8), jnp.int32), _sds((8, 16), jnp.int32)
  xs, ws = jnp.ones(x.shape, x.dtype), jnp.ones(w.shape, w.dtype)
  _same_type_as(lambda x, w: jax.nn.silu(x @ w) * (x @ w), TypeError, xs, ws)
  for activation in ("silu", "sigmoid"):
    _raises_everywhere(TypeError, lambda x, w: call(x, w, activation), x, w,
                       match=[f"activation='{activation}'", "int32", "does not accept",
                              "preferred_element_type", r"\['relu', 'gelu', 'gelu_exact', "
                                                        r"'tanh'\]"])
  # The activations that take integers compute what jnp does (relu keeps int32).
  out = call(xs, ws, "relu")
  assert out.dtype == jnp.int32 and out.shape == (4, 16)
  assert call(xs, ws, "tanh").dtype == jnp.tanh(xs @ ws).dtype


def _precision_calls():
  x, w, experts = jnp.ones((8, 16)), jnp.ones((16, 8)), jnp.ones((2, 16, 8))
  e4m3, one = jnp.float8_e4m3fn, jnp.float32(1)
  numbers = lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])
  sizes = jnp.array([3, 5])
  return {
      "matmul": (lambda p, **kw: jaxgemm.matmul(x, w, precision=p, **kw),
                 lambda p: jnp.matmul(x, w, precision=p)),
      "dot_general": (lambda p, **kw: jaxgemm.dot_general(x, w, NN, precision=p, **kw),
                      lambda p: lax.dot_general(x, w, NN, precision=p)),
      "fused_matmul": (lambda p, **kw: jaxgemm.matmul(x, w, activation="relu", precision=p,
                                                      **kw),
                       lambda p: jnp.matmul(x, w, precision=p)),
      "glu": (lambda p, **kw: jaxgemm.glu(x, w, w, precision=p, **kw),
              lambda p: jnp.matmul(x, w, precision=p)),
      "ragged_dot": (lambda p, **kw: jaxgemm.ragged_dot(x, experts, sizes,
                                                        precision=p, **kw),
                     lambda p: lax.ragged_dot(x, experts, sizes, precision=p)),
      "ragged_dot_general": (
          lambda p, **kw: jaxgemm.ragged_dot_general(x, experts, sizes, numbers,
                                                     precision=p, **kw),
          lambda p: lax.ragged_dot_general(x, experts, sizes, numbers,
                                           precision=p)),
      "scaled_matmul": (
          lambda p, **kw: jaxgemm.scaled_matmul(x.astype(e4m3), jnp.ones((16, 128), e4m3),
                                                one, one, precision=p, **kw),
          lambda p: lax.dot_general(x, w, NN, precision=p)),
  }


NN = (((1,), (0,)), ((), ()))


@pytest.mark.parametrize("op", list(_precision_calls()))
@pytest.mark.parametrize("kw", _backend_kws())
@pytest.mark.parametrize("bad", ["bogus", 3, ("highest", "nope")], ids=["name", "int", "pair"])
def test_bogus_precision_raises_what_jnp_raises(op, kw, bad):
  """A precision lax refuses: lax's ValueError (it lists the valid precisions) on every
  backend; a named backend raised NotImplementedError before."""
  ours, theirs = _precision_calls()[op]
  with pytest.raises(ValueError) as expected:
    theirs(bad)
  with pytest.raises(ValueError) as got:
    ours(bad, **kw)
  assert str(got.value) == str(expected.value)
  assert "Precision argument must be one of" in str(got.value) and "'highest'" in str(got.value)


@pytest.mark.parametrize("backend", jaxgemm.backends())
@pytest.mark.parametrize("call", [
    lambda a, b, backend: jaxgemm.matmul(a, b, backend=backend),
    lambda a, b, backend: jaxgemm.ragged_dot(a, jnp.stack([b, b]), jnp.array([4, 4]),
                                             backend=backend),
], ids=["matmul", "ragged_dot"])
def test_integer_dtype_error_lists_the_kernel_dtypes_truthfully(call, backend):
  """No kernel takes float64 (XLA's dot does): the message listed it among theirs."""
  msg = _raises_everywhere(
      NotImplementedError, lambda a, b: call(a, b, backend), _sds((8, 16), jnp.int32),
      _sds((16, 4), jnp.int32),
      match=[repr(backend), "int32",
             re.escape("kernels take floating operands ['float16', 'bfloat16', 'float32'], "
                       "and backend='xla' float64 as well")])
  assert msg.count("float64") == 1
