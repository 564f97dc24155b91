#!/bin/bash
# The suite's 128-row rows and the whole FP8 GPU tier on the final code, on a clean export
# of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-swap/run6.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 150 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla --time-budget 140 \
  --only 'm128.k4096.n14336.tensor,m128.k4096.n14336.block' --out $R --run-name fp8-gemm \
  > $R/fp8-gemm.log 2>&1
echo "fp8-gemm rc $? at $SECONDS s" >> $R/info.txt
timeout $((580 - SECONDS)) python3 -m pytest -q -m "gpu or slow" tests/test_cast_transpose.py \
  tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py \
  tests/test_fp8_training.py tests/test_triton_ptx.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
