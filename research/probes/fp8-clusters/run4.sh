#!/bin/bash
# run4: run3 on the final tree (after the Explicit-axes fix: quantize, cast_transpose_p types,
# out_sharding): the named recipes' step, then the whole FP8 GPU tier of the op
# and the training path. Runs a clean export of commit $TREE carried as .clean/tree.tar
# (`git archive $TREE > .clean/tree.tar`), so that uncommitted work does not travel.
# Usage there: TREE=<commit> bash research/probes/fp8-clusters/run4.sh
set -u
R=/tmp/res; mkdir -p $R
T=/tmp/tree; mkdir -p $T && tar xf .clean/tree.tar -C $T && cp -r .whl $T/ && cd $T
{ nvidia-smi -L; echo "tree: $TREE"; } > $R/info.txt 2>&1
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
timeout 280 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 240 \
  --variants 'fp8=tensor,fp8=block' --out $R --run-name fp8-step > $R/fp8-step.log 2>&1
echo "fp8-step rc $? at $SECONDS s" >> $R/info.txt
timeout $((580 - SECONDS)) python3 -m pytest -q -m "gpu or slow" tests/test_cast_transpose.py \
  tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py \
  tests/test_fp8_training.py > $R/tier.log 2>&1
echo "tier rc $? at $SECONDS s" >> $R/info.txt
tar czf "$OUT/results.tgz" -C $R .
