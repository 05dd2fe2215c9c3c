#!/bin/bash
# Issue #38's host targets in one run, from benchmarks/: the engine's cost per request, ResNet-50's
# 161 torch gradients against one in-place buffer, the CPU twin, and the numpy 1 KiB all-reduce
# at 4 and 2 ranks against MPI's own. About 2 minutes on 2 cores.
# Arguments: the stop's number (results go to results/stop<N>/, files tagged <N>), and a suffix
# for the output files (one per run). Example: bash results/issue38_targets.sh 57 _1
set -eu
cd "$(dirname "$0")/.."
N=$1; R=results/stop$N; S=${2:-}
mkdir -p $R/logs
python engine_requests.py --np 2 --repeats 11 --out $R/er$N$S.json 2>&1 | tee $R/logs/er$N$S.log
python engine_fusion.py --paths torch --np 2 --repeats 7 --out $R/ef${N}_torch$S.json 2>&1 \
  | tee $R/logs/ef${N}_torch$S.log
python cpu_twin.py --np 2 --sizes 1024,65536,1048576,16777216 --repeats 3 --time-per-block 0.2 \
  --pairs 1000 --output $R/cpu_twin$N$S.json 2>&1 | tee $R/logs/cpu_twin$N$S.log
python -m horovodlite.bench --np 4,2 --collectives allreduce --contenders auto,mpi-native \
  --min-size 1K --max-size 16K --size-factor 16 --time-per-size 0.1 --repeats 5 \
  --no-plot --no-progress --out $R --name small$N$S 2>&1 | tee $R/logs/small$N$S.log
