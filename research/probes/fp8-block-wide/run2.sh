#!/bin/bash
# The new block-scale defaults (128x192, clusters along M) in the project's benchmark, on two
# GPUs at once (CUPTI times are per device): the fp8 suite's 12 GEMM rows on GPU 1; the named
# recipes' step, then the FP8 GPU tier, on GPU 0. A clean export of $TREE travels as
# .clean/tree.tar. Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run2.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
CUDA_VISIBLE_DEVICES=1 timeout 520 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla \
  --time-budget 460 --only '*.tensor,*.block' --out $R --run-name fp8-gemm > $R/fp8-gemm.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto \
  --time-budget 260 --variants 'fp8=tensor,fp8=block' --out $R --run-name fp8-step \
  > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
CUDA_VISIBLE_DEVICES=0 timeout $((540 - SECONDS)) python3 -m pytest -q -m "gpu or slow" \
  tests/test_scaled_matmul_pallas.py tests/test_fp8_training.py tests/test_scaled_matmul.py \
  > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
wait
echo "fp8-gemm done at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
