"""The `models` suite (issue 47): training steps of models written the ordinary way, as XLA's
program and with `jaxgemm.accelerate(loss)` inside its gradient.

    python -m bench --suite models                          # every model, bf16 and fp8
    python -m bench --suite models --only 'models.llama*'   # the dense model alone

The models call no jaxgemm function. Their GEMMs are `x @ w` for the projections,
`jnp.einsum` for the attention's and `lax.ragged_dot` for the experts. Attention is
`jax.nn.dot_product_attention` (cuDNN's flash attention on a GPU), with RMSNorm and SwiGLU,
and the loss is the cross-entropy of the next token in float32. The parameters are float32,
each GEMM runs in bf16 (the weights cast at use, as flax's `param_dtype` does), and the
optimizer is Adam (bench/training.py's).

- **dense** (`llama*`): a Llama-3-8B-like decoder with 2 layers at full width (d_model 4096,
  32 query and 8 key/value heads, SwiGLU 14336), vocabulary 32768 (`VOCAB` says why).
- **moe** (`qwen*`): a Qwen3-30B-A3B-like decoder with 2 layers (d_model 2048, 32 query and 4
  key/value heads of 128; 128 experts of SwiGLU width 768, top-8, softmax router),
  vocabulary 32768. The token copies are sorted by expert for `lax.ragged_dot`.

With 2 or more devices, the dense model also runs data x tensor parallel over all of them
(`dp<n>xtp2`: Megatron's layout on a ("data", "model") mesh, `PARAM_SPECS`; the batch
per data replica kept), both programs partitioned by XLA from the parameters' and the
batch's shardings (`make gpu-bench BENCH_ARGS="--suite models"` on a 2-GPU machine).

Each model runs two rows: XLA's step (`jax.jit(step)`, the `xla_dot` row) and the same step
with its loss accelerated, `jax.value_and_grad(jaxgemm.accelerate(loss))` (backend `auto`;
`programs` says why the loss and not the step). With `fp8`, a third row runs
`accelerate(loss, fp8="block")`. Every row trains from the same initialisation on the
same batches (bench/training.py's `batches`: a learnable token permutation with label
noise). The report gives:

- the step time (time_paired against XLA's step, device time on a GPU) and tokens per
  second;
- the memory XLA plans per device (`compiled.memory_analysis()`);
- the loss of every step, with the last step's relative difference from XLA's.
  bf16 rows must agree within bench/training.py's TRAJECTORY_TOL. The FP8 row's
  difference is reported, not gated (the issue's target: within 1% at step 50).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxgemm
from jaxgemm.timing import summarize, time_paired

from . import training as T
from .runner import (REF, REF_VARIANT, STATUS_ERROR, STATUS_FAIL, STATUS_OK, Context,
                     SuiteOptions, base_row, short_error)
from .sharded import PipelinedWallTimer

SUITE = "models"
ACCELERATE = "accelerate"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A decoder: `n_layers` blocks of attention and a SwiGLU MLP (dense, or `n_experts`
  experts with top-`top_k` routing)."""

  name: str
  what: str
  d_model: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  n_layers: int
  vocab: int
  batch: int
  seq: int
  n_experts: int = 0
  top_k: int = 0
  steps: int = 50
  lr: float = 3e-4
  fp8: bool = True          # also run accelerate(loss, fp8="block")
  # (data, model) mesh: the batch split on "data", Megatron's tensor parallelism on
  # "model" (`PARAM_SPECS`); None: one device.
  mesh_shape: tuple[int, int] | None = None

  @property
  def moe(self) -> bool:
    return self.n_experts > 0

  @property
  def tokens(self) -> int:
    return self.batch * self.seq

  @property
  def flops(self) -> int:
    """GEMM FLOPs of one step (forward and two backward GEMMs each), attention's included."""
    d, hd = self.d_model, self.head_dim
    attn = 2 * d * hd * (self.n_heads * 2 + self.n_kv_heads * 2)   # q, o, k, v
    mlp = 3 * 2 * d * self.d_ff * (self.top_k if self.moe else 1)
    router = 2 * d * self.n_experts
    scores = 2 * 2 * self.seq * self.n_heads * hd                    # QK^T and PV, per token
    per_token = self.n_layers * (attn + mlp + router + scores) + 2 * d * self.vocab
    return 3 * self.tokens * per_token


