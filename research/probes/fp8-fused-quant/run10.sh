#!/bin/bash
# Ran on an H100 (asked for nvidia-h200) at 28e8d61, results in run10/: the bench's FP8 step
# for every recipe `auto` trains on a GPU (the named "tensor" and "block", and the opt-in
# bench.training.FP8_OPTIONS: power-of-two scales, the Triton quantizer), each timed
# paired with XLA's bf16 step and checked for agreement (run9 found the power-of-two
# "tensor" recipe at the trajectory gate's bound on an H100), then the FP8 GPU tier.
# The named "block" recipe runs again: its program changed (K-major operands from quantize_pair).
# Usage there: TREE=<commit> bash research/probes/fp8-fused-quant/run10.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE"; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }
# An FP8 row compiles in ~15 s on an H200 (its shipped table) and ~140 s on an H100 (tuned
# on the spot: run9), so the budget takes the rows that matter most first; the autotune
# cache comes back too (an H100's records). No row starts after 300 s: two on an H100.
export JAXGEMM_AUTOTUNE_CACHE=$R/autotune.json
timeout 470 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 300 \
  --variants 'fp8=tensor+pow2+triton-quantize,fp8=block+triton-quantize,fp8=block,fp8=tensor+pow2' \
  --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
stamp fp8-step $?
timeout $((590 - SECONDS)) python3 -m pytest -q --tb=short -p no:cacheprovider -m "gpu or slow" \
  tests/test_cast_transpose.py tests/test_scaled_matmul.py tests/test_fp8_training.py \
  > $R/fp8-gpu-tier.log 2>&1
stamp fp8-tier $?
tar czf "$OUT/results.tgz" -C $R .
