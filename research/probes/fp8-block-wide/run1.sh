#!/bin/bash
# The block-scales 128x192 probe (probe.py) and the Pallas FP8 GPU tier (with the new
# 192-wide block-scale tests) on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run1.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
PROBE_DEADLINE_S=260 timeout 300 python3 research/probes/fp8-block-wide/probe.py > $R/probe.log 2>&1
echo "probe rc $? at $SECONDS s" >> $R/info.txt
timeout 240 python3 -m pytest -q -m "gpu or slow" tests/test_scaled_matmul_pallas.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
