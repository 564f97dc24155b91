#!/bin/bash
# The fused quantization's second GPU measurement (the kernel compiling under triton 3.6, the xla path transposing fp8): quantize_pair by XLA vs the Triton
# cast-transpose kernel (quant_bench.py), then the FP8 step by recipe variant
# (step_probe.py). Usage there: TREE=<commit> bash research/probes/fp8-fused-quant/run8b.sh
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
timeout 120 python3 research/probes/fp8-fused-quant/quant_bench.py > $R/quant-bench.log 2>&1
echo "quant-bench rc $? at $SECONDS s" >> $R/info.txt
timeout $((540 - SECONDS)) python3 research/probes/fp8-fused-quant/step_probe.py > $R/step-probe.log 2>&1
echo "step-probe rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
