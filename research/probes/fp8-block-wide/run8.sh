#!/bin/bash
# skinny.py: the 128-row per-tensor GEMM with Triton reading the (K, N) weight in place,
# on a clean export of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run8.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 240 python3 research/probes/fp8-block-wide/skinny.py > $R/skinny.log 2>&1
echo "skinny rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
