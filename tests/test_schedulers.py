"""horovodlite-run inside a scheduler's allocation: Slurm, PBS, LSF and the Kubernetes MPI Operator.

The nodelist parser is checked against Slurm's own `scontrol show hostnames` (Debian's
slurm-client, given a minimal slurm.conf: scontrol needs a configuration, not a controller) on
generated lists; the launch path runs on simulated hosts from each scheduler's environment.
"""

import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from horovodlite.run import cli
from horovodlite.run.allocation import (
    detect_allocation,
    expand_nodelist,
    expand_tasks_per_node,
)
from horovodlite.run.hosts import Host
from horovodlite.run.simcluster import SimulatedCluster, unavailable_reason

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "jobs", "allocation_ranks.py")
SCHEDULER_PREFIXES = ("SLURM_", "PBS_", "LSB_", "OMPI_MCA_orte_default_hostfile",
                      "HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE", "KUBERNETES_")  # fmt: skip


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    """Start every test outside any allocation, whatever machine runs it."""
    for name in list(os.environ):
        if name.startswith(SCHEDULER_PREFIXES):
            monkeypatch.delenv(name)


# --- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, names",
    [
        ("node[01-04,07],gpu-a[1-2]",
         ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]),
        ("a[8-10]", ["a8", "a9", "a10"]),
        ("a[08-10]", ["a08", "a09", "a10"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("10.0.0.[1-3]", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        ("solo", ["solo"]),
    ],
)  # fmt: skip
def test_expand_nodelist(text, names):
    assert expand_nodelist(text) == names


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty"),
        ("n[1-2", "without closing"),
        ("n1-2]", "without '\\['"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "bad range 'a-b'"),
        ("n[]", "bad range ''"),
        ("n[1-2],,m", "empty entry"),
        ("a[1-2]-b", "goes on after"),
        ("n[1-[2]]", "nested"),
        ("n1 n2", "unexpected ' '"),
    ],
)
def test_malformed_nodelists_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        expand_nodelist(text)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    for bad in ("", "2(x3", "x", "2(x0)", "2,,1", "-1"):
        with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
            expand_tasks_per_node(bad)


def _random_nodelist(rng: random.Random) -> str:
    entries = []
    for _ in range(rng.randint(1, 4)):
        prefix = rng.choice(["node", "gpu-a", "n", "cn-x", "rack1-", "h", "10.1.2."])
        groups = rng.randint(0, 2) if not prefix.endswith(".") else 1
        text = prefix
        for group in range(groups):
            if group:
                text += rng.choice(["r", "-s", "c"])
            parts = []
            for _ in range(rng.randint(1, 3)):
                width = rng.choice([1, 1, 2, 3, 4])
                low = rng.randint(0, 30)
                if rng.random() < 0.5:
                    parts.append(str(low).zfill(width))
                else:
                    high = low + rng.randint(0, 12)
                    parts.append(f"{str(low).zfill(width)}-{str(high).zfill(width)}")
            text += "[" + ",".join(parts) + "]"
        if groups == 0:
            text += str(rng.randint(0, 99)) if rng.random() < 0.7 else ""
        entries.append(text)
    return ",".join(entries)


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """Return a function that expands a nodelist with Slurm's scontrol (skip without it)."""
    found = shutil.which("scontrol")
    if found is None:
        pytest.skip("scontrol not installed (apt-get install slurm-client; .ci/run does)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=horovodlite\nSlurmctldHost=localhost\n")
    env = dict(os.environ, SLURM_CONF=str(conf))

    def expand(text: str) -> list:
        result = subprocess.run([found, "show", "hostnames", text], capture_output=True,
                                text=True, env=env, timeout=30)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    if expand("n[1-2]") != ["n1", "n2"]:
        pytest.skip("scontrol show hostnames does not work here")
    return expand


def test_nodelists_agree_with_scontrol(scontrol):
    rng = random.Random(20261125)
    lists = [_random_nodelist(rng) for _ in range(300)]
    # One scontrol for all of them (a process each took seconds): a nodelist is a comma-separated
    # list of entries, expanded in order and without merging, so the lists joined by commas
    # expand to their expansions one after another. Only on a difference is each list asked alone.
    ours = [name for text in lists for name in expand_nodelist(text)]
    if ours != scontrol(",".join(lists)):
        disagree = [(text, expand_nodelist(text), scontrol(text))
                    for text in lists if expand_nodelist(text) != scontrol(text)]  # fmt: skip
        assert disagree, "the lists differ only when joined: scontrol merged or sorted them"
        assert not disagree, f"{len(disagree)} of {len(lists)} differ, first: {disagree[0]}"


