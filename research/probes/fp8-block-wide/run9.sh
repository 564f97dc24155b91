#!/bin/bash
# The whole FP8 GPU tier on the final tree: test_cast_transpose, test_scaled_matmul,
# test_scaled_matmul_triton, test_scaled_matmul_pallas and test_fp8_training, on a clean
# export of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run9.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 420 python3 -m pytest -q -m "gpu or slow" tests/test_cast_transpose.py \
  tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py \
  tests/test_scaled_matmul_pallas.py tests/test_fp8_training.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
