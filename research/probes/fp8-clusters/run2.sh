#!/bin/bash
# The fp8 suite's GEMM rows on the new defaults (128x192 per tensor, clusters for large
# block problems), every backend against XLA in the same run; then the Pallas FP8 GPU tier.
# Usage there: TREE=<commit> bash research/probes/fp8-clusters/run2.sh
set -u
R=/tmp/res; mkdir -p $R
{ nvidia-smi -L; echo "tree: $TREE"; git log -1 --oneline; git checkout -q $TREE -- . && echo "checked out $TREE"; git status --short | head; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 400 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla --time-budget 360 \
  --only 'sq8192.*,m8192.k4096.n14336.tensor,m8192.k4096.n14336.block,sq4096.*,m128.*' \
  --out $R --run-name fp8-gemm > $R/fp8-gemm.log 2>&1
echo "fp8-gemm rc $? at $SECONDS s" >> $R/info.txt
timeout $((570 - SECONDS)) python3 -m pytest -q -m "gpu or slow" tests/test_scaled_matmul_pallas.py \
  > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