# Not Llama-3's 128256 or Qwen3's 151936: timing a step holds its parameters and Adam
# state twice (its inputs and its outputs), and at 128256 the dense model's are 18 GB
# each. The layers are at full width.
VOCAB = 32768

SPECS = {
    "gpu": [
        ModelSpec("models.llama3-8b-like.L2", "Llama-3-8B-like, 2 layers at full width",
                  4096, 32, 8, 128, 14336, 2, VOCAB, batch=2, seq=4096),
        # 2048 tokens, so 16384 routed rows (the G=128 M=16384 K=2048 N=768): at
        # 65536 XLA's program does not fit an 80 GB H100 (its ragged_dot lowers to
        # per-expert dense products; 2026-11-28, H100, 239c07b).
        ModelSpec("models.qwen3-30b-a3b-like.L2", "Qwen3-30B-A3B-like MoE, 2 layers",
                  2048, 32, 4, 128, 768, 2, VOCAB, batch=1, seq=2048, n_experts=128,
                  top_k=8),
    ],
    # Tiny, for the CPU (the test and `--quick`): the same code paths.
    "cpu": [
        ModelSpec("models.llama3-8b-like.L2", "Llama-like (tiny)", 64, 4, 2, 16, 128, 2, 256,
                  batch=2, seq=16, steps=3, lr=1e-2, fp8=False),
        ModelSpec("models.qwen3-30b-a3b-like.L2", "Qwen3-MoE-like (tiny)", 64, 4, 2, 16, 32,
                  2, 256, batch=2, seq=16, n_experts=8, top_k=2, steps=3, lr=1e-2, fp8=False),
    ],
}


# ---------------------------------------------------------------- the models, ordinary JAX


def init_params(spec: ModelSpec, seed: int) -> dict:
  """float32 parameters, normal(0, 1/sqrt(fan_in)); norms' scales at 1."""
  keys = iter(jax.random.split(jax.random.key(seed), 8 + 8 * spec.n_layers))
  d, hd = spec.d_model, spec.head_dim
  normal = lambda shape, fan_in: (jax.random.normal(next(keys), shape, jnp.float32)
                                  / math.sqrt(fan_in))
  layers = []
  for _ in range(spec.n_layers):
    layer = {"attn_norm": jnp.ones((d,)), "mlp_norm": jnp.ones((d,)),
             "wq": normal((d, spec.n_heads, hd), d), "wk": normal((d, spec.n_kv_heads, hd), d),
             "wv": normal((d, spec.n_kv_heads, hd), d),
             "wo": normal((spec.n_heads, hd, d), spec.n_heads * hd)}
    if spec.moe:
      e, f = spec.n_experts, spec.d_ff
      layer |= {"router": normal((d, e), d), "w_gate": normal((e, d, f), d),
                "w_up": normal((e, d, f), d), "w_down": normal((e, f, d), f)}
    else:
      layer |= {"w_gate": normal((d, spec.d_ff), d), "w_up": normal((d, spec.d_ff), d),
                "w_down": normal((spec.d_ff, d), spec.d_ff)}
    layers.append(layer)
  return {"embed": 0.02 * normal((spec.vocab, d), 1.0),
          "layers": layers, "final_norm": jnp.ones((d,)),
          "head": normal((d, spec.vocab), d)}


# Megatron's tensor-parallel layout on the mesh's "model" axis: attention heads and the
# MLP's hidden columns split, the projections back to d_model split on their rows, the
# logits on the vocabulary; the norms and the embedding table replicated. The moments of
# Adam follow their parameters; the batch splits on "data".
PARAM_SPECS = {"wq": P(None, "model", None), "wk": P(None, "model", None),
               "wv": P(None, "model", None), "wo": P("model", None, None),
               "w_gate": P(None, "model"), "w_up": P(None, "model"), "w_down": P("model", None),
               "head": P(None, "model")}
BATCH_SPEC = P("data", None)


