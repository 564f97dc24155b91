#!/bin/bash
# The fp8 suite's block-scale GEMM rows (the layer's dgrad and wgrad too) and the block
# recipe's training step paired with XLA's bf16 step, on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-inplace-f16/run3.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 330 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla --time-budget 320 \
  --only '*.block' --out $R --run-name fp8-gemm > $R/fp8-gemm.log 2>&1
echo "fp8-gemm rc $? at $SECONDS s" >> $R/info.txt
timeout $((585 - SECONDS)) python3 -m bench --suite fp8 --only 'fp8.*' --backends auto \
  --time-budget $((560 - SECONDS)) --variants 'fp8=block' --out $R --run-name fp8-step \
  > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
