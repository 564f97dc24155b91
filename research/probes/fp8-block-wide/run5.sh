#!/bin/bash
# After the quantizer took its warps by mode (8 for the block modes but x's): the block
# step's CUPTI kernel sums (step_probe.py), the bench's block step paired with XLA's bf16
# step, and the quantizer's and FP8 training path's GPU tier, on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run5.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 120 python3 research/probes/fp8-fused-quant/step_probe.py --runs block \
  > $R/step_probe.log 2>&1
echo "step_probe rc $? at $SECONDS s" >> $R/info.txt
timeout 220 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 180 \
  --variants 'fp8=block' --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
timeout $((560 - SECONDS)) python3 -m pytest -q -m "gpu or slow" tests/test_cast_transpose.py \
  tests/test_fp8_training.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
