#!/bin/bash
# Hardware counters of XLA's dot and our rungs (ncu_gemms.py), plus the SASS and
# ptxas report of what Mosaic GPU compiled. On the H200, from the repository root:
#   make gpu-env; OUT=<dir> bash research/probes/pallas-2026-11-23e/ncu.sh
# Nsight Compute locks the clocks to base (its default), so the kernels compare
# at the same clock; its durations are not the benchmark's.
set -u
HERE=research/probes/pallas-2026-11-23e
export PYTHONPATH=$PWD/.gpu-site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/dump
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; $NCU --version | tail -1
METRICS=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed
# Keep only the metrics this ncu knows (an unknown one fails the whole run).
$NCU --query-metrics --chip gh100 > $OUT/ncu_metrics.txt 2>&1
METRICS=$(for m in ${METRICS//,/ }; do grep -qE "^${m%%.*}[[:space:]]" $OUT/ncu_metrics.txt && echo -n "$m,"; done)
METRICS=${METRICS%,}; echo "metrics: $METRICS"; grep -i gmma $OUT/ncu_metrics.txt | head
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
MOSAIC_GPU_DUMP_TO=$OUT/dump MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 \
  timeout 240 $NCU --profile-from-start off --csv --page details $SECTIONS --metrics $METRICS \
  python3 $HERE/ncu_gemms.py > $OUT/ncu_details.csv 2> $OUT/ncu_stderr.log
echo "ncu rc $?"; wc -l $OUT/ncu_details.csv; tail -5 $OUT/ncu_stderr.log
if [ -z "$(ls $OUT/dump)" ]; then   # ncu failed before compiling: the dump alone
  MOSAIC_GPU_DUMP_TO=$OUT/dump MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 \
    timeout 120 python3 $HERE/ncu_gemms.py
fi
ls -la $OUT/dump | head -30
