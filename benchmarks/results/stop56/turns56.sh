#!/bin/bash
# Stop 56, before and after in turns, from benchmarks/: the CPU twin (cpu_twin.py at 2 ranks,
# 1 KiB and 64 KiB, 1000 paired rounds) and the numpy 1 KiB all-reduce at 4 and 2 ranks against
# MPI's own (horovodlite.bench), three jobs each, on the old tree and on this one. The old tree
# is a git worktree of 4452f3e at /tmp/old with the bindings linked into horovodlite/ (how:
# README.md here). The same benchmark scripts run both: only the code they import differs.
set -eu
cd "$(dirname "$0")/../.."
R=results/stop56
mkdir -p $R/logs
for i in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then export PYTHONPATH=/tmp/old; else unset PYTHONPATH; fi
    python cpu_twin.py --np 2 --sizes 1024,65536 --repeats 3 --time-per-block 0.2 --pairs 1000 \
      --output $R/twin_${side}_$i.json > $R/logs/twin_${side}_$i.log 2>&1
    python -m horovodlite.bench --np 4,2 --collectives allreduce --contenders auto,mpi-native \
      --min-size 1K --max-size 1K --time-per-size 0.1 --repeats 5 --no-plot --no-progress \
      --out $R --name small_${side}_$i > $R/logs/small_${side}_$i.log 2>&1
    grep "gloo-after-sync" $R/logs/twin_${side}_$i.log | sed "s/^/$side $i /"
  done
done
unset PYTHONPATH
