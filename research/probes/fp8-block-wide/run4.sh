#!/bin/bash
# The cast-transpose kernel's block modes by variant (quant_modes.py), then the block step's
# CUPTI sum as it is and with TRANSPOSE_FIRST on (step_probe.py, the switch set before it
# runs), on a clean export of $TREE.
# Usage there: TREE=<commit> bash research/probes/fp8-block-wide/run4.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 200 python3 research/probes/fp8-block-wide/quant_modes.py > $R/quant_modes.log 2>&1
echo "quant_modes rc $? at $SECONDS s" >> $R/info.txt
for tf in False True; do
  timeout 150 python3 -c "
import runpy, sys
from jaxgemm.kernels.triton.quantize import cast_transpose as ct
ct.TRANSPOSE_FIRST = $tf
print('TRANSPOSE_FIRST', ct.TRANSPOSE_FIRST, flush=True)
sys.argv = ['step_probe.py', '--runs', 'block']
runpy.run_path('research/probes/fp8-fused-quant/step_probe.py', run_name='__main__')
" > $R/step_probe_tf_$tf.log 2>&1
  echo "step_probe TRANSPOSE_FIRST=$tf rc $? at $SECONDS s" >> $R/info.txt
done
tar czf "$OUT/results.tgz" -C $R .
