import glob
import os
import sys
import time

# tests/ holds helper modules (mpirun.py) that the tests import by name.
sys.path.insert(0, os.path.dirname(__file__))

# Jobs that a test aborts on purpose (a rank's error, a timeout, a kill) leave MPICH's shared-memory
# segments behind in /dev/shm, a few MiB each: a run of the suite left about 270 MiB, and a day of
# runs filled the RAM that /dev/shm lives in. The session removes the ones made during it that no
# process maps any more.
_SEGMENTS = "/dev/shm/mpich_shm_*"


def pytest_sessionstart(session):
    session.config._horovodlite_start = time.time()


def pytest_sessionfinish(session, exitstatus):
    start = getattr(session.config, "_horovodlite_start", None)
    if start is None:
        return
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(line.split()[-1] for line in f if "/dev/shm/mpich_shm_" in line)
        except OSError:
            continue  # (a process that ended meanwhile, or one we may not read)
    for path in glob.glob(_SEGMENTS):
        try:
            if os.stat(path).st_mtime >= start - 1 and path not in mapped:
                os.remove(path)
        except OSError:
            pass
