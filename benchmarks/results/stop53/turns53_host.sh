#!/bin/bash
# Stop 53 on the 2-core host: this tree ("new") against 3aa3672 (stop 52's last commit, "old": a
# git worktree at $OLD with the bindings linked into horovodlite/, on PYTHONPATH), job by job in
# turns. Run from the repository root with the venv active; logs and JSONs land here.
set -u
OLD=${OLD:-/tmp/old}
HERE=benchmarks/results/stop53
side_path() { if [ "$1" = old ]; then echo "$OLD"; else echo "$PWD"; fi; }
layouts() {  # ranks, rounds: layouts.py old and new in turns
  for round in $(seq "$2"); do
    for side in old new; do
      P=$(side_path $side)
      (cd $HERE && PYTHONPATH=$P HOROVODLITE_TRANSPORT=gloo timeout 300 \
        mpiexec -n "$1" python layouts.py) | sed "s|$OLD|old|; s|$PWD|new|"
    done
  done 2>&1 | tee $HERE/layouts_np$1.log
}
layouts 1 3
layouts 2 2
for round in 1 2; do
  for side in old new; do
    P=$(side_path $side)
    (cd benchmarks && PYTHONPATH=$P timeout 600 python engine_requests.py --np 2 \
      --out "$PWD/../$HERE/er53_${side}_$round.json") > /dev/null 2>&1
    (cd benchmarks && PYTHONPATH=$P HOROVODLITE_TRANSPORT=gloo timeout 900 python \
      engine_fusion.py --paths torch --np 2 --repeats 7 \
      --out "$PWD/../$HERE/ef53_gloo_${side}_$round.json") > /dev/null 2>&1
  done
done
for side in old new; do
  P=$(side_path $side)
  (cd benchmarks && PYTHONPATH=$P timeout 900 python cpu_twin.py --np 2 \
    --sizes 1024,65536,1048576,16777216 --repeats 3 --time-per-block 0.2 --pairs 1000 \
    --output "$PWD/../$HERE/twin53_$side.json") > /dev/null 2>&1
done