def data_tensor_parallel(spec: ModelSpec, devices: int) -> ModelSpec:
  """The dense `spec` on `devices` devices: tensor parallel over 2, data parallel over the
  rest, the batch per data replica kept (so tokens per step grow with it)."""
  data = devices // 2
  return dataclasses.replace(spec, name=f"{spec.name}.dp{data}xtp2",
                             what=f"{spec.what}, data {data} x tensor 2 on {devices} devices",
                             batch=spec.batch * data, mesh_shape=(data, 2))


def shardings(tree, mesh):
  """NamedShardings of a pytree of parameters (or Adam's state of them) on `mesh`: each leaf
  by its parameter's name in PARAM_SPECS, else replicated."""
  def one(path, leaf):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    spec = next((PARAM_SPECS[n] for n in reversed(names) if n in PARAM_SPECS), P())
    return NamedSharding(mesh, spec if len(spec) <= jnp.ndim(leaf) else P())
  return jax.tree_util.tree_map_with_path(one, tree)


def rmsnorm(x, scale):
  x32 = x.astype(jnp.float32)
  x32 = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
  return (x32 * scale).astype(x.dtype)


def attention(x, p, dtype):
  q = jnp.einsum("bsd,dhk->bshk", x, p["wq"].astype(dtype))
  k = jnp.einsum("bsd,dhk->bshk", x, p["wk"].astype(dtype))
  v = jnp.einsum("bsd,dhk->bshk", x, p["wv"].astype(dtype))
  out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
  return jnp.einsum("bshk,hkd->bsd", out, p["wo"].astype(dtype))


def dense_mlp(x, p, dtype):
  gate, up = x @ p["w_gate"].astype(dtype), x @ p["w_up"].astype(dtype)
  return (jax.nn.silu(gate) * up) @ p["w_down"].astype(dtype)


def moe_mlp(x, p, spec: ModelSpec, dtype):
  """Top-k routing, the token copies sorted by expert, three grouped GEMMs, combined."""
  b, s, d = x.shape
  tokens = x.reshape(b * s, d)
  probs = jax.nn.softmax(tokens.astype(jnp.float32) @ p["router"], axis=-1)
  weights, experts = lax.top_k(probs, spec.top_k)
  weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  order = jnp.argsort(experts.reshape(-1))
  token_of = order // spec.top_k
  sizes = jnp.bincount(experts.reshape(-1), length=spec.n_experts).astype(jnp.int32)
  copies = tokens[token_of]
  gate = lax.ragged_dot(copies, p["w_gate"].astype(dtype), sizes)
  up = lax.ragged_dot(copies, p["w_up"].astype(dtype), sizes)
  out = lax.ragged_dot(jax.nn.silu(gate) * up, p["w_down"].astype(dtype), sizes)
  out = out.astype(jnp.float32) * weights.reshape(-1)[order][:, None]
  combined = jnp.zeros((b * s, d), jnp.float32).at[token_of].add(out)
  return combined.astype(dtype).reshape(b, s, d)


def forward_loss(params, tokens, targets, spec: ModelSpec, dtype=jnp.bfloat16):
  h = params["embed"].astype(dtype)[tokens]
  for p in params["layers"]:
    h = h + attention(rmsnorm(h, p["attn_norm"]), p, dtype)
    x = rmsnorm(h, p["mlp_norm"])
    h = h + (moe_mlp(x, p, spec, dtype) if spec.moe else dense_mlp(x, p, dtype))
  logits = (rmsnorm(h, params["final_norm"]) @ params["head"].astype(dtype)).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def make_step(spec: ModelSpec, loss_fn: Callable = forward_loss) -> Callable:
  """(params, opt, tokens, targets) -> (params, opt, loss): one Adam step, plain JAX, of
  `loss_fn` (forward_loss, or it accelerated)."""
  def step(params, opt, tokens, targets):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, spec)
    params, opt = T.adam_update(params, grads, opt, spec.lr)
    return params, opt, loss
  return step


# ---------------------------------------------------------------- the rows


