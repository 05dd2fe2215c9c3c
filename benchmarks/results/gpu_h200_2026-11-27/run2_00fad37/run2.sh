#!/bin/bash
# Second GPU call: the tests on this commit, then this commit against 506b043 (.gpu/old) side by
# side on the same machine. Everything lands in one archive.
export PYTHONUNBUFFERED=1
REAL=${OUT:-/tmp/out}; export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT
pack() { cp $OUT/*.log "$REAL"/ 2>/dev/null; tar czf "$REAL/all.tgz" -C $OUT .; }
trap pack EXIT
BIN=$(dirname "$(python3 -c 'import sys;print(sys.executable)')"); export PATH=$BIN:$PATH
NEW=$PWD; OLD=$PWD/.gpu/old
{ date; nvidia-smi -L
  python3 -m pip install -q --no-index --no-deps --no-compile --force-reinstall .gpu/whl/*.whl 2>&1 | tail -2
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
  python3 -c "import horovodlite; print('new', horovodlite.__file__)"
  PYTHONPATH=$OLD python3 -c "import horovodlite.torch, horovodlite; print('old', horovodlite.__file__)"
} 2>&1 | tee $OUT/probe.log
T="python3 -m mpi4py -m pytest -q -p no:cacheprovider -o python_files=rank_*.py --rootdir tests/ranks tests/ranks/rank_gpu.py --timeout 90 -rs"
date; timeout 150 mpiexec -n 1 $T 2>&1 | tee $OUT/gpu1.log | tail -4
date; timeout 100 mpiexec -n 2 $T 2>&1 | tee $OUT/gpu2.log | tail -3
cd .gpu
{ for rep in 1 2; do
  date; timeout 60 mpiexec -n 1 python3 gpu_fused.py 2>&1 | grep GPUFUSED | sed 's/^/new /'
  date; PYTHONPATH=$OLD timeout 60 mpiexec -n 1 python3 gpu_fused.py 2>&1 | grep GPUFUSED | sed 's/^/old /'
  done; } 2>&1 | tee $OUT/fused.log
{ date; timeout 40 mpiexec -n 1 python3 gpu_profile.py collectives 2>&1 | sed 's/^/new /'
  mkdir -p $OUT/old; date; OUT=$OUT/old PYTHONPATH=$OLD timeout 40 mpiexec -n 1 python3 gpu_profile.py collectives 2>&1 | sed 's/^/old /'
  date; HOROVODLITE_TRANSPORT=mpi timeout 40 mpiexec -n 1 python3 gpu_profile.py staged 2>&1 | sed 's/^/new /'
} 2>&1 | tee $OUT/more.log
cd $NEW
for v in new old; do
  P=$NEW; [ $v = old ] && P=$OLD
  date; PYTHONPATH=$P timeout 70 python3 -m horovodlite.bench --device cuda --np 1 --collectives allreduce \
    --max-size 256M --time-per-size 0.05 --out $OUT/bench_$v --no-plot --no-progress 2>&1 | sed -n '/allreduce, 1 ranks/,/^$/p'
done 2>&1 | tee $OUT/bench.log
cd .gpu && date && timeout 45 py-spy record -r 250 --threads --format raw -o $OUT/raw.txt -- python3 fused_prof.py cuda 30 > $OUT/pyspy.log 2>&1; python3 stacks.py $OUT/raw.txt > $OUT/pyspy_fused.txt 2>&1; rm -f $OUT/raw.txt
date
