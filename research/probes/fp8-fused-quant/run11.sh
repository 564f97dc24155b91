#!/bin/bash
# run11, after the named per-tensor recipe became power-of-two scales + the Triton
# quantizer (40bd7bb) and the bench's FP8 trajectory gate the 10-step running mean.
#   part a: acc_probe.py (the FP8 kernels' element-wise error distribution, 30 seeds),
#           then the bench's FP8 step for the named "tensor" and "block+triton-quantize";
#   part b: the FP8 GPU tier, then the step for "tensor+f32-scales" and the named "block".
# No FP8 row starts after 300 s (an H100 tunes each on the spot: ~150 s a row, run9).
# Usage there: TREE=<commit> bash research/probes/fp8-fused-quant/run11.sh a|b
set -u
PART=$1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res-$PART; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; echo "tree: $TREE part $PART"; } > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }
step() {
  timeout 470 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 300 \
    --variants "$1" --out $R --run-name fp8-step-$PART > $R/fp8-step.log 2>&1
  stamp fp8-step $?
}
if [ "$PART" = a ]; then
  timeout 200 python3 research/probes/fp8-fused-quant/acc_probe.py 30 > $R/acc-probe.log 2>&1
  stamp acc-probe $?
  step 'fp8=tensor,fp8=block+triton-quantize'
else
  JAXGEMM_TEST_SEED=${SEED:-12345} timeout 300 python3 -m pytest -q --tb=short -p no:cacheprovider \
    -m "gpu or slow" tests/test_cast_transpose.py tests/test_scaled_matmul.py \
    tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py tests/test_fp8_training.py \
    > $R/fp8-gpu-tier.log 2>&1
  stamp fp8-tier $?
  timeout 120 python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_fp8_training.py \
    -k "triton_quantizer or auto_quantizer or recipes" > $R/fp8-unmarked.log 2>&1
  stamp unmarked $?
  step 'fp8=tensor+f32-scales,fp8=block'
fi
tar czf "$OUT/results-$PART.tgz" -C $R .
