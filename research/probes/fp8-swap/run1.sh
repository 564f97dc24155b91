#!/bin/bash
# probe_swap.py on a clean export of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-swap/run1.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 480 python3 research/probes/fp8-swap/probe_swap.py > $R/probe_swap.log 2>&1
echo "probe_swap rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
