#!/bin/bash
# The wide-tile and cluster GPU tests (odd tile counts, multicast) on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-clusters/run6.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 240 python3 -m pytest -q -m "gpu or slow" tests/test_scaled_matmul_pallas.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
