#!/bin/bash
# Stop 58: the synchronous paths that this stop did not change, before and after in turns (two
# jobs each), from benchmarks/: the CPU twin at 1 KiB and 64 KiB (hvd.allreduce of a torch
# tensor over Gloo against Gloo's own call) and the numpy 1 KiB all-reduce at 4 ranks against
# MPI's own. The old tree: a git worktree of 24d37ee at /tmp/old (see turns58.sh).
set -eu
cd "$(dirname "$0")/../.."
R=results/stop58
mkdir -p $R/logs
for i in 1 2; do
  for side in old new; do
    if [ $side = old ]; then export PYTHONPATH=/tmp/old; else unset PYTHONPATH; fi
    python cpu_twin.py --np 2 --sizes 1024,65536 --repeats 3 --time-per-block 0.2 --pairs 1000 \
      --output $R/twin_${side}_$i.json > $R/logs/twin_${side}_$i.log 2>&1
    python -m horovodlite.bench --np 4 --collectives allreduce --contenders auto,mpi-native \
      --min-size 1K --max-size 1K --time-per-size 0.1 --repeats 5 \
      --no-plot --no-progress --out $R --name small4_${side}_$i > $R/logs/small4_${side}_$i.log 2>&1
    echo "$side $i: $(grep 'gloo-after-sync' $R/logs/twin_${side}_$i.log | sed 's/, 1000 rounds//' | tr -s ' ' | tr '\n' ';') $(grep 'time at 1 KiB' $R/logs/small4_${side}_$i.log)"
  done
done
unset PYTHONPATH
