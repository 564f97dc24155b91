#!/bin/bash
# The suite's 128-row rows on the final code (an H200 asked for), on a clean export of
# $TREE. Usage there: TREE=<commit> bash research/probes/fp8-swap/run4.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 200 python3 -m bench --suite fp8 --backends auto,pallas,triton,xla --time-budget 190 \
  --only 'm128.k4096.n14336.tensor,m128.k4096.n14336.block' --out $R --run-name fp8-gemm \
  > $R/fp8-gemm.log 2>&1
echo "fp8-gemm rc $? at $SECONDS s" >> $R/info.txt
timeout 100 python3 research/probes/fp8-swap/probe3.py > $R/probe3.log 2>&1
echo "probe3 rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
