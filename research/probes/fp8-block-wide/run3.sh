#!/bin/bash
# Where the block recipe's step time goes after the 128x192 defaults: step_probe.py's CUPTI
# kernel sums by class and its 40 longest kernels, for XLA's bf16 step, the named tensor and
# block recipes, on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run3.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 400 python3 research/probes/fp8-fused-quant/step_probe.py --runs bf16,tensor,block \
  --top 40 > $R/step_probe.log 2>&1
echo "step_probe rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
