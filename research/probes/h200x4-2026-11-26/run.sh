#!/bin/bash
# One call on an nvidia-h200-x4 machine (2026-11-26): the sharded suite on all four GPUs
# first (it times programs spanning every GPU, so nothing else runs beside it), then four
# single-GPU jobs side by side, one per GPU (CUPTI kernel times are per device):
#   GPU 0  fp8 suite, its GEMMs (issue 28)          GPU 1  random r12-r47, no tables (issue 23)
#   GPU 2  fp8 suite, its training step (auto)      GPU 3  GPU tier of the FP8 tests
# then the sharding GPU tier (tests/test_sharding_gpu.py) on all four.
# Usage there: bash research/probes/h200x4-2026-11-26/run.sh   (writes under $OUT)
set -u
make gpu-env > "$OUT/env.log" 2>&1
export PYTHONPATH=$PWD/.gpu-site
R=/tmp/res; mkdir -p $R
{ nvidia-smi -L; nvidia-smi topo -m; env | grep -E 'NCCL|NVSHMEM|SYMM'; } > "$OUT/info.txt" 2>&1
stamp() { echo "$1 rc $2 at $SECONDS s" >> "$OUT/info.txt"; }

timeout 200 python3 -m bench --suite sharded --backends auto,triton,pallas --time-budget 150 \
  --out $R --run-name h200x4-sharded-2026-11-26b > "$OUT/sharded.log" 2>&1; stamp sharded $?
tar czf "$OUT/sharded.tgz" -C $R h200x4-sharded-2026-11-26b 2>/dev/null

(CUDA_VISIBLE_DEVICES=0 timeout 320 python3 -m bench --suite fp8 --only '*.tensor,*.block' \
   --time-budget 260 --out $R --run-name h200-fp8-gemms-2026-11-26 > "$OUT/fp8-gemms.log" 2>&1
 stamp fp8-gemms $?) &
(CUDA_VISIBLE_DEVICES=1 JAXGEMM_TABLES=off timeout 320 python3 -m bench --suite random \
   --only 'r1[2-9]*,r[2-4]*' --variants best --time-budget 260 --out $R \
   --run-name h200-random-2026-11-26b > "$OUT/random.log" 2>&1; stamp random $?) &
(CUDA_VISIBLE_DEVICES=2 timeout 320 python3 -m bench --suite fp8 --only 'fp8.*' --backends auto \
   --time-budget 260 --out $R --run-name h200-fp8-step-2026-11-26 > "$OUT/fp8-step.log" 2>&1
 stamp fp8-step $?) &
(CUDA_VISIBLE_DEVICES=3 timeout 320 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" \
   tests/test_scaled_matmul.py tests/test_scaled_matmul_triton.py tests/test_scaled_matmul_pallas.py \
   tests/test_fp8_training.py > "$OUT/fp8-gpu-tier.log" 2>&1; stamp fp8-tier $?) &
wait
tar czf "$OUT/single.tgz" -C $R h200-fp8-gemms-2026-11-26 h200-random-2026-11-26b \
  h200-fp8-step-2026-11-26 2>/dev/null
timeout 95 python3 -m pytest -q -p no:cacheprovider tests/test_sharding_gpu.py \
  > "$OUT/sharding-gpu-tier.log" 2>&1; stamp sharding-tier $?
