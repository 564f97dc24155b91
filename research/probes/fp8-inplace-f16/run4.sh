#!/bin/bash
# The per-tensor recipe's training step paired with XLA's bf16 step, then the FP8 GPU tier
# (test_cast_transpose, test_scaled_matmul, test_scaled_matmul_triton,
# test_scaled_matmul_pallas, test_fp8_training, test_triton_ptx), on a clean export of
# $TREE. Usage there: TREE=<commit> bash research/probes/fp8-inplace-f16/run4.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 250 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 230 \
  --variants 'fp8=tensor' --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
timeout $((585 - SECONDS)) python3 -m pytest -q -m "gpu or slow" tests/test_cast_transpose.py \
  tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py \
  tests/test_scaled_matmul_pallas.py tests/test_fp8_training.py tests/test_triton_ptx.py \
  > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
