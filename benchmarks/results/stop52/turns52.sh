#!/bin/bash
# Stop 52: bfloat16 and CuPy-less ResNet-50 gradients at 1 rank, this tree against 604559d
# (.gpu/old on PYTHONPATH), in turns; then gpu_fused.py in turns. Logs to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=.gpu
for round in 1 2; do
  for side in new old; do
    for case in bf16 nocupy; do
      if [ $side = old ]; then P=$PWD/$G/old; else P=; fi
      (cd $G && PYTHONPATH=$P timeout 120 mpiexec -n 1 python3 gpu_bf16.py $case) 2>&1 | grep -E "GPUBF16|Error" | sed "s/^/$side /"
    done
    if [ $side = old ]; then P=$PWD/$G/old; else P=; fi
    (cd $G && PYTHONPATH=$P timeout 90 mpiexec -n 1 python3 gpu_fused.py) 2>&1 | grep -E "GPUFUSED|Error" | sed "s/^/$side /"
  done
done 2>&1 | tee "$OUT/turns52.log"