def programs(spec: ModelSpec) -> list[tuple[str, str, Callable]]:
  """(backend, variant, step) of each row: XLA's, accelerate's, and its FP8 where asked.

  accelerate wraps the loss, inside the step's `jax.value_and_grad`, as its docstring
  advises: the gradient then runs through jaxgemm's own VJPs, the fused epilogues (the
  SwiGLU's gate as one `jaxgemm.glu`) keep their pre-activations to themselves, and with
  fp8 the backward GEMMs run in FP8 too. accelerate(step) would see the differentiated
  program, where the backward reads every pre-activation (nothing fuses) and the backward
  GEMMs are not of the FP8 path's form."""
  out = [(REF, REF_VARIANT, make_step(spec)),
         (ACCELERATE, "auto", make_step(spec, jaxgemm.accelerate(forward_loss)))]
  if spec.fp8:
    out.append((ACCELERATE, "fp8=block",
                make_step(spec, jaxgemm.accelerate(forward_loss, fp8="block"))))
  return out


def _train(step_fn: Callable, state, data, placement) -> list[float]:
  """`step_fn` compiled with the state donated: one copy of the parameters and Adam's
  moments on the device, not two (the MoE model's are 17 GB in float32)."""
  params, opt = jax.device_put(state, placement)
  train = jax.jit(step_fn, donate_argnums=(0, 1))
  losses = []
  for tokens, targets in data:
    params, opt, loss = train(params, opt, tokens, targets)
    losses.append(float(loss))
  return losses


def run_model(ctx: Context, spec: ModelSpec) -> list[dict]:
  """One model's rows: each program compiled, trained `spec.steps` steps from the same
  parameters on the same batches, and timed interleaved with XLA's step.

  The initial state waits on the host (`state`): on the device a row holds only its own
  copy, so that XLA's program, whose ragged_dot takes per-expert dense temporaries, has the
  memory a user's step would have."""
  cfg = T.ModelConfig(batch=spec.batch, seq=spec.seq, d_model=spec.d_model,
                      n_heads=spec.n_heads, d_ff=spec.d_ff, n_layers=spec.n_layers,
                      vocab=spec.vocab, steps=spec.steps)
  params = init_params(spec, ctx.seed)
  state = jax.device_get((params, T.adam_init(params)))
  del params
  if spec.mesh_shape is None:
    placement, data_placement = None, None
  else:
    # Auto axes: the model is written without shardings in its types (as ordinary code
    # is), and the partitioner places what the parameters' and the batch's imply.
    mesh = jax.make_mesh(spec.mesh_shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    placement, data_placement = shardings(state, mesh), NamedSharding(mesh, BATCH_SPEC)
  data = [jax.device_put(batch, data_placement) for batch in T.batches(cfg, ctx.seed)]
  abstract = lambda x, where=None: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where)
  shapes = (jax.tree.map(abstract, (*state, *data[0])) if placement is None else
            jax.tree.map(abstract, (*state, *data[0]), (*placement, *(data_placement,) * 2)))
  # Over several devices, the wall clock of back-to-back steps (the sharded suite's
  # reasons: no one kernel time, the collectives inside the step).
  timer = ctx.timer if spec.mesh_shape is None else PipelinedWallTimer()
  rows, compiled, losses = [], {}, {}
  for backend, variant, step in programs(spec):
    row = base_row(ctx, SUITE, "model_step", backend, variant)
    row.update(problem=spec.name, problem_note=spec.what, flops=spec.flops,
               tokens_per_step=spec.tokens, steps=spec.steps, timer=timer.label)
    try:
      t0 = time.perf_counter()
      compiled[variant] = jax.jit(step).lower(*shapes).compile()
      row["compile_s"] = time.perf_counter() - t0
      memory = compiled[variant].memory_analysis()
      if memory is not None:
        row["mem_per_device_gb"] = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                                    + memory.temp_size_in_bytes
                                    - memory.alias_size_in_bytes) / 1e9
      losses[variant] = _train(step, state, data, placement)
      row.update(status=STATUS_OK, loss_first=losses[variant][0],
                 loss_last=losses[variant][-1],
                 note="losses " + " ".join(f"{v:.4g}" for v in losses[variant]))
    except Exception as e:  # noqa: BLE001 (one program's failure is a row, not the end)
      row.update(status=STATUS_ERROR, error=short_error(e))
    rows.append(row)
  ref = rows[0]
  ref_ran = ref["status"] == STATUS_OK
  ref_times = []
  tol = T.TRAJECTORY_TOL[ctx.dtype_name]
  for row in rows[1:]:
    if row["status"] != STATUS_OK:
      continue
    if not ref_ran:   # XLA's step did not run (e.g. out of memory): this row's time alone
      args = (*jax.device_put(state, placement), *data[0])
      row.update(_time_fields(summarize(timer.time(compiled[row["variant"]], args,
                                                       ctx.iters)), spec),
                 note=f"XLA's step did not run ({ref.get('error', '')}); " + row["note"])
      del args
      continue
    mine, theirs = losses[row["variant"]], losses[REF_VARIANT]
    rel = [abs(a - b) / abs(b) for a, b in zip(mine, theirs)]
    row.update(loss_max_rel_diff=max(rel), loss_last_rel_diff=rel[-1])
    if "fp8" not in row["variant"] and not max(rel) <= tol:
      row.update(status=STATUS_FAIL, error=f"loss differs from XLA's by {max(rel):.3e} > "
                                           f"{tol:g} (relative)")
      continue
    args = (*jax.device_put(state, placement), *data[0])
    k_times, x_times = time_paired(timer, compiled[row["variant"]],
                                   compiled[REF_VARIANT], args, ctx.iters, chunk=1)
    del args
    ref_times += x_times
    row.update(_time_fields(summarize(k_times), spec, summarize(x_times)))
  if ref_times:
    ref.update(_time_fields(summarize(ref_times), spec))
  for row in rows:
    ctx.log(f"  {row['backend']:>10} {row['variant']:>10}: {_describe(row)}")
    ctx.emit(row)
    for i, loss in enumerate(losses.get(row["variant"], [])):
      ctx.emit({**base_row(ctx, SUITE, "train_loss", row["backend"], row["variant"]),
                "problem": spec.name, "step": i, "loss": loss})
  return rows


