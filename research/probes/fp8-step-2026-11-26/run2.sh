#!/bin/bash
# Second call of 2026-11-26 (session b), nvidia-h200-x2, one tar back:
#   GPU 0: the FP8 GPU tier alone (B_SCALE_BOX fixed), then the Pallas probe (per-tensor
#          steps per promotion, TMA scales) on the two 8192-row problems;
#   GPU 1: the FP8 step (8 x 1024 tokens, flash attention): its kernel profile, then the
#          bench's step (auto).
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE"; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }
(CUDA_VISIBLE_DEVICES=0 timeout 220 python3 -m pytest -v --tb=short -p no:cacheprovider -m "gpu or slow" \
   tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py \
   tests/test_fp8_training.py > $R/fp8-gpu-tier.log 2>&1; stamp fp8-tier $?
 CUDA_VISIBLE_DEVICES=0 PROBE_BACKENDS=pallas PROBE_DEADLINE_S=270 PROBE_DEFAULT_ONLY=1 PROBE_PROBLEMS=8192x8192x8192,8192x4096x14336 timeout 300 \
   python3 research/probes/fp8-2026-11-25/probe.py > $R/probe.log 2>&1; stamp probe $?) &
(CUDA_VISIBLE_DEVICES=1 timeout 250 python3 research/probes/fp8-step-2026-11-26/step_profile.py \
   --runs auto:tensor,auto:block > $R/step-profile.log 2>&1; stamp profile $?
 CUDA_VISIBLE_DEVICES=1 timeout 260 python3 -m bench --suite fp8 --only 'fp8.*' \
   --backends auto --time-budget 230 --out $R --run-name h200-fp8-step > $R/fp8-step.log 2>&1
 stamp fp8-step $?) &
wait
tar czf "$OUT/results.tgz" -C $R .
cp $I "$OUT/info.txt"
