"""A real one-node Slurm cluster (Debian's slurm-wlm and munge): sbatch and srun run a job.

The test starts munged (unless one runs), slurmctld and slurmd with a configuration of its own
(ports 16817/16818, state under a temporary folder, no cgroups), submits a batch script with
`sbatch --wait`, and stops what it started. It skips, with the reason, without root or without
the daemons (.ci/run installs slurm-wlm).
"""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "jobs", "allocation_ranks.py")
DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "sinfo")

_CONF = """\
ClusterName=horovodlite
SlurmctldHost={host}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(pidfile: str) -> None:
    try:
        with open(pidfile) as f:
            os.kill(int(f.read().strip()), 15)
    except (OSError, ValueError):
        pass


def _stop_steps(folder) -> None:
    """End this cluster's job steps: wait for their sockets to go, then stop what remains.

    A step's slurmstepd can outlive its tasks (seen after `srun --mpi=none`); it is this
    cluster's if it holds the cluster's slurmd.log open.
    """
    deadline = time.monotonic() + 10
    while list((folder / "spool").glob("*_*.*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = str(folder / "slurmd.log")
    slurmd = (folder / "slurmd.pid").read_text().strip() if (folder / "slurmd.pid").exists() else ""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pid == slurmd:
            continue
        try:
            held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if log in held:
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Start a one-node Slurm cluster; yield the environment that reaches it."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: apt-get install slurm-wlm munge (.ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("starting slurmd needs root")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the jobs ask Slurm for 2 CPUs, and this machine has 1")
    folder = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    conf = folder / "slurm.conf"
    host = socket.gethostname()
    conf.write_text(_CONF.format(host=host, dir=folder, cpus=os.cpu_count() or 1))
    env = dict(os.environ, SLURM_CONF=str(conf))
    munged = None
    # A munged that answers (`munge -n` encodes a credential) is used; else one is started.
    if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
        os.makedirs("/run/munge", exist_ok=True)
        munged = folder / "munged.pid"
        started = subprocess.run(["munged", "--force", f"--pid-file={munged}"],
                                 capture_output=True, text=True)  # fmt: skip
        if started.returncode != 0:
            pytest.skip(f"munged does not start here: {started.stderr.strip()}")
    try:
        for daemon in (["slurmctld", "-c"], ["slurmd"]):
            started = subprocess.run(daemon, env=env, capture_output=True, text=True, timeout=30)
            if started.returncode != 0:
                logs = "".join(p.read_text() for p in folder.glob("*.log"))
                pytest.fail(f"{daemon[0]} did not start: {started.stderr}\n{logs}")
        deadline = time.monotonic() + 30
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                   text=True, timeout=30).stdout.strip()  # fmt: skip
            if state == "idle":
                break
            if time.monotonic() > deadline:
                logs = "".join(p.read_text() for p in folder.glob("*.log"))
                pytest.fail(f"the Slurm node is {state!r}, not idle, after 30 s:\n{logs}")
            time.sleep(0.5)
        yield env
    finally:
        _stop_steps(folder)
        _stop(str(folder / "slurmd.pid"))
        _stop(str(folder / "slurmctld.pid"))
        if munged is not None:
            _stop(str(munged))


@pytest.mark.mpi
def test_sbatch_runs_horovodlite_run_with_mpiexec_and_with_srun(slurm, tmp_path):
    output = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    python = sys.executable
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --ntasks=2\n"
        f"#SBATCH --output={output}\n"
        f"cd {ROOT}\n"
        f"{python} -m horovodlite.run --dry-run {python} {JOB}\n"
        f"{python} -m horovodlite.run {python} {JOB}\n"
        f"{python} -m horovodlite.run --launcher srun {python} {JOB}\n"
        # srun alone: MPICH's PMI client speaks Slurm's PMI-2.
        f"srun --mpi=pmi2 {python} {JOB}\n"
    )
    result = subprocess.run(["sbatch", "--wait", str(script)], env=slurm, capture_output=True,
                            text=True, timeout=240)  # fmt: skip
    text = output.read_text() if output.exists() else "(no output file)"
    assert result.returncode == 0, result.stdout + result.stderr + text
    host = socket.gethostname()
    assert f"Slurm allocation: 2 tasks on {host}:2" in text, text
    for rank in (0, 1):
        line = f"rank {rank} of 2: local {rank} of 2, host 0, sum 2"
        assert text.count(line) == 3, text  # mpiexec, horovodlite-run's srun, plain srun


@pytest.mark.mpi
def test_srun_without_pmi_starts_singletons(slurm):
    # Documented: without --mpi=pmi2 every task is its own rank 0 of 1.
    result = subprocess.run(["srun", "-n", "2", "--mpi=none", sys.executable, JOB], env=slurm,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("rank 0 of 1: local 0 of 1, host 0, sum 1") == 2, result.stdout
