#!/bin/bash
# Second call (nvidia-h200-x2, 2026-11-26): the first call's single-GPU CSVs did not come
# back (the device tool returns at most 8 files; run.sh left 9), so everything goes into
# one tar here. GPU 0: the fp8 suite's 12 GEMM problems. GPU 1: where the fp8 step's XLA
# reference ran out of memory (fp8_step_memory.py), then the step with backend auto.
set -u
make gpu-env > /tmp/env.log 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
I=$R/info.txt
{ nvidia-smi -L; nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv;
  for d in 0 1; do CUDA_VISIBLE_DEVICES=$d python3 -c "import jax; print('visible', jax.devices())"; done
} > $I 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> $I; }

(CUDA_VISIBLE_DEVICES=0 timeout 450 python3 -m bench --suite fp8 --only '*.tensor,*.block' \
   --time-budget 390 --out $R --run-name h200-fp8-gemms-2026-11-26 > $R/fp8-gemms.log 2>&1
 stamp fp8-gemms $?) &
(export CUDA_VISIBLE_DEVICES=1
 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 \
   research/probes/h200x4-2026-11-26/fp8_step_memory.py 4 > $R/fp8-step-memory.log 2>&1
 stamp step-memory $?
 nvidia-smi --query-gpu=index,memory.used --format=csv >> $I
 timeout 280 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto --time-budget 230 \
   --out $R --run-name h200-fp8-step-2026-11-26 > $R/fp8-step.log 2>&1; stamp fp8-step $?) &
wait
tar czf "$OUT/results.tgz" -C $R .
cp $I "$OUT/info.txt"
