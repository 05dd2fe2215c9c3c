#!/bin/bash
# One call: gpu_check.sh, gpu_profile.sh and a py-spy of the fused path; every log in one archive
# (the tool returns at most 8 files).
REAL=${OUT:-/tmp/out}; export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT
pack() { cp $OUT/*.log "$REAL"/ 2>/dev/null; tar czf "$REAL/all.tgz" -C $OUT .; }
trap pack EXIT
timeout 330 bash .gpu/gpu_check.sh
timeout 170 bash .gpu/gpu_profile.sh
(cd .gpu && timeout 60 py-spy record -r 1000 --threads --format raw -o $OUT/raw.txt -- python3 fused_prof.py cuda 60 >$OUT/pyspy.log 2>&1 && python3 stacks.py $OUT/raw.txt > $OUT/pyspy_fused.txt 2>&1)
date
