#!/bin/bash
# Stop 49's first GPU call: the tests on this commit; gpu_fused.py for this commit and bdef7d9
# (.gpu/old, the last commit that ran on a GPU) in turns; where the fused path's time goes
# (fused_parts.py: submit against wait, cProfile of caller and engine; py-spy nonblocking).
export PYTHONUNBUFFERED=1
START=$SECONDS; LIMIT=${LIMIT:-330}
left() { local l=$((LIMIT - (SECONDS - START))); [ $l -lt $1 ] && echo $l || echo $1; }
REAL=${OUT:-/tmp/out}; export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT
pack() { cp $OUT/*.log $OUT/*.txt "$REAL"/ 2>/dev/null; tar czf "$REAL/all.tgz" -C $OUT .; }
trap pack EXIT
BIN=$(dirname "$(python3 -c 'import sys;print(sys.executable)')"); export PATH=$BIN:$PATH
NEW=$PWD; OLD=$PWD/.gpu/old
{ date; nvidia-smi -L; nproc
  [ -z "$DRY" ] && python3 -m pip install -q --no-index --no-deps --no-compile --force-reinstall .gpu/whl/*.whl 2>&1 | tail -2
  [ -z "$DRY" ] && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
  (cd .gpu && python3 -c "import horovodlite; print('new', horovodlite.__file__)"
   PYTHONPATH=$OLD python3 -c "import horovodlite.torch, horovodlite; print('old', horovodlite.__file__)")
} 2>&1 | tee $OUT/probe.log
T="python3 -m mpi4py -m pytest -q -p no:cacheprovider -o python_files=rank_*.py --rootdir tests/ranks tests/ranks/rank_gpu.py --timeout 60 -rs"
date; timeout $(left 70) mpiexec -n 1 $T 2>&1 | tee $OUT/gpu1.log | tail -4
date; timeout $(left 60) mpiexec -n 2 $T 2>&1 | tee $OUT/gpu2.log | tail -3
cd .gpu
{ for rep in 1 2; do
  date; PYTHONPATH=$NEW timeout $(left 25) mpiexec -n 1 python3 gpu_fused.py 2>&1 | grep -E "GPUFUSED|Error" | sed 's/^/new /'
  date; PYTHONPATH=$OLD timeout $(left 25) mpiexec -n 1 python3 gpu_fused.py 2>&1 | grep -E "GPUFUSED|Error" | sed 's/^/old /'
  done
  for v in new old new old; do P=$NEW; [ $v = old ] && P=$OLD
    PYTHONPATH=$P PARTS_PROFILE=0 timeout $(left 25) mpiexec -n 1 python3 fused_parts.py $OUT 2>&1 | grep -E "PARTS|Error" | sed "s/^/$v /"
  done
  date; PYTHONPATH=$NEW timeout $(left 30) mpiexec -n 1 python3 fused_parts.py $OUT 2>&1 | grep -E "PARTS|Error"
} 2>&1 | tee $OUT/fused.log
date; timeout $(left 40) py-spy record -r 250 --nonblocking --threads --format raw -o $OUT/raw.txt -- python3 fused_prof.py cuda 300 > $OUT/pyspy.log 2>&1
python3 stacks.py $OUT/raw.txt > $OUT/pyspy_fused.txt 2>&1; rm -f $OUT/raw.txt
{ date; timeout $(left 25) mpiexec -n 1 python3 gpu_profile.py collectives 2>&1 | sed 's/^/new /'; } 2>&1 | tee $OUT/more.log
date; echo "used $((SECONDS - START)) s"
