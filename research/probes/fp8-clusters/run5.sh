#!/bin/bash
# run2's GEMM rows and run4's step at once on a 2-GPU machine (one job per GPU, CUPTI times
# are per device), asked as nvidia-h200-x2 for the card. A clean export of $TREE
# travels as .clean/tree.tar (`git archive $TREE > .clean/tree.tar`).
# Usage there: TREE=<commit> bash research/probes/fp8-clusters/run5.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
CUDA_VISIBLE_DEVICES=1 timeout 500 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla \
  --time-budget 440 --only '*.tensor,*.block' --out $R --run-name fp8-gemm > $R/fp8-gemm.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto \
  --time-budget 280 --variants 'fp8=tensor,fp8=block' --out $R --run-name fp8-step \
  > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
wait
echo "fp8-gemm done at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
