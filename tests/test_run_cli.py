"""horovodlite-run: host lists, hostfiles, slot checks, launcher command lines for MPICH's Hydra
and Open MPI (detection faked), error exits, --check-build, and real launches on this machine."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import horovodlite
from horovodlite.run import LaunchError, cli, main
from horovodlite.run import check_build as check_build_module
from horovodlite.run.hosts import (
    Host,
    check_reachable,
    check_slots,
    hosts_argument,
    is_local,
    launcher_hosts,
    parse_hostfile,
    parse_hosts,
)
from horovodlite.run.mpi_launcher import (
    HYDRA,
    OPEN_MPI,
    build_command,
    find_mpiexec,
    flavour_of,
    settings_env,
)

HYDRA_VERSION = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
"""
OPEN_MPI_4_VERSION = "mpirun (Open MPI) 4.1.6\n\nReport bugs to http://www.open-mpi.org/\n"
OPEN_MPI_5_VERSION = "mpirun (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/\n"
FAKE_MPIEXEC = "/opt/mpi/bin/mpiexec"
SCRIPT = os.path.join(os.path.dirname(sys.executable), "horovodlite-run")


# -- host lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("host1:2,host2:2", [Host("host1", 2), Host("host2", 2)]),
        ("localhost:4", [Host("localhost", 4)]),
        (" a:1 , b.example.com:16 ", [Host("a", 1), Host("b.example.com", 16)]),
        ("node-07", [Host("node-07", 1)]),
        ("10.0.0.5:3,10.0.0.6", [Host("10.0.0.5", 3), Host("10.0.0.6", 1)]),
        ("[fd00::1]:2,[fd00::2]", [Host("fd00::1", 2), Host("fd00::2", 1)]),
    ],
)
def test_parse_hosts(text, expected):
    assert parse_hosts(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "host list is empty"),
        ("a:2,,b:2", "empty entry"),
        ("a:2,", "empty entry"),
        ("a:", "slots must be a positive integer, got ''"),
        ("a:0", "slots must be a positive integer, got '0'"),
        ("a:-1", "slots must be a positive integer"),
        ("a:two", "slots must be a positive integer, got 'two'"),
        (":2", "no host name"),
        ("bad host:2", "'bad host' is not a host name"),
        ("bad!:2", "'bad!' is not a host name"),
        ("-rf:2", "'-rf' is not a host name"),
        ("a:2,a:1", "host 'a' is listed twice"),
        ("[fd00::1:2", "without closing it"),
        ("[nothex]:2", "is not an IPv6 address"),
        ("localhost:99999999999999999999", "slots must be at most 65536"),
    ],
)
def test_parse_hosts_rejects_malformed(text, message):
    with pytest.raises(ValueError, match="-H") as info:
        parse_hosts(text)
    assert message in str(info.value)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_launcher_hosts_map_local_ipv6_and_refuse_remote_ipv6():
    assert launcher_hosts([Host("::1", 2), Host("node1", 1)]) == [
        Host("localhost", 2), Host("node1", 1)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="cannot take IPv6 addresses.*give the host's name"):
        launcher_hosts([Host("fd00::7", 2)])
    with pytest.raises(ValueError, match="'localhost' is listed twice"):
        launcher_hosts([Host("::1", 1), Host("localhost", 1)])


