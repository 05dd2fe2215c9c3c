#!/bin/bash
# Stop 55 on a GPU: gpu_staging.py at 1 and 2 ranks, this tree against 604559d (stop 51's, the
# last tree run on a GPU; .gpu/old on PYTHONPATH), in turns, then stop 54's turns54.sh (which
# also covers stop 53's and stop 52's scripts). Copy this directory's scripts and stop 54's,
# 53's and 52's into .gpu/. Logs to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=.gpu
for round in 1 2; do
  for side in new old; do
    P=; [ "$side" = old ] && P=$PWD/$G/old
    for np in 1 2; do
      (cd $G && PYTHONPATH=$P HOROVODLITE_TRANSPORT=mpi HOROVODLITE_CUDA_AWARE_MPI=0 \
        timeout 120 mpiexec -n $np python3 gpu_staging.py) 2>&1 \
        | grep -E "GPUSTAGING|Error" | sed "s/^/$side /"
    done
  done
done 2>&1 | tee "$OUT/turns55.log"
bash $G/turns54.sh
