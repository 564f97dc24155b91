#!/bin/bash
# probe.py (float16 math on a weight read in place) and transpose.py (fp8 transposes), on
# a clean export of $TREE. Usage there: TREE=<commit> bash research/probes/fp8-inplace-f16/run1.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
D=research/probes/fp8-inplace-f16
timeout 330 python3 $D/probe.py > $R/probe.log 2>&1
echo "probe rc $? at $SECONDS s" >> $R/info.txt
timeout 150 python3 $D/transpose.py > $R/transpose.log 2>&1
echo "transpose rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