def test_hostfile_both_syntaxes_and_comments(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(
        "# training nodes\n\nnode1 slots=4\nnode2:2   # MPICH style\nnode3\n"
        "node4 slots=2 max_slots=8\n"
    )
    assert parse_hostfile(str(path)) == [
        Host("node1", 4), Host("node2", 2), Host("node3", 1), Host("node4", 2),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "content, message",
    [
        ("node1 slots=4\nnode2 slots=x\n", ":2: slots must be a positive integer, got 'x'"),
        ("node1 cores=4\n", ":1: unexpected 'cores=4'"),
        ("node1\nnode1 slots=2\n", "host 'node1' is listed twice"),
        ("# nothing\n\n", "lists no host"),
        ("node1\nbad!name\n", ":2: 'bad!name' is not a host name"),
    ],
)
def test_hostfile_rejects_malformed(tmp_path, content, message):
    path = tmp_path / "hosts"
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        parse_hostfile(str(path))
    assert message in str(info.value)


def test_check_slots():
    hosts = parse_hosts("a:2,b:2")
    check_slots(hosts, 4)
    check_slots(hosts, 1)
    with pytest.raises(ValueError, match=r"-np 5 needs 5 slots, but the hosts offer 4 \(a:2,b:2\)"):
        check_slots(hosts, 5)
    with pytest.raises(ValueError, match="-np must be at least 1, got 0"):
        check_slots(hosts, 0)


def test_hosts_argument():
    assert hosts_argument(parse_hosts("a:2,b,[fd00::1]:3")) == "a:2,b:1,fd00::1:3"


def test_is_local_binds_without_sending():
    assert is_local("localhost")
    assert is_local("127.0.0.1")
    assert is_local(socket.gethostname())
    assert not is_local("198.51.100.7")  # TEST-NET-2: not an address of this machine


def test_unreachable_hosts_are_named(monkeypatch):
    probed = []

    def probe(name, timeout):
        probed.append(name)
        return "ssh: connect to host b port 22: Connection refused" if name == "b" else None

    monkeypatch.setattr("horovodlite.run.hosts.is_local", lambda name: name == "localhost")
    check_reachable(parse_hosts("localhost:2,a:2"), probe=probe)
    with pytest.raises(LaunchError) as info:
        check_reachable(parse_hosts("localhost:2,a:2,b:2"), probe=probe)
    lines = str(info.value).splitlines()
    assert lines[:2] == [
        "unreachable host(s):",
        "  b: ssh: connect to host b port 22: Connection refused",
    ]
    assert "passwordless ssh" in lines[2]
    assert sorted(probed) == ["a", "a", "b"]  # local hosts are not probed


def test_unresolvable_host(monkeypatch):
    def no_dns(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(LaunchError, match="cannot resolve host 'nowhere'"):
        check_reachable(parse_hosts("nowhere:2"), probe=lambda name, timeout: None)


# -- launcher detection and command lines -------------------------------------------------------


@pytest.mark.parametrize(
    "text, flavour",
    [(HYDRA_VERSION, HYDRA), (OPEN_MPI_4_VERSION, OPEN_MPI), (OPEN_MPI_5_VERSION, OPEN_MPI)],
)
def test_flavour_of(text, flavour):
    assert flavour_of(text) == flavour


@pytest.mark.parametrize("text", ["", "srun: slurm 23.02\n"])
def test_flavour_of_unknown(text):
    with pytest.raises(LaunchError, match="unknown MPI launcher"):
        flavour_of(text)


def test_hydra_command():
    argv = build_command(
        HYDRA, FAKE_MPIEXEC, 4, parse_hosts("h1:2,h2:2"), ["python", "train.py", "--lr", "0.1"],
        {"HOROVODLITE_CYCLE_TIME": "5"}, ["-launcher", "ssh"],
    )  # fmt: skip
    assert argv == [
        FAKE_MPIEXEC, "-n", "4", "-hosts", "h1:2,h2:2", "-genv", "HOROVODLITE_CYCLE_TIME", "5",
        "-launcher", "ssh", "python", "train.py", "--lr", "0.1",
    ]  # fmt: skip


def test_open_mpi_command(monkeypatch):
    monkeypatch.setenv("PATH", "/venv/bin:/usr/bin")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    argv = build_command(
        OPEN_MPI, "/usr/bin/mpirun", 3, parse_hosts("h1:2,h2:1"), ["python", "train.py"],
        {"HOROVODLITE_TIMELINE": "/tmp/a b.json"}, ["--mca", "btl", "tcp,self"], as_root=True,
    )  # fmt: skip
    assert argv == [
        "/usr/bin/mpirun", "--allow-run-as-root", "-np", "3", "-H", "h1:2,h2:1",
        "--bind-to", "none", "--map-by", "slot", "-x", "HOROVODLITE_TIMELINE=/tmp/a b.json",
        "-x", "PATH", "--mca", "btl", "tcp,self", "python", "train.py",
    ]  # fmt: skip
    argv = build_command(OPEN_MPI, "mpirun", 1, parse_hosts("h1"), ["x"], as_root=False)
    assert "--allow-run-as-root" not in argv


def test_build_command_rejects_empty_command_and_unknown_flavour():
    with pytest.raises(ValueError, match="no command to run"):
        build_command(HYDRA, FAKE_MPIEXEC, 1, parse_hosts("a"), [])
    with pytest.raises(ValueError, match="unknown MPI flavour 'slurm'"):
        build_command("slurm", FAKE_MPIEXEC, 1, parse_hosts("a"), ["x"])


def test_settings_env(tmp_path):
    env = settings_env(64, 2.5, str(tmp_path / "t.json"), 30)
    assert env == {
        "HOROVODLITE_FUSION_THRESHOLD": str(64 * 1024 * 1024),
        "HOROVODLITE_CYCLE_TIME": "2.5",
        "HOROVODLITE_TIMELINE": str(tmp_path / "t.json"),
        "HOROVODLITE_STALL_CHECK_TIME_SECONDS": "30",
    }
    assert settings_env(0.5) == {"HOROVODLITE_FUSION_THRESHOLD": str(512 * 1024)}
    assert settings_env() == {}
    with pytest.raises(ValueError, match="--cycle-time-ms must be a non-negative number"):
        settings_env(cycle_time_ms=-1)
    with pytest.raises(ValueError, match="--fusion-threshold-mb"):
        settings_env(fusion_threshold_mb=float("nan"))
    with pytest.raises(ValueError, match="--cycle-time-ms must be a non-negative number, got inf"):
        settings_env(cycle_time_ms=float("inf"))
    with pytest.raises(ValueError, match="--fusion-threshold-mb"):
        settings_env(fusion_threshold_mb=float("inf"))


# -- main() with the launcher faked -------------------------------------------------------------


@pytest.fixture
def fake_launcher(monkeypatch):
    """Fake mpiexec detection and execution; record what main() would run."""
    launched = {}

    def execute(argv, env):
        launched["argv"], launched["env"] = argv, env
        return 0

    def use(flavour):
        monkeypatch.setattr(cli, "find_mpiexec", lambda: FAKE_MPIEXEC)
        monkeypatch.setattr(cli, "detect_flavour", lambda mpiexec: flavour)
        monkeypatch.setattr(cli, "execute", execute)
        monkeypatch.setattr(
            cli, "check_reachable", lambda hosts: launched.setdefault("checked", hosts)
        )
        return launched

    return use


@pytest.mark.parametrize("flavour", [HYDRA, OPEN_MPI])
def test_main_builds_the_flavours_command(fake_launcher, flavour, tmp_path):
    launched = fake_launcher(flavour)
    command = ["python", "-c", "print('a b'); $HOME; `x`", ";", "rm", "-rf", "/"]
    timeline = str(tmp_path / "timeline.json")
    rc = main(["-np", "4", "-H", "h1:2,h2:2", "--mpi-args=-v --flag 'two words'",
               "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5", "--timeline-filename",
               timeline, "--stall-check-time", "120", *command])  # fmt: skip
    assert rc == 0
    settings = {
        "HOROVODLITE_FUSION_THRESHOLD": str(32 * 1024 * 1024),
        "HOROVODLITE_CYCLE_TIME": "3.5",
        "HOROVODLITE_TIMELINE": timeline,
        "HOROVODLITE_STALL_CHECK_TIME_SECONDS": "120",
    }
    expected = build_command(
        flavour, FAKE_MPIEXEC, 4, parse_hosts("h1:2,h2:2"), command, settings,
        ["-v", "--flag", "two words"],
    )  # fmt: skip
    assert launched["argv"] == expected
    assert launched["argv"][-len(command) :] == command  # verbatim: no shell anywhere
    for name, value in settings.items():
        assert launched["env"][name] == value
    assert launched["checked"] == parse_hosts("h1:2,h2:2")


def test_main_defaults(fake_launcher, tmp_path):
    launched = fake_launcher(HYDRA)
    assert main(["-np", "3", "python", "x.py"]) == 0
    assert launched["argv"] == [FAKE_MPIEXEC, "-n", "3", "-hosts", "localhost:3", "python", "x.py"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=3\n")
    assert main(["--hostfile", str(hostfile), "--skip-host-check", "python", "x.py"]) == 0
    assert launched["argv"][:5] == [FAKE_MPIEXEC, "-n", "5", "-hosts", "a:2,b:3"]
    assert "checked" in launched  # only the first launch was checked
    launched.clear()
    assert main(["-H", "a:2", "--skip-host-check", "python", "x.py"]) == 0
    assert "checked" not in launched and launched["argv"][2] == "2"


def test_main_verbose_prints_the_command(fake_launcher, capsys):
    fake_launcher(OPEN_MPI)
    assert main(["--verbose", "-np", "2", "--cycle-time-ms", "7", "python", "a b.py"]) == 0
    err = capsys.readouterr().err
    assert "HOROVODLITE_CYCLE_TIME=7" in err
    assert "'a b.py'" in err and "Open MPI" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["-np", "5", "-H", "a:2,b:2", "python"], "-np 5 needs 5 slots, but the hosts offer 4"),
        (["-np", "2", "-H", "a:2,,b", "python"], "empty entry"),
        (["-np", "0", "python"], "-np must be at least 1, got 0"),
        (["python", "train.py"], "give -np N"),
        (["-np", "2", "--hostfile", "/nonexistent/hosts", "python"], "/nonexistent/hosts"),
        (["-np", "2", "--mpi-args=-x 'unclosed", "python"], "--mpi-args"),
        (["-np", "2", "--fusion-threshold-mb", "-1", "python"], "--fusion-threshold-mb"),
        (["-np", "2", "--simulated-hosts", "two", "python"], "expected K[:RATE[:DELAY]]"),
        (["--simulated-hosts", "2", "python"], "--simulated-hosts needs -np"),
    ],
)
def test_main_usage_errors_exit_2(fake_launcher, capsys, args, message):
    launched = fake_launcher(HYDRA)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("horovodlite-run: error: ") and message in err, err
    assert "argv" not in launched


