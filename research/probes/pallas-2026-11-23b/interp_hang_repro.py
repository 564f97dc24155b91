"""CPU repro: the ring kernel (`ring.patch`) hangs in the Mosaic GPU interpreter.

`git apply research/probes/pallas-2026-11-23b/ring.patch`, then
  PYTHONPATH=$PWD .venv/bin/python research/probes/pallas-2026-11-23b/interp_hang_repro.py sk 896 N
(`sk`: stream_k forced on 6 interpreted SMs, as tests/test_pallas.py's
test_interpreter_stream_k; `cl`: clusters only; then N and T or N for trans_b).
On this 2-core machine with jax 0.10.2: `sk 896 T` finished in 1 run of 5 with the
ring (per-tile drains in the interpreter too: 0 of 5), `sk 896 N` in 1 of 3, `cl 896 T`
in 2 of 2; main's kernel finished `sk 896 T` in 2 of 2 (about 25 s each). A hang
prints the threads after 60 s and exits.
"""
import faulthandler
import sys

faulthandler.dump_traceback_later(60, exit=True)
sys.path.insert(0, "tests")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import test_pallas as T  # noqa: E402
from jaxgemm.kernels.pallas import common, warp_specialized as ws  # noqa: E402

ws.MAX_STREAM_K_SHARE = 1.0
common.num_sms = lambda interpret: 6
variant, n, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = T.problem(1, 128, n, 128, jnp.bfloat16, trans_a=False, trans_b=flags == "T")
cfg = T.small_config("stream_k", cluster_m=1, cluster_n=2)
a, b = T.operands(p, seed=4)
out = jax.jit(lambda a, b: ws.persistent_call(a, b, p, cfg, True, 1, 2,
                                              stream_k=variant == "sk"))(a, b)
T.assert_close(out, T.reference(a, b, p), p)
print("ok")
