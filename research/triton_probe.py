"""Triton development probe (GPU only): rungs and configs vs XLA, and native Triton vs jax-triton.

Not the benchmark (that is `python -m bench`): the sweeps that chose the
Triton defaults and the measurement of the jax-triton specialization fix (the
same launch timed natively and through jax-triton, CUPTI kernel time, median
of 20). Its logs are research/probes/h200-triton-ladder-2026-11-22-run*.
The problem list at the bottom is edited between runs; run1's is the first
block of its log. Run on the GPU machine: `make gpu-env && python3 research/triton_probe.py` (it was
`bench/triton_probe.py` then; its imports follow the kernels to kernels/triton/matmul/).
"""
import os, sys, json, time, traceback
import numpy as np, jax, jax.numpy as jnp
import jax_triton  # sets TRITON_CACHE_DIR="" at import
import triton
triton.knobs.cache.dir = "/tmp/triton-cache"
import torch
import jaxgemm
from jaxgemm import GemmProblem
from jax.experimental.mosaic.gpu import profiler
ext = profiler.mosaic_gpu_lib._mosaic_gpu_ext
OUT = os.environ.get("OUT", "/tmp")
print("jax", jax.__version__, "triton", triton.__version__, jax.devices()[0].device_kind, flush=True)

def cupti(fn, iters=20):
    r = fn(); jax.block_until_ready(r); torch.cuda.synchronize()
    ext._cupti_init()
    try:
        outs = [fn() for _ in range(iters)]
        jax.block_until_ready(outs); torch.cuda.synchronize()
    finally:
        t = ext._cupti_get_timings(True)
    k = len(t) // iters
    per = [sum(x[1] for x in t[i*k:(i+1)*k]) for i in range(iters)]
    return float(np.median(per)), k

def dn(ta, tb): return (((1 if ta else 2,), (2 if tb else 1,)), ((0,), (0,)))
rows = []
def run(name, m, k, n, dtype, variants, ta=False, tb=False, precision=None, configs=None):
    key = jax.random.split(jax.random.key(hash(name) % 1000), 2)
    a = jax.random.normal(key[0], (1, k, m) if ta else (1, m, k), jnp.float32).astype(dtype)
    b = jax.random.normal(key[1], (1, n, k) if tb else (1, k, n), jnp.float32).astype(dtype)
    flops = 2 * m * n * k
    xla = jax.jit(lambda a, b: jaxgemm.dot_general(a, b, dn(ta, tb), precision=precision, backend="xla"))
    ref = np.asarray(jax.lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dn(ta, tb), precision="highest"), np.float64)
    tx, _ = cupti(lambda: xla(a, b))
    rows.append(dict(problem=name, variant="xla", ms=tx, tflops=flops / tx / 1e9, ratio=1.0))
    print(f"{name:28s} {'xla':24s} {tx:9.4f} ms {flops/tx/1e9:7.1f} TFLOP/s", flush=True)
    for v in variants:
        for label, cfg in (configs or {"": None}).items():
            vname = v + label
            try:
                t0 = time.time()
                f = jax.jit(lambda a, b: jaxgemm.dot_general(a, b, dn(ta, tb), precision=precision, backend="triton", variant=v, config=cfg))
                out = np.asarray(f(a, b), np.float64); ct = time.time() - t0
                err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                t, nk = cupti(lambda: f(a, b))
                rows.append(dict(problem=name, variant=vname, ms=t, tflops=flops / t / 1e9, ratio=tx / t, err=err, kernels=nk, compile_s=ct))
                print(f"{name:28s} {vname:24s} {t:9.4f} ms {flops/t/1e9:7.1f} TFLOP/s {tx/t:5.2f}x xla  err={err:.1e} kernels={nk} compile={ct:.1f}s", flush=True)
            except Exception as e:
                rows.append(dict(problem=name, variant=vname, error=repr(e)[:300]))
                print(f"{name:28s} {vname:24s} ERROR {repr(e)[:400]}", flush=True)

