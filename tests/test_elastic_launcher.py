"""The elastic launcher without MPI: flag checks, discovery scripts, the restart loop.

The restart loop runs against a fake `mpiexec` (HOROVODLITE_MPIEXEC) that plays one scripted
run per call: it ends normally, exits with a status, or leaves a rank that "ended without
leaving horovodlite" in the exit watch's folder, as a SIGKILLed rank would.
"""

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from horovodlite.config import HOSTS_UPDATED_EXIT_CODE
from horovodlite.run import main
from horovodlite.run.elastic import newest_commit
from horovodlite.run.elastic_setup import (
    DEFAULT_MAX_RESTARTS,
    DiscoveryError,
    check_options,
    discover_hosts,
    parse_discovery_output,
    place,
    rank_hosts,
)
from horovodlite.run.hosts import Host
from horovodlite.training.commit_store import CommitStore, commit_folder


def _script(path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# -- flags --------------------------------------------------------------------------------------


def test_defaults_fill_in_from_np():
    options = check_options(2, None, None)
    assert (options.np, options.min_np, options.max_np) == (2, 2, 2)
    assert options.max_restarts == DEFAULT_MAX_RESTARTS
    options = check_options(None, 2, 4)
    assert (options.np, options.min_np, options.max_np) == (2, 2, 4)
    assert check_options(None, None, 3).np == 3


@pytest.mark.parametrize(
    "args, message",
    [
        ((2, 3, 2), "--min-np 3 is above --max-np 2"),
        ((1, 2, 4), r"-np 1 is outside \[--min-np 2, --max-np 4\]"),
        ((5, 2, 4), r"-np 5 is outside \[--min-np 2, --max-np 4\]"),
        ((2, 0, 4), "--min-np must be at least 1, got 0"),
        ((4, None, 2), r"-np 4 is outside \[--min-np 2, --max-np 2\]"),
        ((1, 3, None), r"-np 1 is outside \[--min-np 3, --max-np 3\]"),
        ((None, None, None), "need -np, --min-np or --max-np"),
    ],
)
def test_bad_bounds(args, message):
    with pytest.raises(ValueError, match=message):
        check_options(*args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_restarts": -1}, "--max-restarts must be 0 or more"),
        ({"restart_delay": -1.0}, "--restart-delay must be a finite number"),
        ({"discovery_interval": 0.0}, "--discovery-interval must be a finite number"),
        ({"elastic_timeout": float("inf")}, "--elastic-timeout must be a finite number"),
    ],
)
def test_bad_counts_and_times(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_options(2, 1, 3, **kwargs)


def test_discovery_script_must_exist_and_be_executable(tmp_path):
    with pytest.raises(DiscoveryError, match="does not exist"):
        check_options(2, 1, 3, discovery_script=str(tmp_path / "nope.sh"))
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho localhost:2\n")
    with pytest.raises(DiscoveryError, match="is not executable: chmod \\+x"):
        check_options(2, 1, 3, discovery_script=str(plain))
    with pytest.raises(DiscoveryError, match="is a folder"):
        check_options(2, 1, 3, discovery_script=str(tmp_path))


# -- discovery ----------------------------------------------------------------------------------


def test_discovery_format():
    text = "node1:4\n\n  node2  \n10.0.0.7:2\n[fd00::1]:3\n"
    assert parse_discovery_output(text) == [
        Host("node1", 4), Host("node2", 1), Host("10.0.0.7", 2), Host("fd00::1", 3),
    ]  # fmt: skip
    assert parse_discovery_output("") == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("node1:4\nnode2:x\n", r"'node2:x' on line 2 .*slots must be a positive integer"),
        ("node1:0\n", "slots must be a positive integer, got '0'"),
        ("node1 slots=2\n", "no spaces in an entry"),
        ("bad_host!:2\n", "is not a host name"),
        ("node1:2\nnode1:3\n", "lists node1 more than once"),
    ],
)
def test_malformed_discovery_lines(text, message):
    with pytest.raises(DiscoveryError, match=message):
        parse_discovery_output(text, "disc.sh")


