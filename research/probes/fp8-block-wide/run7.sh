#!/bin/bash
# The final block-scale code (scales read under the wgmma, quantizer warps by mode) in the
# project's benchmark on one GPU: the fp8 suite's block rows (the layer's dgrad and wgrad
# too), the block step paired with XLA's bf16 step, then the Pallas FP8 GPU tier, on a clean
# export of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run7.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 300 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla --time-budget 270 \
  --only '*.block' --out $R --run-name fp8-gemm > $R/fp8-gemm.log 2>&1
echo "fp8-gemm rc $? at $SECONDS s" >> $R/info.txt
timeout 120 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 100 \
  --variants 'fp8=block' --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
timeout $((570 - SECONDS)) python3 -m pytest -q -m "gpu or slow" \
  tests/test_scaled_matmul_pallas.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
