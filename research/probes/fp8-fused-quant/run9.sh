#!/bin/bash
# Before landing: where xla and Triton quantize_pair differ on the GPU (diff_probe.py);
# the FP8 GPU tier with the cast-transpose kernel's tests; the unmarked power-of-two and
# Triton-quantizer tests on the GPU; the bench's FP8 step (named recipes, paired timing).
# Usage there: TREE=<commit> bash research/probes/fp8-fused-quant/run9.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE"; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }
timeout 60 python3 research/probes/fp8-fused-quant/diff_probe.py > $R/diff-probe.log 2>&1
stamp diff-probe $?
timeout 270 python3 -m pytest -q --tb=short -p no:cacheprovider -m "gpu or slow" \
  tests/test_cast_transpose.py tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py \
  tests/test_scaled_matmul_pallas.py tests/test_fp8_training.py > $R/fp8-gpu-tier.log 2>&1
stamp fp8-tier $?
timeout 90 python3 -m pytest -q --tb=short -p no:cacheprovider \
  tests/test_fp8_training.py tests/test_scaled_matmul.py -k "triton_quantizer or power_of_two" \
  > $R/gpu-unmarked.log 2>&1
stamp unmarked $?
timeout $((560 - SECONDS)) python3 -m bench --suite fp8 --only 'fp8.*' --backends auto \
  --time-budget 150 --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
stamp fp8-step $?
tar czf "$OUT/results.tgz" -C $R .
