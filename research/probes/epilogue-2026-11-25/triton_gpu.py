"""GPU probe of the Triton fused epilogues, gates and GLU (issue 27): correctness and CUPTI timing.

Calls the backends' impl directly under jax.jit (the op's primitive is not
needed), at 4096^3 bf16, batch 1, with the heuristic's variant and config:
each result against an fp32 reference (XLA at HIGHEST on the same bf16
inputs), then CUPTI kernel time paired with XLA's jnp program of the same
expression (`jaxgemm.timing.time_paired`, median of `iters`).

On the GPU machine: make gpu-env; PYTHONPATH=$PWD/.gpu-site python3 <this file>
Here (tiny shapes, interpreter, wall clock): python <this file> --cpu
"""
import dataclasses, os, sys, time, traceback

T0 = time.time()
CPU = "--cpu" in sys.argv
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", 200))

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

if not CPU:
  import jax_triton  # noqa: F401 (sets TRITON_CACHE_DIR="" at import)
  import triton
  try:
    triton.knobs.cache.dir = "/tmp/triton-cache"
  except AttributeError:
    os.environ["TRITON_CACHE_DIR"] = "/tmp/triton-cache"

from jaxgemm import timing
from jaxgemm.ops import activations
from jaxgemm.ops.fused_matmul.problem import FusedMatmulProblem
from jaxgemm.ops.fused_matmul.triton import TritonFusedMatmul
from jaxgemm.ops.glu.problem import GluProblem
from jaxgemm.ops.glu.triton import TritonGlu
from jaxgemm.ops.matmul.problem import GemmProblem
from jaxgemm.ops.matmul.triton import TritonMatmul

PLATFORM = "cpu" if CPU else "cuda"
S = 64 if CPU else 4096
ITERS = 3 if CPU else 20
BF16, F32 = jnp.bfloat16, jnp.float32
HI = lax.Precision.HIGHEST
print(f"jax {jax.__version__}, devices {jax.devices()}, S={S}", flush=True)


def dot32(a, b):
  return jnp.matmul(a.astype(F32), b.astype(F32), precision=HI)


def fused_problem(**kw):
  return FusedMatmulProblem(1, S, S, S, np.dtype(BF16), np.dtype(BF16), np.dtype(F32), **kw)


keys = iter(jax.random.split(jax.random.key(0), 16))
rand = lambda shape: jax.random.normal(next(keys), shape, F32).astype(BF16)
a, b = rand((1, S, S)), rand((1, S, S))
bias, res, zt = rand((S,)), rand((1, S, S)), rand((1, S, S))
wu = rand((1, S, S))
g = lambda name, z: activations.derivative(name, z.astype(F32))

# (name, backend, problem, operands, xla program (bf16, jnp), fp32 reference, flop factor)
CASES = [
    ("matmul", TritonMatmul(), GemmProblem(1, S, S, S, np.dtype(BF16), np.dtype(BF16),
                                           np.dtype(F32)),
     (a, b), lambda a, b: a @ b, lambda a, b: dot32(a, b), 1),
    ("bias+gelu+res", TritonFusedMatmul(), fused_problem(activation="gelu", bias="shared",
                                                         residual=True),
     (a, b, bias, res),
     lambda a, b, c, r: jax.nn.gelu(a @ b + c) + r,
     lambda a, b, c, r: jax.nn.gelu(dot32(a, b) + c.astype(F32)) + r.astype(F32), 1),
    ("bias+gelu+res save Z", TritonFusedMatmul(),
     fused_problem(activation="gelu", bias="shared", residual=True, save_preactivation=True),
     (a, b, bias, res),
     lambda a, b, c, r: (lambda z: (jax.nn.gelu(z) + r, z))(a @ b + c),
     lambda a, b, c, r: (lambda z: (jax.nn.gelu(z) + r.astype(F32), z))(
         dot32(a, b) + c.astype(F32)), 1),
    ("bias+silu", TritonFusedMatmul(), fused_problem(activation="silu", bias="shared"),
     (a, b, bias), lambda a, b, c: jax.nn.silu(a @ b + c),
     lambda a, b, c: jax.nn.silu(dot32(a, b) + c.astype(F32)), 1),
    ("gate out silu'", TritonFusedMatmul(), fused_problem(gate="out", gate_activation="silu"),
     (a, b, zt), lambda a, b, z: (g("silu", z) * (a @ b)).astype(BF16),
     lambda a, b, z: g("silu", z) * dot32(a, b), 1),
    ("gate lhs gelu'", TritonFusedMatmul(), fused_problem(gate="lhs", gate_activation="gelu"),
     (a, b, zt), lambda a, b, z: (a * g("gelu", z)).astype(BF16) @ b,
     lambda a, b, z: dot32((a * g("gelu", z)).astype(BF16), b), 1),
    ("gate rhs gelu'", TritonFusedMatmul(), fused_problem(gate="rhs", gate_activation="gelu"),
     (a, b, zt), lambda a, b, z: a @ (b * g("gelu", z)).astype(BF16),
     lambda a, b, z: dot32(a, (b * g("gelu", z)).astype(BF16)), 1),
    ("glu silu", TritonGlu(), GluProblem(1, S, S, S, np.dtype(BF16), np.dtype(BF16),
                                         np.dtype(F32), activation="silu"),
     (a, b, wu), lambda x, wg, wu: jax.nn.silu(x @ wg) * (x @ wu),
     lambda x, wg, wu: jax.nn.silu(dot32(x, wg)) * dot32(x, wu), 2),
    ("glu silu save Z", TritonGlu(), GluProblem(1, S, S, S, np.dtype(BF16), np.dtype(BF16),
                                                np.dtype(F32), activation="silu",
                                                save_preactivation=True),
     (a, b, wu), lambda x, wg, wu: (lambda zg, zu: (jax.nn.silu(zg) * zu, zg, zu))(x @ wg, x @ wu),
     lambda x, wg, wu: (lambda zg, zu: (jax.nn.silu(zg) * zu, zg, zu))(dot32(x, wg),
                                                                      dot32(x, wu)), 2),
]

