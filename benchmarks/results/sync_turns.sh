#!/bin/bash
# Before and after in turns, from benchmarks/: the CPU twin (cpu_twin.py at 2 ranks, 1 KiB and
# 64 KiB, 1000 paired rounds) and the numpy 1 KiB all-reduce against MPI's own
# (horovodlite.bench), on the old tree and on this one. The old tree is a git worktree at
# /tmp/old with the bindings linked into horovodlite/ (how: the stop's README.md). The same
# benchmark scripts run both: only the code they import differs.
# Arguments: the stop's number (results go to results/stop<N>/), the jobs each way, the rank
# counts of the numpy all-reduce, and the name of its files. Example:
#   bash results/sync_turns.sh 58 2 4 small4
set -eu
cd "$(dirname "$0")/.."
R=results/stop$1; JOBS=$2; NPS=$3; SMALL=$4
mkdir -p $R/logs
for i in $(seq 1 "$JOBS"); do
  for side in old new; do
    if [ $side = old ]; then export PYTHONPATH=/tmp/old; else unset PYTHONPATH; fi
    python cpu_twin.py --np 2 --sizes 1024,65536 --repeats 3 --time-per-block 0.2 --pairs 1000 \
      --output $R/twin_${side}_$i.json > $R/logs/twin_${side}_$i.log 2>&1
    python -m horovodlite.bench --np "$NPS" --collectives allreduce --contenders auto,mpi-native \
      --min-size 1K --max-size 1K --time-per-size 0.1 --repeats 5 --no-plot --no-progress \
      --out $R --name ${SMALL}_${side}_$i > $R/logs/${SMALL}_${side}_$i.log 2>&1
    grep "gloo-after-sync" $R/logs/twin_${side}_$i.log | sed "s/^/$side $i /"
    grep "time at 1 KiB" $R/logs/${SMALL}_${side}_$i.log | sed "s/^/$side $i /"
  done
done
unset PYTHONPATH
