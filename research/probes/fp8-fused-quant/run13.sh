#!/bin/bash
# Prepared, not run (no H200 came this session): the bench's FP8 step for the named recipes
# as they are since 9f79e8b (power-of-two scales per tensor, the Triton quantizer for both)
# and the two as they were (bench.training.FP8_OPTIONS), paired with XLA's bf16 step, on an
# nvidia-h200, where the targets are set. An H200 finds its tuned configs in the
# shipped table (~15 s a row); an H100 tunes on the spot (~150 s a row), so the 300 s budget
# takes two rows there.
# Usage there: TREE=<commit> bash research/probes/fp8-fused-quant/run13.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE"; } > $I 2>&1
timeout 470 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 300 \
  --variants 'fp8=tensor,fp8=block,fp8=tensor+f32-scales,fp8=block+xla-quantize' \
  --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $I
tar czf "$OUT/results.tgz" -C $R .
