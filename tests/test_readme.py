"""The README's quick start runs as written (on the CPU: the kernels in their interpreters)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks(text: str) -> list[str]:
  return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_quick_start_runs_as_written(capsys):
  blocks = _python_blocks(README.read_text())
  assert blocks, "README.md has no ```python block"
  block = next(b for b in blocks if "TritonConfig" in b)
  exec(compile(block, "README.md (quick start)", "exec"), {})  # noqa: S102
  out = capsys.readouterr().out
  assert "'xla'" in out and "'basic'" in out


def test_accelerate_block_runs_as_written(capsys):
  block = next(b for b in _python_blocks(README.read_text()) if "accelerate" in b)
  exec(compile(block, "README.md (accelerate)", "exec"), {})  # noqa: S102
  assert "jaxgemm.dot_general" in capsys.readouterr().out   # explain(): the GEMMs it took


def test_mixture_of_experts_block_runs_as_written(capsys):
  block = next(b for b in _python_blocks(README.read_text()) if "ragged_dot" in b)
  exec(compile(block, "README.md (ragged_dot)", "exec"), {})  # noqa: S102
  assert "'pallas'" in capsys.readouterr().out


def test_fp8_block_runs_as_written():
  block = next(b for b in _python_blocks(README.read_text()) if "scaled_matmul" in b)
  scope = {}
  exec(compile(block, "README.md (fp8)", "exec"), scope)  # noqa: S102
  assert scope["y"].shape == (256, 384) and scope["dw"].shape == (512, 384)
