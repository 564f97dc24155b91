#!/bin/bash
# run12, after the cast-transpose kernel's block modes became a partitioned primitive and
# "auto" took the kernel for block scales (a987299): the quantizer's GPU tests and the
# unmarked quantizer/recipe tests through the primitive, then the bench's FP8 step for the
# named "block" (now the Triton quantizer) and "block+xla-quantize" (as it was).
# Usage there: TREE=<commit> bash research/probes/fp8-fused-quant/run12.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE"; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }
timeout 150 python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_fp8_training.py \
  -k "triton_quantizer or auto_quantizer or recipes or sharded or vmap" > $R/fp8-unmarked.log 2>&1
stamp unmarked $?
timeout 120 python3 -m pytest -q --tb=short -p no:cacheprovider -m "gpu or slow" \
  tests/test_cast_transpose.py > $R/cast-transpose-gpu.log 2>&1
stamp cast-transpose-gpu $?
timeout 400 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 250 \
  --variants 'fp8=block,fp8=block+xla-quantize' --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
stamp fp8-step $?
tar czf "$OUT/results.tgz" -C $R .
