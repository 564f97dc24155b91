#!/bin/bash
# Fourth call of 2026-11-26 (session b), nvidia-h200: the per-tensor FP8 step's
# quantization variants (step_profile.py --variants), with every kernel and the HLO dumped.
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
timeout 230 python3 research/probes/fp8-step-2026-11-26/step_profile.py --runs auto:tensor \
  --variants base,amax2,kmajor,kmajor+amax2 --dump $R/dump > $R/step-variants.log 2>&1
echo "variants rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
