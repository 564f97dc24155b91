#!/bin/bash
# The FP8 GPU tier of the quantizer and the training path after cast_transpose_p lost its
# placeholder operand, on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-swap/run7.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 120 python3 research/probes/fp8-swap/quantizer_gpu.py > $R/quantizer_gpu.log 2>&1
echo "quantizer_gpu rc $? at $SECONDS s" >> $R/info.txt
timeout 400 python3 -m pytest -q -m "gpu or slow" tests/test_cast_transpose.py \
  tests/test_fp8_training.py tests/test_sharding_gpu.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
