#!/bin/bash
# probe3.py (split K at 128 rows, in place), on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-inplace-f16/run5.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 300 python3 research/probes/fp8-inplace-f16/probe3.py > $R/probe3.log 2>&1
echo "probe3 rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