def test_discover_runs_the_script(tmp_path):
    good = _script(tmp_path / "good.sh", "echo node1:2; echo node2\n")
    assert discover_hosts(good) == [Host("node1", 2), Host("node2", 1)]
    failing = _script(tmp_path / "failing.sh", "echo 'inventory down' >&2; exit 3\n")
    with pytest.raises(DiscoveryError, match="failed with exit status 3: inventory down"):
        discover_hosts(failing)
    slow = _script(tmp_path / "slow.sh", "sleep 10\n")
    with pytest.raises(DiscoveryError, match="ran past 0.5 s"):
        discover_hosts(slow, timeout=0.5)


def test_place_fills_hosts_in_order():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 4)]
    assert place(hosts, 3) == [Host("a", 2), Host("b", 1)]
    assert place(hosts, 8) == hosts
    assert place(hosts, 1) == [Host("a", 1)]
    assert rank_hosts(place(hosts, 5)) == ["a", "a", "b", "b", "c"]


# -- commits on disk ----------------------------------------------------------------------------


def test_newest_commit_reads_the_workers_layout(tmp_path):
    assert newest_commit(str(tmp_path / "job")) is None
    for rank in (0, 1):
        store = CommitStore(commit_folder(str(tmp_path), "job", rank))
        store.write(3, b"three")
        store.write(4, b"four")
    assert newest_commit(str(tmp_path / "job")) == 4
    # Commit 5 cut short on rank 1 (a crash mid-write after the rename) is not the newest.
    store = CommitStore(commit_folder(str(tmp_path), "job", 1))
    with open(store.path(5), "wb") as f:
        f.write(b"HVDLITE-COMMIT\x01 cut")
    assert newest_commit(str(tmp_path / "job")) == 4


# -- the command line, before anything runs ----------------------------------------------------


