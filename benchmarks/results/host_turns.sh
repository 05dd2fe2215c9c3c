#!/bin/bash
# Before and after in turns, from benchmarks/: the engine's cost per request (engine_requests.py,
# 2 ranks, 256 and 1024 values), ResNet-50's 161 torch gradients (engine_fusion.py), the host
# all-reduce from 1 KiB to 16 MiB at 2 ranks against MPI's own (horovodlite.bench) and ResNet-18
# training at 2 ranks (synthetic_training.py, hvdlite only): three jobs each, on the old tree and
# on this one. The old tree is a git worktree at /tmp/old with the bindings linked into
# horovodlite/ (how: the stop's README.md). The same benchmark scripts run both: only the code
# they import differs.
# Argument: the stop's number (results go to results/stop<N>/). Example: bash results/host_turns.sh 58
set -eu
cd "$(dirname "$0")/.."
R=results/stop$1
mkdir -p $R/logs
for i in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then export PYTHONPATH=/tmp/old; else unset PYTHONPATH; fi
    python engine_requests.py --np 2 --repeats 11 --out $R/er_${side}_$i.json \
      > $R/logs/er_${side}_$i.log 2>&1
    python engine_fusion.py --paths torch --np 2 --repeats 7 --out $R/ef_${side}_$i.json \
      > $R/logs/ef_${side}_$i.log 2>&1
    python -m horovodlite.bench --np 2 --collectives allreduce --contenders auto,mpi-native \
      --min-size 1K --max-size 16M --size-factor 16 --time-per-size 0.1 --repeats 5 \
      --no-plot --no-progress --out $R --name sweep_${side}_$i > $R/logs/sweep_${side}_$i.log 2>&1
    python synthetic_training.py --settings host --contenders hvdlite --runs 1 --np 2 \
      --model resnet18 --batch-size 8 --iters 5 --out $R/train_${side}_$i.json \
      > $R/logs/train_${side}_$i.log 2>&1
    grep "sync/async" $R/logs/er_${side}_$i.log | tail -2 | sed "s/^/$side $i /"
  done
done
unset PYTHONPATH
