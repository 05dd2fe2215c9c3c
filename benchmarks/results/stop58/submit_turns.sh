#!/bin/bash
# Stop 58: submitting a repeated request, and a whole repeated step, at one rank; old (a git
# worktree of 24d37ee at /tmp/old, see turns58.sh) and new in turns, three jobs each.
set -eu
cd "$(dirname "$0")/../../.."
for i in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then export PYTHONPATH=/tmp/old; else unset PYTHONPATH; fi
    echo "$side $i: $(python benchmarks/results/stop57/submit_cost.py) | $(python benchmarks/results/stop58/step_cost.py)"
  done
done
