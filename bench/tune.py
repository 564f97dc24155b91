"""Tune the benchmark's problems: what made jaxgemm's shipped H200 table.

    python -m bench tune --suite square,llm,training            # into the user cache
    python -m bench tune --suite square,llm,training --cache jaxgemm/tables/nvidia-h200.json
    python -m bench tune --suite epilogue                       # fused epilogues, glu, SwiGLU step

Collects the GEMM problems of the named suites (their default sets) and, for
`training`, every GEMM of the benchmark's training step (forward and backward),
and, for `epilogue`, every GEMM its default problems run (the fused forward, the
gated backward GEMMs of fwd+bwd) and every GEMM of its SwiGLU training step,
and runs `jaxgemm.autotune` on them. Runs are resumable: problems the cache
already holds for the installed kernels are skipped, so a run cut short by
--time-budget continues where it stopped.
"""

from __future__ import annotations

import argparse
import functools
import time

from . import problems as P
from . import suites as S
from .ops.fused_matmul import EPILOGUE_SUITES
from .ops.matmul import TRAINING


def training_problems(dtype_name: str, quick: bool = False):
  """The GEMMs (forward and backward) of the training suite's step on a GPU."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  import jaxgemm  # noqa: PLC0415

  from . import training as T  # noqa: PLC0415
  cfg = T.GPU_MODEL_QUICK if quick else T.GPU_MODEL
  params = jax.eval_shape(lambda: T.init_params(cfg, 0))
  tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
  loss = functools.partial(T.forward_loss, cfg=cfg, mm=T.make_mm("auto", T.DEFAULT_VARIANT,
                                                                    dtype_name),
                           dtype=P.dtype_of(dtype_name))
  return jaxgemm.problems_in(loss, params, tokens, tokens, backward=True)


def epilogue_problems(dtype_name: str, suite: str = "epilogue"):
  """Every GEMM (fused_matmul, glu, matmul) the epilogue suite's default problems run
  through jaxgemm, forward and backward, then those of its SwiGLU training step."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  import jaxgemm  # noqa: PLC0415

  from . import epilogue as E  # noqa: PLC0415
  from . import training as T  # noqa: PLC0415
  from .runner import AUTO, AUTO_VARIANT  # noqa: PLC0415
  dt = P.dtype_of(dtype_name)
  found = []
  for bp in S.select(suite, default_only=True, quick=False):
    args = [jax.ShapeDtypeStruct(s, dt) for s in bp.input_shapes()]
    found += jaxgemm.problems_in(E.kernel_fn(bp, dtype_name, AUTO, AUTO_VARIANT), *args,
                                 backward=False)      # fwd+bwd problems hold their backward
  cfg = T.swiglu_model(suite == "epilogue")
  params = jax.eval_shape(lambda: T.init_params(cfg, 0))
  tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
  loss = functools.partial(T.forward_loss, cfg=cfg, mm=None, dtype=dt,
                           ep=T.make_epilogues(AUTO, AUTO_VARIANT, dtype_name))
  found += jaxgemm.problems_in(jax.grad(loss), params, tokens, tokens, backward=False)
  return list(dict.fromkeys(found))


def main(argv) -> int:
  ap = argparse.ArgumentParser(prog="python -m bench tune", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--suite", default="square,llm,training",
                  help="comma-separated suites whose default problems are tuned "
                       "(default: %(default)s)")
  ap.add_argument("--dtype", default="bf16", choices=list(P.DTYPES))
  ap.add_argument("--backends", default=None,
                  help="comma-separated kernel backends (default: every usable one)")
  ap.add_argument("--cache", default="default",
                  help="the tuning file to update (default: $JAXGEMM_AUTOTUNE_CACHE or "
                       "~/.cache/jaxgemm/autotune.json)")
  ap.add_argument("--time-budget", type=float, default=540.0,
                  help="seconds; the rest is left for the next run (default %(default)s)")
  ap.add_argument("--iters", type=int, default=None)
  ap.add_argument("--retune", action="store_true", help="time already tuned problems again")
  args = ap.parse_args(argv)

  import jaxgemm  # noqa: PLC0415

  from .runner import gemm_problem, setup_triton_cache  # noqa: PLC0415
  setup_triton_cache()
  problems = []
  for suite in (s.strip() for s in args.suite.split(",") if s.strip()):
    if suite == TRAINING:
      problems += training_problems(args.dtype)
    elif suite in EPILOGUE_SUITES:
      problems += epilogue_problems(args.dtype, suite)
    elif suite in P.SUITES:
      problems += [gemm_problem(bp, bp.dtype or args.dtype)
                   for bp in S.select(suite, default_only=True, quick=False)]
    else:
      raise SystemExit(f"unknown suite {suite!r}; valid: "
                       f"{[*P.SUITES, TRAINING, *EPILOGUE_SUITES]}")
  backends = None if args.backends is None else [
      b.strip() for b in args.backends.split(",") if b.strip()]
  t0 = time.perf_counter()
  report = jaxgemm.autotune(problems=problems, backends=backends, backward=False,
                            time_budget_s=args.time_budget, iters=args.iters,
                            cache_path=args.cache, retune=args.retune)
  print(report.summary())
  print(f"tuning took {time.perf_counter() - t0:.1f} s")
  return 0
