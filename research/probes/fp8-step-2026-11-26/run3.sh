#!/bin/bash
# Third call of 2026-11-26 (session b), nvidia-h200-x2, one tar back:
#   GPU 0: the FP8 GPU tier (tolerance from run2's measurements, TMA scales the block
#          default), then the bench's FP8 step (auto; lr 3e-4);
#   GPU 1: the fp8 suite's GEMMs on every backend, for docs/results-fp8.md.
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE"; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }
(CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m pytest -v --tb=short -p no:cacheprovider -m "gpu or slow" \
   tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py \
   tests/test_fp8_training.py > $R/fp8-gpu-tier.log 2>&1; stamp fp8-tier $?
 CUDA_VISIBLE_DEVICES=0 timeout $((550 - SECONDS)) python3 -m bench --suite fp8 --only 'fp8.*' \
   --backends auto --time-budget 200 --out $R --run-name h200-fp8-step > $R/fp8-step.log 2>&1
 stamp fp8-step $?) &
(CUDA_VISIBLE_DEVICES=1 timeout 540 python3 -m bench --suite fp8 --only '*.tensor,*.block' \
   --time-budget 500 --out $R --run-name h200-fp8 > $R/fp8-gemms.log 2>&1; stamp fp8-gemms $?) &
wait
tar czf "$OUT/results.tgz" -C $R .
cp $I "$OUT/info.txt"