def native_vs_jax(variant, m, k, n, cfg=None, tma=False):
    """A rung's launch, natively through Triton vs through jax-triton, same constexprs."""
    import importlib, dataclasses
    from jaxgemm.ops.matmul.triton import TritonMatmul
    p = GemmProblem(1, m, n, k, np.dtype(jnp.bfloat16), np.dtype(jnp.bfloat16), np.dtype(np.float32), False, False, None)
    cfg = cfg or TritonMatmul().default_config(p, variant)
    if variant == "persistent":
        from jaxgemm.kernels.triton.matmul import persistent
        launch = persistent.launch(p, dataclasses.replace(cfg, tma=tma), "cuda")
    else:
        from jaxgemm.kernels.triton.matmul import tiled
        launch = tiled.blocked_launch(p, cfg, "cuda", upcast=False, dot_precision="tf32")
    at = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16); bt = torch.randn(1, k, n, device="cuda", dtype=torch.bfloat16)
    ct = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
    def native():
        launch.kernel[launch.grid](at, bt, ct, num_warps=launch.num_warps, num_stages=launch.num_stages, **dict(launch.constexprs))
    tn, _ = cupti(native)
    fl = 2 * m * n * k
    err = (ct.float() - at[0].float() @ bt[0].float()).norm() / (at[0].float() @ bt[0].float()).norm()
    if tma:
        print(f"NATIVE-ONLY {variant}+tma {m}x{k}x{n}: native {fl/tn/1e9:.1f} TFLOP/s err={err:.1e}", flush=True)
        rows.append(dict(problem=f"native_{m}", variant=variant + "+tma", native_tflops=fl/tn/1e9))
        return
    a = jax.random.normal(jax.random.key(0), (1, m, k), jnp.bfloat16); b = jax.random.normal(jax.random.key(1), (1, k, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: jaxgemm.dot_general(a, b, dn(False, False), backend="triton", variant=variant, config=cfg))
    tj, _ = cupti(lambda: f(a, b))
    print(f"NATIVE {variant} {m}x{k}x{n}: native {fl/tn/1e9:.1f} TFLOP/s, jax-triton {fl/tj/1e9:.1f} TFLOP/s, jax/native {tn/tj:.3f} err={err:.1e}", flush=True)
    rows.append(dict(problem=f"native_vs_jax_{m}", variant=variant, native_tflops=fl/tn/1e9, jax_tflops=fl/tj/1e9, ratio=tn/tj))

bf = jnp.bfloat16
TC = ["tensorcore", "persistent", "splitk"]
persist_cfgs = {"": None,
    "+sub1": jaxgemm.TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, epilogue_subtile=1),
    "+128x128x64s4": jaxgemm.TritonConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, epilogue_subtile=1),
    "+128x256x64s4w8": jaxgemm.TritonConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4, epilogue_subtile=2),
}
tc_cfgs = {"": None,
    "+128x128x64s4": jaxgemm.TritonConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    "+256x128x64s3": jaxgemm.TritonConfig(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
}
hi_cfgs = {"": None}
for bm, bn, bk, w, st in [(128, 64, 32, 4, 3), (128, 64, 16, 4, 3), (64, 128, 32, 4, 3), (128, 64, 64, 4, 2), (256, 64, 32, 8, 2), (128, 128, 16, 8, 2), (64, 64, 32, 2, 3), (128, 32, 32, 4, 3)]:
    hi_cfgs[f"+{bm}x{bn}x{bk}w{w}s{st}"] = jaxgemm.TritonConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=st, group_m=8)
run("fp32_8192_highest", 8192, 8192, 8192, jnp.float32, ["pipelined"], precision=jax.lax.Precision.HIGHEST, configs=hi_cfgs)
json.dump(rows, open(os.path.join(OUT, "triton_gpu.json"), "w"), indent=1)
