"""GPU probe: the swapped default's tile rule (`_SWAPPED_TILE` where 128-column tiles give
3/4 of the SMs a program, `_SWAPPED_NARROW_TILE` otherwise) on the shapes that decide it,
against the other tile and the unswapped f16 kernel; probe2's harness (XLA's scaled form
paired, float64 check)."""
import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe2 import F16_TILE, backend, case, ours, row  # noqa: E402

for m, k, n, kind in ((16, 8192, 8192, "tensor"), (128, 14336, 4096, "tensor"),
                      (64, 8192, 8192, "tensor"), (128, 4096, 14336, "tensor"),
                      (256, 4096, 14336, "row_col")):
  args, exact, xla, problem = case(m, k, n, kind)
  flops = 2 * m * k * n
  label = f"{m}x{k}x{n} {kind}"
  default = backend.default_config(problem, "blocked")
  row(f"{label} default {default.block_m}x{default.block_n} w{default.num_warps} "
      f"swap={default.swap_ab}", ours(default), args, exact, xla, flops)
  wide = default.block_n == 64
  other = dataclasses.replace(default, block_n=128 if wide else 64,
                              num_warps=8 if wide else 4)
  row(f"{label} swap {other.block_m}x{other.block_n} w{other.num_warps}", ours(other), args,
      exact, xla, flops)
  f16 = dataclasses.replace(F16_TILE, block_m=min(128, max(16, 1 << (m - 1).bit_length())))
  row(f"{label} unswapped f16 in place {f16.block_m}x64 w4 s3", ours(f16), args, exact, xla,
      flops)