def test_malformed_nodelists_are_refused_by_scontrol_too(scontrol):
    for text in ("n[3-1]", "n[a-b]", "n[]", "a[1-2]-b"):
        # scontrol prints "Invalid hostlist" and no names where horovodlite raises.
        assert scontrol(text) == [], text


# --- each scheduler's environment --------------------------------------------------------------


def _fake(monkeypatch, tmp_path, scheduler: str, hosts: list) -> None:
    """Set the variables (and files) `scheduler` gives a job on `hosts` [(name, slots), ...]."""
    if scheduler == "Slurm":
        monkeypatch.setenv("SLURM_JOB_NODELIST", ",".join(name for name, _ in hosts))
        monkeypatch.setenv("SLURM_TASKS_PER_NODE", ",".join(str(n) for _, n in hosts))
        monkeypatch.setenv("SLURM_NTASKS", str(sum(n for _, n in hosts)))
    elif scheduler == "PBS":
        path = tmp_path / "pbs_nodefile"
        path.write_text("".join(f"{name}\n" * n for name, n in hosts))
        monkeypatch.setenv("PBS_NODEFILE", str(path))
    elif scheduler == "LSF":
        monkeypatch.setenv("LSB_MCPU_HOSTS", " ".join(f"{name} {n}" for name, n in hosts))
    else:  # the MPI Operator's hostfile, in its Open MPI form
        path = tmp_path / "hostfile"
        path.write_text("".join(f"{name} slots={n}\n" for name, n in hosts))
        monkeypatch.setenv("OMPI_MCA_orte_default_hostfile", str(path))


SCHEDULERS = ["Slurm", "PBS", "LSF", "Kubernetes"]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_each_scheduler_is_read(monkeypatch, tmp_path, scheduler):
    _fake(monkeypatch, tmp_path, scheduler, [("cn01", 2), ("cn02", 2), ("cn07", 1)])
    allocation = detect_allocation()
    assert allocation.scheduler == scheduler
    assert allocation.hosts == [Host("cn01", 2), Host("cn02", 2), Host("cn07", 1)]
    assert allocation.tasks == 5


def test_slurm_compressed_forms_and_ntasks(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-03],gpu-a1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x3),1")
    monkeypatch.setenv("SLURM_NTASKS", "7")
    allocation = detect_allocation()
    assert [h.slots for h in allocation.hosts] == [2, 2, 2, 1] and allocation.tasks == 7
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2),1")
    with pytest.raises(ValueError, match="gives 3 nodes, but SLURM_JOB_NODELIST.* names 4"):
        detect_allocation()


