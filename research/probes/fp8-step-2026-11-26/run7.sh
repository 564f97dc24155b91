#!/bin/bash
# Prepared for the next session (NOT RUN: this session's device time was spent), nvidia-h200,
# ~3 minutes: the two cheapest candidates against the FP8 step's 3.9 ms of quantization
# overhead (docs/performance-notes.md, "FP8 GEMMs"), each removing the cuBLAS FP8 GEMMs'
# fp32 writes and their converts to bf16 (~1.1 ms of the step):
#   * per-tensor scales with e4m3 gradients: same-dtype dgrad and wgrad, which `auto`
#     sends to the Pallas kernel (bf16 out), where e5m2 x e4m3 stays on XLA;
#   * XLA's per-tensor form with a bf16 dot and the scale multiplied in bf16: one rounding
#     only if XLA folds the scale into cuBLASLt's alpha (xla_forms.py's error column says).
# Usage there: TREE=<commit> bash research/probes/fp8-step-2026-11-26/run7.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
timeout 60 python3 research/probes/fp8-step-2026-11-26/xla_forms.py > $R/xla-forms.log 2>&1
echo "forms rc $? at $SECONDS s" >> $R/info.txt
timeout 200 python3 research/probes/fp8-step-2026-11-26/step_profile.py \
  --runs auto:tensor,auto:tensor-e4m3 --variants base,bf16out > $R/step-variants.log 2>&1
echo "variants rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
