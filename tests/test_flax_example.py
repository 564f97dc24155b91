"""The README's flax `nnx` example runs as written, and computes what it says.

The README's block (the one that imports flax) is executed as it stands, on the
CPU (backend "auto": XLA there; small shapes), so that it cannot rot; then its
layers are checked against the jnp expressions they stand for, forward and
through `nnx.grad`.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")

README = Path(__file__).resolve().parent.parent / "README.md"


def _flax_block() -> str:
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
  found = [b for b in blocks if "from flax import nnx" in b]
  assert len(found) == 1, "README.md should have one ```python block importing flax.nnx"
  return found[0]


@pytest.fixture(scope="module")
def example():
  ns: dict = {}
  exec(compile(_flax_block(), "README.md (flax nnx)", "exec"), ns)  # noqa: S102
  return ns


def _swiglu(m, x):
  """The README's SwiGLU in jnp: x + down(silu(x @ w_gate) * (x @ w_up))."""
  h = jax.nn.silu(x @ m.w_gate[...]) * (x @ m.w_up[...])
  return x + h @ m.down.w[...] + m.down.b[...]


def test_the_layers_compute_their_jnp_expressions(example):
  x, mlp, up, y = example["x"], example["mlp"], example["up"], example["y"]
  assert isinstance(mlp, nnx.Module) and y.shape == x.shape
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(y, _swiglu(mlp, x), rtol=1e-4, atol=1e-4)
    got = up(x)
    want = jax.nn.gelu(x @ up.w[...] + up.b[...], approximate=True)
  assert got.shape == (*x.shape[:-1], 256)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # a layer with neither activation nor residual is the plain affine map
  lin = example["Linear"](64, 8, rngs=nnx.Rngs(3))
  np.testing.assert_allclose(lin(x), x @ lin.w[...] + lin.b[...], rtol=1e-4, atol=1e-4)


def test_nnx_grad_through_the_fused_layers(example):
  x, mlp, grads = example["x"], example["mlp"], example["grads"]
  want = nnx.grad(lambda m: jnp.mean(_swiglu(m, x) ** 2))(mlp)
  got_leaves, want_leaves = jax.tree.leaves(grads), jax.tree.leaves(want)
  assert len(got_leaves) == len(want_leaves) == 4          # w_gate, w_up, down.w, down.b
  for g, w in zip(got_leaves, want_leaves):
    assert g.shape == w.shape and float(jnp.abs(w).max()) > 0
    np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
  # an optimizer step (optax, which flax brings) through the fused layers lowers the loss
  optax = pytest.importorskip("optax")
  model = nnx.clone(mlp)
  loss = lambda m: jnp.mean(m(x) ** 2)                     # noqa: E731
  before = float(loss(model))
  opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  opt.update(model, nnx.grad(loss)(model))
  assert float(loss(model)) < before