def _time_fields(ks: dict, spec: ModelSpec, xs: dict | None = None) -> dict:
  ms = ks["median_ms"]
  out = dict(iters=ks["n"], time_ms_median=ms, time_ms_p10=ks["p10_ms"],
             time_ms_p90=ks["p90_ms"], step_wall_ms=ms, tokens_per_s=spec.tokens / (ms * 1e-3),
             tflops=spec.flops / (ms * 1e-3) / 1e12)
  if xs is not None:
    out.update(xla_time_ms=xs["median_ms"], speedup_vs_xla=xs["median_ms"] / ms)
  return out


def _describe(row: dict) -> str:
  if row["status"] != STATUS_OK:
    return f"{row['status']}: {row.get('error', '')}"
  parts = [f"loss {row['loss_first']:.4f} -> {row['loss_last']:.4f}"]
  if row.get("time_ms_median"):
    parts.append(f"{row['time_ms_median']:.2f} ms/step")
  if row.get("speedup_vs_xla"):
    parts.append(f"{row['speedup_vs_xla']:.3f}x XLA")
  if row.get("loss_last_rel_diff") is not None:
    parts.append(f"last loss {row['loss_last_rel_diff']:.2e} from XLA's")
  return ", ".join(parts)


def run_suite(ctx: Context, suite: str, probs, backends: list[str], variants_policy,
              options: SuiteOptions) -> list[dict]:
  """Every model of SPECS (the GPU's sizes on a GPU, the tiny ones elsewhere or with
  --quick) that --only lets run, and with 2 or more devices the dense ones also data x
  tensor parallel over all of them (`data_tensor_parallel`); --training-steps overrides
  the steps."""
  size = "gpu" if ctx.on_gpu and not options.quick else "cpu"
  devices = jax.device_count()
  specs = list(SPECS[size])
  if devices >= 2:
    specs += [data_tensor_parallel(spec, devices) for spec in SPECS[size] if not spec.moe]
  rows = []
  for spec in specs:
    if not options.runs(spec.name):
      continue
    if options.training_steps:
      spec = dataclasses.replace(spec, steps=options.training_steps)
    ctx.log(f"[{spec.name}] {spec.what}: {spec.tokens} tokens a step, {spec.steps} steps")
    rows += run_model(ctx, spec)
  return rows
