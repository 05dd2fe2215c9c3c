"""A worker that follows the elastic contract without the state API, to test the launcher.

    elastic_standin.py LOG MODE

Every rank appends `restart=R size=S rank=r` to LOG, then by MODE:
    kill        on the first run (HOROVODLITE_ELASTIC_RESTART=0) rank 1 SIGKILLs itself
    kill-always rank 1 SIGKILLs itself on every run
    kill-host1  every rank on the second host (cross_rank 1) SIGKILLs itself, on every run
    grow        on the first run, write a commit file (the launcher announces hosts only after
                a commit), wait (up to 20 s) until the hosts file's counter changes, then every
                rank leaves with HOSTS_UPDATED_EXIT_CODE
    exit75      every rank leaves with HOSTS_UPDATED_EXIT_CODE although nobody announced hosts
The run ends normally otherwise.
"""

import os
import signal
import sys
import time

import numpy as np

import horovodlite as hvd
from horovodlite.config import HOSTS_UPDATED_EXIT_CODE
from horovodlite.training.commit_store import CommitStore, commit_folder


def counter() -> str:
    with open(os.environ["HOROVODLITE_ELASTIC_HOSTS_FILE"]) as f:
        return f.read().strip()


def main(log: str, mode: str) -> int:
    hvd.init()
    restart = int(os.environ["HOROVODLITE_ELASTIC_RESTART"])
    with open(log, "a") as f:
        f.write(f"restart={restart} size={hvd.size()} rank={hvd.rank()} "
                f"job={os.environ['HOROVODLITE_ELASTIC_JOB_ID']}\n")  # fmt: skip
    hvd.allreduce(np.ones(1), name="ready")
    die = (mode == "kill" and restart == 0 and hvd.rank() == 1) or (
        mode == "kill-always" and hvd.rank() == 1) or (
        mode == "kill-host1" and hvd.cross_rank() == 1)  # fmt: skip
    if die:
        # The others are in a collective by then, long enough to mark their wait: the exit
        # watch then names only the ranks that died on their own.
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "grow" and restart == 0:
        first = counter()
        settings = hvd.state.current().settings
        folder = commit_folder(settings.elastic_dir, settings.elastic_job_id, hvd.rank())
        CommitStore(folder).write(1, b"stand-in")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            changed = float(counter() != first)
            # Every rank leaves together: they agree on whether any of them saw the change.
            if hvd.allreduce(np.array([changed]), op=hvd.Max, name="seen")[0]:
                hvd.shutdown()
                return HOSTS_UPDATED_EXIT_CODE
            time.sleep(0.1)
        return 3
    if mode == "exit75":
        hvd.shutdown()
        return HOSTS_UPDATED_EXIT_CODE
    hvd.allreduce(np.ones(1), name="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