def _main(capsys, *argv) -> tuple:
    status = main(list(argv))
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-np", "2", "--min-np", "3", "--max-np", "2"], "--min-np 3 is above --max-np 2"),
        (["-np", "5", "--min-np", "2", "--max-np", "4"], "-np 5 is outside"),
        (["-np", "2", "--max-restarts", "-1"], "--max-restarts must be 0 or more"),
        (["-np", "2", "--host-discovery-script", "/nonexistent/disc.sh"], "does not exist"),
        (["-np", "2", "-H", "a:2", "--host-discovery-script", "/bin/true"],
         "replaces -H/--hostfile"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_naming_the_problem(capsys, argv, message):
    status, err = _main(capsys, *argv, sys.executable, "-c", "pass")
    assert status == 2, err
    assert "horovodlite-run: error:" in err and message in err, err


def test_failing_or_malformed_discovery_at_start_exits_2(capsys, tmp_path):
    failing = _script(tmp_path / "failing.sh", "echo 'no inventory' >&2; exit 4\n")
    status, err = _main(capsys, "-np", "2", "--host-discovery-script", failing, "true")
    assert status == 2 and "failed with exit status 4: no inventory" in err, err
    malformed = _script(tmp_path / "malformed.sh", "echo 'node1 slots=2'\n")
    status, err = _main(capsys, "-np", "2", "--host-discovery-script", malformed, "true")
    assert status == 2 and "'node1 slots=2' on line 1" in err, err


def test_too_few_slots_at_start_exits_1(capsys, tmp_path):
    one = _script(tmp_path / "one.sh", "echo localhost:1\n")
    status, err = _main(capsys, "-np", "2", "--min-np", "2", "--host-discovery-script", one,
                        "--elastic-timeout", "0.3", "--discovery-interval", "0.1",
                        "true")  # fmt: skip
    assert status == 1, err
    assert "1 slot(s) available (localhost:1), fewer than --min-np 2" in err, err
    assert "after waiting 0.3 s (--elastic-timeout)" in err, err


# -- the restart loop against a fake mpiexec ----------------------------------------------------

FAKE_MPIEXEC = """\
#!{python}
# Plays the next line of $FAKE_PLAN: "ok", "exit N", "sleep" (60 s), "run [commit]" (below), or
# "die R[,R...]" (ranks R
# end without leaving horovodlite, as SIGKILLed ranks would: their pids in the exit watch's
# folder, no leave marks).
import os, socket, subprocess, sys, time
if sys.argv[1:] == ["--version"]:
    print("HYDRA build details:")
    sys.exit(0)
plan = os.environ["FAKE_PLAN"]
calls = open(plan + ".calls", "a+")
calls.seek(0)
run = len(calls.read().splitlines())
argv = sys.argv[1:]
hosts = argv[argv.index("-hosts") + 1]
np = argv[argv.index("-n") + 1]
calls.write(f"n={{np}} hosts={{hosts}} restart={{os.environ['HOROVODLITE_ELASTIC_RESTART']}} "
            f"job={{os.environ['HOROVODLITE_ELASTIC_JOB_ID']}}\\n")
calls.close()
steps = open(plan).read().split("\\n")
step = steps[run] if run < len(steps) else "ok"
if step.startswith("exit"):
    sys.exit(int(step.split()[1]))
if step == "sleep":
    time.sleep(60)
if step.startswith("run"):  # "run [commit]": maybe commit, then run 1.5 s; leave 75 on news
    if step.endswith("commit"):
        from horovodlite.training.commit_store import CommitStore, commit_folder
        CommitStore(commit_folder(os.environ["HOROVODLITE_ELASTIC_DIR"],
                                  os.environ["HOROVODLITE_ELASTIC_JOB_ID"], 0)).write(1, b"1")
    hosts = os.environ["HOROVODLITE_ELASTIC_HOSTS_FILE"]
    first = open(hosts).read()
    time.sleep(1.5)
    sys.exit(75 if open(hosts).read() != first else 0)
if step.startswith("die"):
    for rank in step.split()[1].split(","):
        gone = subprocess.Popen(["true"])
        gone.wait()
        folder = os.environ["HOROVODLITE_EXIT_REPORT_DIR"]
        with open(os.path.join(folder, "rank-" + rank), "w") as f:
            f.write(f"{{gone.pid}} {{socket.gethostname()}}\\n")
    time.sleep(0.3)  # a real rank notes its pid at init(), long before it dies: let the watch look
    sys.exit(9)
"""


@pytest.fixture
def fake_mpiexec(tmp_path, monkeypatch):
    """Return a function that sets the plan of the fake mpiexec and returns its calls file."""
    path = tmp_path / "mpiexec"
    path.write_text(FAKE_MPIEXEC.format(python=sys.executable))
    path.chmod(0o755)
    monkeypatch.setenv("HOROVODLITE_MPIEXEC", str(path))
    monkeypatch.setenv("HOROVODLITE_ELASTIC_DIR", str(tmp_path / "commits"))
    monkeypatch.delenv("HOROVODLITE_ELASTIC_JOB_ID", raising=False)

    def plan(*steps) -> str:
        (tmp_path / "plan").write_text("\n".join(steps))
        monkeypatch.setenv("FAKE_PLAN", str(tmp_path / "plan"))
        return str(tmp_path / "plan.calls")

    return plan


def _calls(path: str) -> list:
    return open(path).read().splitlines()


def test_restart_after_a_failure_then_finish(capsys, fake_mpiexec):
    calls = fake_mpiexec("die 1", "ok")
    status, err = _main(capsys, "-np", "2", "--min-np", "1", "--max-np", "3",
                        "--restart-delay", "0", "true")  # fmt: skip
    assert status == 0, err
    runs = _calls(calls)
    assert [r.split(" job=")[0] for r in runs] == [
        "n=2 hosts=localhost:2 restart=0", "n=3 hosts=localhost:3 restart=1",
    ]  # fmt: skip
    assert len({r.split(" job=")[1] for r in runs}) == 1, "the job id changed across a restart"
    assert "restart 1 (rank 1 on localhost ended without leaving horovodlite, mpiexec " in err
    assert "failure 1 of 3 allowed): 3 workers on localhost:3, resuming from no commit yet" in err
    assert "finished after 1 restart(s)" in err


def test_restarts_exhausted_keep_the_last_commit(capsys, fake_mpiexec, tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVODLITE_ELASTIC_JOB_ID", "kept")
    store = CommitStore(commit_folder(str(tmp_path / "commits"), "kept", 0))
    store.write(5, b"five")
    calls = fake_mpiexec("exit 1", "exit 1", "exit 1", "exit 1")
    status, err = _main(capsys, "-np", "2", "--max-restarts", "2", "--restart-delay", "0",
                        "true")  # fmt: skip
    assert status == 1, err
    assert f"the last commit (commit 5) is kept in {tmp_path / 'commits' / 'kept'}" in err, err
    assert store.read(5) == b"five"
    assert len(_calls(calls)) == 3
    assert "giving up: the job failed 3 times, more than --max-restarts 2 allows" in err, err
    assert "(last: the job exited with status 1)" in err


def test_exit_75_unannounced_is_a_failure(capsys, fake_mpiexec):
    calls = fake_mpiexec(f"exit {HOSTS_UPDATED_EXIT_CODE}", "ok")
    status, err = _main(capsys, "-np", "2", "--restart-delay", "0", "true")
    assert status == 0 and len(_calls(calls)) == 2, err
    assert "the launcher had not announced new hosts; failure 1 of 3 allowed" in err, err


def test_a_host_that_fails_twice_in_a_row_is_excluded(capsys, fake_mpiexec, tmp_path):
    # Ranks 0-1 run on a, 2-3 on b. Rank 3 (on b) dies twice: b is dropped, the job shrinks to a.
    calls = fake_mpiexec("die 3", "die 3", "ok")
    status, err = _main(capsys, "-np", "4", "--min-np", "2", "--max-np", "4", "-H", "a:2,b:2",
                        "--skip-host-check", "--restart-delay", "0", "true")  # fmt: skip
    assert status == 0, err
    hosts = [r.split(" restart=")[0] for r in _calls(calls)]
    assert hosts == ["n=4 hosts=a:2,b:2", "n=4 hosts=a:2,b:2", "n=2 hosts=a:2"], err
    assert "host b excluded: its workers failed in 2 runs in a row" in err


def test_ranks_named_on_several_hosts_blame_none(capsys, fake_mpiexec):
    # The watch saw rank 1 (on a) and rank 2 (on b) end in one look: which came first is
    # unknown, so neither host counts a failure.
    calls = fake_mpiexec("die 1,2", "die 1,2", "ok")
    status, err = _main(capsys, "-H", "a:2,b:2", "--min-np", "2", "--skip-host-check",
                        "--restart-delay", "0", "true")  # fmt: skip
    assert status == 0, err
    assert [r.split(" restart=")[0] for r in _calls(calls)] == ["n=4 hosts=a:2,b:2"] * 3, err
    assert "rank 1 on a, rank 2 on b ended without leaving horovodlite" in err, err
    assert "excluded" not in err


def test_exclusion_below_min_np_gives_up(capsys, fake_mpiexec):
    calls = fake_mpiexec("die 2", "die 2", "ok")
    status, err = _main(capsys, "-np", "4", "--min-np", "3", "-H", "a:2,b:2", "--skip-host-check",
                        "--restart-delay", "0", "--elastic-timeout", "0", "true")  # fmt: skip
    assert status == 1 and len(_calls(calls)) == 2, err
    assert "2 slot(s) available (a:2), fewer than --min-np 3" in err, err
    assert "excluded after failing 2 runs in a row: b" in err, err


def test_the_only_host_is_never_excluded(capsys, fake_mpiexec):
    calls = fake_mpiexec("die 0", "die 0", "die 0", "ok")
    status, err = _main(capsys, "-np", "2", "--restart-delay", "0", "true")
    assert status == 0 and len(_calls(calls)) == 4, err
    assert "excluded" not in err


def test_resumed_commit_is_logged(capsys, fake_mpiexec, tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVODLITE_ELASTIC_JOB_ID", "fixed-job")
    CommitStore(commit_folder(str(tmp_path / "commits"), "fixed-job", 0)).write(7, b"x")
    calls = fake_mpiexec("exit 1", "ok")
    status, err = _main(capsys, "-np", "2", "--restart-delay", "0", "true")
    assert status == 0, err
    assert all(r.endswith("job=fixed-job") for r in _calls(calls))
    assert "resuming from commit 7" in err, err
    assert os.path.exists(CommitStore(commit_folder(str(tmp_path / "commits"), "fixed-job",
                                                    0)).path(7))  # fmt: skip


def test_without_elastic_flags_nothing_elastic_reaches_the_ranks(capfd, fake_mpiexec):
    # The fake mpiexec reads HOROVODLITE_ELASTIC_RESTART: a plain launch does not set it.
    fake_mpiexec("ok")
    status, err = _main(capfd, "-np", "2", "true")
    assert status == 1 and "KeyError: 'HOROVODLITE_ELASTIC_RESTART'" in err, err


def test_sigterm_stops_the_job_without_a_restart(fake_mpiexec):
    calls = fake_mpiexec("sleep", "ok")
    argv = [sys.executable, "-m", "horovodlite.run", "-np", "2", "--restart-delay", "0", "true"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(calls) and _calls(calls)) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by signal 15: no restart" in err, err
    assert len(_calls(calls)) == 1


def _growing(tmp_path, capsys, *steps, discovery=("localhost:2", "localhost:3")) -> tuple:
    calls_file = tmp_path / "discovery-calls"
    lines = "".join(f"  {k}) echo '{text}' ;;\n" for k, text in enumerate(discovery[:-1]))
    script = _script(tmp_path / "grow.sh", f"""\
        n=$(cat {calls_file} 2>/dev/null || echo 0); echo $((n + 1)) > {calls_file}
        case "$n" in
        {lines}  *) echo '{discovery[-1]}' ;;
        esac
        """)  # fmt: skip
    return _main(capsys, "-np", "2", "--max-np", "3", "--host-discovery-script", script,
                 "--discovery-interval", "0.1", "--restart-delay", "0", "true")  # fmt: skip


def test_new_slots_are_announced_after_a_commit_and_the_job_grows(capsys, fake_mpiexec, tmp_path):
    calls = fake_mpiexec("run commit", "ok")
    status, err = _growing(tmp_path, capsys)
    assert status == 0, err
    assert [r.split(" job=")[0] for r in _calls(calls)] == [
        "n=2 hosts=localhost:2 restart=0", "n=3 hosts=localhost:3 restart=1",
    ], err  # fmt: skip
    assert "discovery shows 3 usable slots (localhost:3), the job uses 2: hosts file set to 1" in (
        err
    )  # fmt: skip
    assert "restart 1 (hosts added; not counted): 3 workers on localhost:3, resuming from " \
        "commit 1" in err  # fmt: skip


def test_no_announcement_before_the_run_commits(capsys, fake_mpiexec, tmp_path):
    calls = fake_mpiexec("run")
    status, err = _growing(tmp_path, capsys)
    assert status == 0 and len(_calls(calls)) == 1, err
    assert "hosts file set" not in err


def test_a_bad_discovery_run_while_running_is_a_warning(capsys, fake_mpiexec, tmp_path):
    calls = fake_mpiexec("run commit")
    status, err = _growing(tmp_path, capsys, discovery=("localhost:2", "localhost slots=3"))
    assert status == 0 and len(_calls(calls)) == 1, err
    assert err.count("warning: ") == 1, err
    assert "'localhost slots=3' on line 1" in err and "(the job goes on)" in err, err
