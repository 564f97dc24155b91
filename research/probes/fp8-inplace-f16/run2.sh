#!/bin/bash
# probe2.py (the in-place f16 path's variants) and the fp8 suite's per-tensor GEMM rows on
# the new defaults (f16 in place up to 128 rows, Triton's fp8 transpose in the relayouts), on
# a clean export of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-inplace-f16/run2.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 170 python3 research/probes/fp8-inplace-f16/probe2.py > $R/probe2.log 2>&1
echo "probe2 rc $? at $SECONDS s" >> $R/info.txt
timeout $((575 - SECONDS)) python3 -m bench --suite fp8 --backends auto,pallas,triton,xla \
  --time-budget $((540 - SECONDS)) --only '*.tensor' --out $R --run-name fp8-gemm \
  > $R/fp8-gemm.log 2>&1
echo "fp8-gemm rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