def test_main_without_command_or_with_two_host_sources(capsys):
    with pytest.raises(SystemExit) as info:
        main(["-np", "2"])
    assert info.value.code == 2 and "no command to run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["-np", "2", "-H", "a:2", "--hostfile", "f", "python"])
    assert info.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_main_unreachable_host_exits_1(fake_launcher, monkeypatch, capsys):
    fake_launcher(HYDRA)
    monkeypatch.setattr(
        cli, "check_reachable",
        lambda hosts: check_reachable(hosts, probe=lambda name, t: "Connection timed out"),
    )  # fmt: skip
    monkeypatch.setattr("horovodlite.run.hosts.is_local", lambda name: name == "localhost")
    assert main(["-np", "2", "-H", "localhost:1,gpu7:1", "python"]) == 1
    err = capsys.readouterr().err
    assert "unreachable host(s):\n  gpu7: Connection timed out" in err


def test_simulated_hosts_where_impossible_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(
        "horovodlite.run.simcluster.unavailable_reason", lambda: "the simulated cluster needs root"
    )
    assert main(["-np", "2", "--simulated-hosts", "2", "python", "x.py"]) == 1
    assert "horovodlite-run: error: the simulated cluster needs root" in capsys.readouterr().err


def test_missing_mpiexec_exits_1(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("HOROVODLITE_MPIEXEC", raising=False)
    with pytest.raises(LaunchError, match="no mpiexec or mpirun found"):
        find_mpiexec()
    assert main(["-np", "2", "python", "x.py"]) == 1
    err = capsys.readouterr().err
    assert "no mpiexec or mpirun found" in err and "pip install 'horovodlite[mpich]'" in err
    monkeypatch.setenv("HOROVODLITE_MPIEXEC", str(tmp_path / "my-mpiexec"))
    assert main(["-np", "2", "python", "x.py"]) == 1
    assert "HOROVODLITE_MPIEXEC=" in capsys.readouterr().err


def test_check_build_report(monkeypatch):
    fake = {"torch": (True, "2.3.0"), "tensorflow": (False, "ModuleNotFoundError: no"),
            "keras": (False, "ModuleNotFoundError: no"), "cupy": (True, "13.0.0"),
            "pytorch_lightning": (True, "2.6.6")}  # fmt: skip
    monkeypatch.setattr(check_build_module, "_importable", lambda module: fake[module])
    report = check_build_module.build_report()
    assert report.startswith(f"horovodlite v{horovodlite.__version__}:")
    from mpi4py import MPI

    assert MPI.Get_library_version().split()[0] in report  # "MPICH" or "Open"
    assert f"CUDA-aware MPI:  {'yes' if horovodlite.cuda_aware_mpi() else 'no'}" in report
    assert "    [X] torch (2.3.0)" in report and "    [ ] tensorflow (" in report
    assert "    [ ] keras (" in report and "    [X] cupy (13.0.0)" in report
    assert "    [X] pytorch_lightning (2.6.6)" in report


# -- real launches on this machine --------------------------------------------------------------


def _run(argv, timeout, **kwargs):
    """Run argv in its own process group; kill the whole group if it outlives `timeout`."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        **kwargs,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} hung for {timeout} s:\n{out}\n{err}")
    return proc.returncode, out, err


def test_check_build_command():
    rc, out, err = _run([sys.executable, "-m", "horovodlite.run", "--check-build"], 120)
    assert rc == 0, err
    assert f"horovodlite v{horovodlite.__version__}:" in out
    assert "MPI library:" in out and "Launcher:" in out and "CUDA-aware MPI:" in out
    for module in ("torch", "tensorflow", "keras", "cupy"):
        assert f"] {module} (" in out


# Each rank writes its own report: the launcher interleaves the ranks' stdout mid-line.
RANK_REPORT = (
    "import json, os, sys, numpy as np, horovodlite as hvd; hvd.init(); "
    "report = {'rank': hvd.rank(), 'size': hvd.size(), 'argv': sys.argv[2:], "
    "'sum': hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum).tolist(), "
    "'env': {k: v for k, v in os.environ.items() if k.startswith('HOROVODLITE_')}}; "
    "open(os.path.join(sys.argv[1], f'{hvd.rank()}.json'), 'w').write(json.dumps(report))"
)


def read_reports(directory) -> list:
    """Return the ranks' reports, in rank order."""
    reports = [json.loads(p.read_text()) for p in directory.glob("*.json")]
    return sorted(reports, key=lambda r: r["rank"])


@pytest.mark.mpi
def test_end_to_end_on_localhost(tmp_path):
    timeline = str(tmp_path / "timeline.json")
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    rc, out, err = _run(
        [SCRIPT, "-np", "2", "--fusion-threshold-mb", "4", "--cycle-time-ms", "2",
         "--timeline-filename", timeline, "--stall-check-time", "30",
         sys.executable, "-c", RANK_REPORT, str(reports_dir), "two words", "$HOME"],
        120,
    )  # fmt: skip
    assert rc == 0, f"{out}\n{err}"
    reports = read_reports(reports_dir)
    assert [r["rank"] for r in reports] == [0, 1] and {r["size"] for r in reports} == {2}
    for report in reports:
        assert report["sum"] == [3.0, 3.0, 3.0]
        assert report["argv"] == ["two words", "$HOME"]
        env = report["env"]
        assert env["HOROVODLITE_FUSION_THRESHOLD"] == str(4 * 1024 * 1024)
        assert env["HOROVODLITE_CYCLE_TIME"] == "2"
        assert env["HOROVODLITE_TIMELINE"] == timeline
        assert env["HOROVODLITE_STALL_CHECK_TIME_SECONDS"] == "30"


@pytest.mark.mpi
@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_ipv6_loopback_host_runs(tmp_path):
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    rc, out, err = _run(
        [SCRIPT, "-np", "2", "-H", "[::1]:2", sys.executable, "-c", RANK_REPORT,
         str(reports_dir)],
        120,
    )  # fmt: skip
    assert rc == 0, f"{out}\n{err}"
    assert [r["rank"] for r in read_reports(reports_dir)] == [0, 1]


@pytest.mark.mpi
def test_exit_status_of_a_failing_rank_is_returned():
    rc, out, err = _run(
        [sys.executable, "-m", "horovodlite.run", "-np", "2", sys.executable, "-c",
         "import sys; sys.exit(3)"],
        60,
    )  # fmt: skip
    assert rc == 3, f"{out}\n{err}"


@pytest.mark.mpi
def test_sigterm_stops_the_whole_job():
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovodlite.run", "-np", "2", sys.executable, "-c",
         "import time; print('ready', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        seen = ""
        while seen.count("ready") < 2:  # the ranks' lines may interleave
            line = proc.stdout.readline()
            assert line, f"the job ended before both ranks were ready:\n{seen}"
            seen += line
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        assert rc != 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)  # anything left of the job (mpiexec, ranks)?
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("ranks outlived horovodlite-run after SIGTERM")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