def test_kubernetes_hostfile_in_mpich_form(monkeypatch, tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("job-worker-0.job.default.svc:2\njob-worker-1.job.default.svc:2\n")
    monkeypatch.setenv("HYDRA_HOST_FILE", str(path))
    allocation = detect_allocation()
    assert allocation.scheduler == "Kubernetes" and allocation.tasks == 4


def test_lsf_malformed(monkeypatch):
    monkeypatch.setenv("LSB_MCPU_HOSTS", "hostA 4 hostB")
    with pytest.raises(ValueError, match="pairs of host and slots"):
        detect_allocation()


def _dry_run(capsys, *argv) -> tuple:
    status = cli.main(["--dry-run", *argv, "python", "train.py"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_dry_run_takes_hosts_and_np_from_the_allocation(monkeypatch, tmp_path, capsys, scheduler):
    _fake(monkeypatch, tmp_path, scheduler, [("cn01", 2), ("cn02", 1)])
    status, out, err = _dry_run(capsys)
    assert status == 0, err
    assert f"{scheduler} allocation: 3 tasks on cn01:2,cn02:1" in out
    command = out.strip().splitlines()[-1]
    assert "-n 3 -hosts cn01:2,cn02:1" in command or "-np 3 -H cn01:2,cn02:1" in command, out


def test_explicit_hosts_win_and_np_may_be_smaller(monkeypatch, tmp_path, capsys):
    _fake(monkeypatch, tmp_path, "Slurm", [("cn01", 2), ("cn02", 1)])
    status, out, _ = _dry_run(capsys, "-H", "other:4")
    assert status == 0 and "no scheduler allocation" in out and "other:4" in out
    status, out, _ = _dry_run(capsys, "-np", "2")
    assert status == 0 and ("-n 2 " in out or "-np 2 " in out)


def test_srun_launcher_under_slurm(monkeypatch, tmp_path, capsys):
    _fake(monkeypatch, tmp_path, "Slurm", [("cn01", 2), ("cn02", 1)])
    if shutil.which("srun") is None:
        pytest.skip("srun not installed (apt-get install slurm-client; .ci/run does)")
    status, out, err = _dry_run(capsys, "--launcher", "srun")
    assert status == 0, err
    command = out.strip().splitlines()[-1]
    assert command.endswith("--ntasks=3 --mpi=pmi2 --kill-on-bad-exit=1 python train.py")


def test_bad_input_fails_before_anything_starts(monkeypatch, tmp_path, capsys):
    _fake(monkeypatch, tmp_path, "Slurm", [("cn01", 2), ("cn02", 1)])
    status, _, err = _dry_run(capsys, "-np", "4")
    assert status == 2 and "-np 4 needs 4 slots, but the Slurm allocation offers 3" in err
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cn[01-02")
    status, _, err = _dry_run(capsys)
    assert status == 2 and "opens '[' without closing it" in err
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cn[01-02]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2")
    status, _, err = _dry_run(capsys)
    assert status == 2 and "SLURM_TASKS_PER_NODE='2(x2'" in err
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    status, _, err = _dry_run(capsys, "--launcher", "srun", "-np", "2")
    assert status == 2 and "no Slurm allocation was found" in err
    empty = tmp_path / "empty_hostfile"
    empty.write_text("# no hosts\n")
    status, _, err = _dry_run(capsys, "--hostfile", str(empty))
    assert status == 2 and "lists no host" in err
    zero = tmp_path / "zero_hostfile"
    zero.write_text("cn01 slots=0\n")
    status, _, err = _dry_run(capsys, "--hostfile", str(zero))
    assert status == 2 and "slots must be a positive integer" in err


def test_check_build_names_the_allocation(monkeypatch, tmp_path):
    from horovodlite.run import check_build

    # Importing every framework (torch for the transports, TensorFlow, Lightning) took all of this
    # test's time: those lines are test_run_cli.py's and test_transport.py's concern.
    monkeypatch.setattr(check_build, "_importable", lambda module: (False, "not imported here"))
    monkeypatch.setattr(check_build, "_transports", lambda: [])
    _fake(monkeypatch, tmp_path, "LSF", [("cn01", 2)])
    assert "Scheduler:       LSF allocation: 2 tasks on cn01:2" in check_build.build_report()


# --- the whole path on simulated hosts ---------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with SimulatedCluster(2) as built:
        yield built


@pytest.mark.mpi
@pytest.mark.netns
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_launch_on_simulated_hosts_from_each_scheduler(monkeypatch, tmp_path, cluster, scheduler):
    first, second = (host.address for host in cluster.hosts)
    _fake(monkeypatch, tmp_path, scheduler, [(first, 2), (second, 1)])
    if scheduler == "Slurm":  # the compressed form of the two addresses
        prefix = os.path.commonprefix([first, second]).rsplit(".", 1)[0] + "."
        last = [a.rsplit(".", 1)[1] for a in (first, second)]
        monkeypatch.setenv("SLURM_JOB_NODELIST", f"{prefix}[{','.join(last)}]")
    from horovodlite.run.simcluster import NETWORK_ENV

    launcher = f"-launcher ssh -launcher-exec {cluster.launcher_script} " \
               f"-localhost {cluster.bridge_address}"  # fmt: skip
    argv = [sys.executable, "-m", "horovodlite.run", "--skip-host-check",
            f"--mpi-args={launcher}", sys.executable, JOB]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **NETWORK_ENV})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # Ranks on different hosts print at once: lines may run together.
    lines = sorted(re.findall(r"rank \d+ of 3: local \d+ of \d+, host \d+, sum \d+", result.stdout))
    assert lines == [
        "rank 0 of 3: local 0 of 2, host 0, sum 3",
        "rank 1 of 3: local 1 of 2, host 0, sum 3",
        "rank 2 of 3: local 0 of 1, host 1, sum 3",
    ], result.stdout + result.stderr
