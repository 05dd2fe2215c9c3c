#!/bin/bash
# Stop 54 on a GPU: this tree against 604559d (stop 51's, the last tree run on a GPU; .gpu/old on
# PYTHONPATH), in turns: gpu_movement.py (broadcast_, all-gather, all-to-all, reduce-scatter of
# float32 and bfloat16 CUDA tensors per call, against torch's NCCL), then stop 53's
# gpu_layouts.py and gpu_fused.py and stop 52's gpu_bf16.py. Logs to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=.gpu
run() {  # side, timeout, script and arguments
  local side=$1 limit=$2; shift 2
  local P=; [ "$side" = old ] && P=$PWD/$G/old
  (cd $G && PYTHONPATH=$P HOROVODLITE_TRANSPORT=nccl timeout "$limit" mpiexec -n 1 python3 "$@") \
    2>&1 | grep -E "GPUMOVEMENT|GPULAYOUTS|GPUFUSED|GPUBF16|Error" | sed "s/^/$side /"
}
for round in 1 2; do
  for side in new old; do
    run $side 120 gpu_movement.py
    run $side 150 gpu_layouts.py
    run $side 90 gpu_fused.py
    run $side 120 gpu_bf16.py bf16
  done
done 2>&1 | tee "$OUT/turns54.log"
