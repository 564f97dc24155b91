#!/bin/bash
# Prepared 2026-11-26 and superseded: its FP8 parts ran in research/probes/fp8-step-2026-11-26
# (run1-run3); the sharded re-time with PipelinedWallTimer did not run. Was: what that session's device time did not
# reach, for one nvidia-h200-x4 call of <= 600 s that returns one tar (the device tool
# returns at most 8 files).
#   1. the FP8 GPU tier alone on GPU 0 (run1's crashed beside three other jobs);
#   2. the sharded suite on all four GPUs, timed with PipelinedWallTimer;
#   3. side by side: GPU 0 the FP8 training step (issue 28's target: >= 1.25x, loss within
#      2%), GPU 1 the block-scaled dgrad/wgrad rows.
# Usage there: bash research/probes/h200x4-2026-11-26/run3.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; git rev-parse HEAD; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }

CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" \
  tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py \
  tests/test_fp8_training.py > $R/fp8-gpu-tier.log 2>&1; stamp fp8-tier $?
timeout 170 python3 -m bench --suite sharded --backends auto,triton,pallas --time-budget 130 \
  --out $R --run-name h200x4-sharded-next > $R/sharded.log 2>&1; stamp sharded $?
(CUDA_VISIBLE_DEVICES=0 timeout 230 python3 -m bench --suite fp8 --only 'fp8.*' \
   --backends auto,triton,pallas --time-budget 200 --out $R --run-name h200-fp8-step-next \
   > $R/fp8-step.log 2>&1; stamp fp8-step $?) &
(CUDA_VISIBLE_DEVICES=1 timeout 230 python3 -m bench --suite fp8 --only '*grad.block' \
   --time-budget 200 --out $R --run-name h200-fp8-block-backward-next > $R/fp8-block.log 2>&1
 stamp fp8-block $?) &
wait
tar czf "$OUT/results.tgz" -C $R .
cp $I "$OUT/info.txt"
