#!/bin/bash
# PROBE_SET=under probe.py: the block default with the step's scales read from SMEM under
# its wgmma, paired against reading them after it, on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run6.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
PROBE_SET=under PROBE_DEADLINE_S=200 timeout 240 python3 research/probes/fp8-block-wide/probe.py \
  > $R/probe_under.log 2>&1
echo "probe rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