# Run 2 (PROBE_SET=2): the operand gates as the backend now runs them (XLA pre-pass,
# then the plain kernel), and the saved-Z epilogue with other rungs/stages:
# (name, overrides of the heuristic's variant / config fields) added to CASES' entries.
OVERRIDES = {}
if os.environ.get("PROBE_SET") == "2":
  by_name = {c[0]: c for c in CASES}
  runs = [("matmul", {}), ("bias+gelu+res", {}), ("gate lhs gelu'", {}),
          ("gate rhs gelu'", {}), ("bias+gelu+res save Z", {}),
          ("bias+gelu+res save Z", dict(num_stages=3)),
          ("bias+gelu+res save Z", dict(variant="tensorcore")),
          ("bias+gelu+res", dict(variant="tensorcore"))]
  CASES = [(f"{n} {o}" if o else n, *by_name[n][1:]) for n, o in runs]
  OVERRIDES = {f"{n} {o}": o for n, o in runs if o}


timer = timing.Timer("cpu" if CPU else "gpu")
print(f"timer: {timer.label}", flush=True)
for name, backend, problem, args, xla_fn, ref_fn, factor in CASES:
  if time.time() - T0 > DEADLINE_S:
    print(f"{name}: skipped (deadline)")
    continue
  try:
    be = backend.for_platform(PLATFORM)
    over = dict(OVERRIDES.get(name, {}))
    variant = over.pop("variant", None) or be.default_variant(problem)
    config = dataclasses.replace(be.default_config(problem, variant), **over)
    if not over:   # an override may pass what the check's shared-memory count refuses
      be.check(problem, variant, config)
    kernel = jax.jit(be.impl(problem, variant, config, PLATFORM))
    xla = jax.jit(xla_fn)
    t = time.time()
    out = jax.block_until_ready(kernel(*args))
    compile_s = time.time() - t
    ref = jax.jit(ref_fn)(*args)
    outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
    errs = [float(jnp.linalg.norm((o.astype(F32) - r).ravel()) / jnp.linalg.norm(r.ravel()))
            for o, r in zip(outs, refs)]
    xerrs = [float(jnp.linalg.norm((o.astype(F32) - r).ravel()) / jnp.linalg.norm(r.ravel()))
             for o, r in zip(jax.tree.leaves(xla(*args)), refs)]
    jax.block_until_ready(xla(*args))
    for _ in range(2):
      jax.block_until_ready(kernel(*args))
    tk, tx = timing.time_paired(timer, kernel, xla, args, ITERS)
    mk, mx = float(np.median(tk)), float(np.median(tx))
    tflops = lambda ms: factor * 2 * S**3 / (ms * 1e-3) / 1e12
    print(f"{name:22s} {variant:10s} {config.block_m}x{config.block_n}x{config.block_k} "
          f"w{config.num_warps} s{config.num_stages} sub{config.epilogue_subtile} "
          f"align={config.align_operands} | rel err triton {max(errs):.2e} xla {max(xerrs):.2e} "
          f"| triton {mk:.3f} ms {tflops(mk):.0f} TFLOP/s, xla {mx:.3f} ms {tflops(mx):.0f} "
          f"TFLOP/s, xla/triton {mx / mk:.2f}x | compile {compile_s:.1f}s", flush=True)
  except Exception:
    print(f"{name}: FAILED")
    traceback.print_exc()
print(f"total {time.time() - T0:.0f}s")
