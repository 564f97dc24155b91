#!/bin/bash
# The clusters / 128x192 probe (probe.py) on one GPU, per tensor and block scales.
# Usage there: TREE=<commit> bash research/probes/fp8-clusters/run1.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
PROBE_DEADLINE_S=520 timeout 560 python3 research/probes/fp8-clusters/probe.py > $R/probe.log 2>&1
echo "probe rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
