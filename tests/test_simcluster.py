"""The simulated cluster: hosts as network namespaces on a bridge, jobs across them, cleanup.

Tests marked netns need root and iproute2 (ip, tc); they skip, with the reason, where a network
namespace or a bridge cannot be created.
"""

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile

import pytest

from horovodlite.run import LaunchError
from horovodlite.run.simcluster import (
    PREFIX,
    SimulatedCluster,
    cleanup_stale,
    parse_delay,
    parse_rate,
    unavailable_reason,
)

HERE = os.path.dirname(os.path.abspath(__file__))
MULTIHOST = os.path.join(HERE, "multihost")
ROOT_NETNS = str(os.stat("/proc/self/ns/net").st_ino)


def _names(prefix: str) -> list:
    """Return the namespaces, links and temporary folders whose names start with `prefix`."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in namespaces.splitlines() if line.startswith(prefix)]
    found += [
        line.split(":")[1].strip().split("@")[0]
        for line in links.splitlines()
        if line.split(":")[1].strip().startswith(prefix)
    ]
    found += [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(prefix)]
    return found


def _wait_for_ready(proc, ranks: int) -> None:
    """Read the job's output until `ranks` ranks said 'ready' (lines may interleave)."""
    seen = ""
    while seen.count("ready") < ranks:
        line = proc.stdout.readline()
        assert line, f"the job ended before {ranks} ranks were ready:\n{seen}"
        seen += line


@pytest.fixture(scope="module")
def netns():
    """Skip unless simulated clusters can be built here."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster(netns):
    with SimulatedCluster(hosts=2) as cluster:
        yield cluster


# -- arguments (no root needed) -----------------------------------------------------------------


def test_parse_rate_and_delay():
    assert parse_rate("100mbit") == 100_000_000
    assert parse_rate("1Gbit/s") == 1_000_000_000
    assert parse_rate("1.5gbit") == 1_500_000_000
    assert parse_rate("500kbit") == 500_000
    assert parse_rate(2e9) == 2_000_000_000
    assert parse_rate(None) is None
    assert parse_delay("0.1ms") == 100 and parse_delay("100us") == 100
    assert parse_delay("1s") == 1_000_000 and parse_delay(0.002) == 2000
    for bad in ("100mbps", "fast", "-1mbit", "1 mb"):
        with pytest.raises(ValueError, match="is not a link rate"):
            parse_rate(bad)
    with pytest.raises(ValueError, match="below 8 kbit/s"):
        parse_rate("0")
    with pytest.raises(ValueError, match="is not a time"):
        parse_delay("5 minutes")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hosts": 0}, "hosts must be an integer from 1 to 200"),
        ({"hosts": 2.0}, "hosts must be an integer"),
        ({"hosts": 2, "rate": "lots"}, "is not a link rate"),
        ({"hosts": 2, "delay": "-1ms"}, "is not a time"),
        ({"hosts": 2, "subnet": "8.8.8.0/24"}, "is not private"),
        ({"hosts": 2, "subnet": "127.9.0.0/24"}, "is not private"),
        ({"hosts": 2, "subnet": "10.1.2.3/24"}, "is not an IPv4 network"),
        ({"hosts": 3, "subnet": "10.1.2.0/30"}, "has no room"),
    ],
)
def test_bad_arguments_raise_before_creating_anything(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimulatedCluster(**kwargs)


def test_not_started_cluster_refuses_to_run():
    with pytest.raises(LaunchError, match="not running"):
        SimulatedCluster(2).mpiexec(2, ["true"])


# -- on a cluster -------------------------------------------------------------------------------


def _rank_pytest(cluster, np: int, slots: int, module: str, timeout: float, env=None):
    return cluster.run(
        np,
        [sys.executable, "-m", "mpi4py", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "python_files=multihost_*.py", "--rootdir", MULTIHOST,
         os.path.join(MULTIHOST, module)],
        slots_per_host=slots,
        timeout=timeout,
        env={"HOROVODLITE_TEST_SLOTS_PER_HOST": str(slots),
             "HOROVODLITE_TEST_ROOT_NETNS": ROOT_NETNS, **(env or {})},
    )  # fmt: skip


@pytest.mark.netns
def test_two_hosts_two_slots_topology_and_collectives(cluster):
    """rank/local/cross ranks and every collective (all algorithms) across two hosts."""
    result = _rank_pytest(cluster, 4, 2, "multihost_collectives.py", timeout=180)
    assert result.returncode == 0, result.stdout[-20000:]
    assert result.stdout.count(" passed") >= 4, result.stdout[-5000:]


@pytest.mark.netns
def test_uneven_hosts_choose_alike(cluster):
    """3 ranks on hosts of 2 and 1: every rank takes the same all-reduce and all-gather."""
    result = _rank_pytest(cluster, 3, 2, "multihost_uneven.py", timeout=120)
    assert result.returncode == 0, result.stdout[-20000:]
    assert result.stdout.count("3 passed") == 3, result.stdout[-5000:]


@pytest.fixture
def host_name_on_loopback(cluster):
    """Make this machine's name resolve to 127.0.1.1 inside the simulated hosts, as the
    /etc/hosts of many Linux installs does (`ip netns exec` mounts /etc/netns/NS/hosts)."""
    folders = [os.path.join("/etc/netns", host.namespace) for host in cluster.hosts]
    try:
        for folder in folders:
            os.makedirs(folder)
            with open(os.path.join(folder, "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n127.0.1.1 {platform.node()}\n")
        yield
    finally:
        for folder in folders:
            if os.path.exists(os.path.join(folder, "hosts")):
                os.remove(os.path.join(folder, "hosts"))
            if os.path.isdir(folder):
                os.rmdir(folder)


@pytest.mark.netns
def test_gloo_transport_across_hosts(cluster):
    """HOROVODLITE_TRANSPORT=gloo on 3 ranks over 2 hosts, the interface named Horovod's way."""
    pytest.importorskip("torch")
    env = {"HOROVODLITE_TRANSPORT": "gloo", "GLOO_SOCKET_IFNAME": "", "HOROVOD_GLOO_IFACE": "eth0",
           "HOROVODLITE_TEST_GLOO_EXPECT": "works"}  # fmt: skip
    result = _rank_pytest(cluster, 3, 2, "multihost_gloo.py", timeout=180, env=env)
    assert result.returncode == 0, result.stdout[-20000:]
    assert result.stdout.count("2 passed, 1 skipped") == 3, result.stdout[-5000:]


@pytest.mark.netns
def test_gloo_transport_without_an_address_fails_at_once(cluster, host_name_on_loopback):
    """No interface named and the host name on loopback: a clear error on every rank, no wait."""
    pytest.importorskip("torch")
    env = {"HOROVODLITE_TRANSPORT": "gloo", "GLOO_SOCKET_IFNAME": "",
           "HOROVODLITE_TEST_GLOO_EXPECT": "unreachable"}  # fmt: skip
    result = _rank_pytest(cluster, 3, 2, "multihost_gloo.py", timeout=120, env=env)
    assert result.returncode == 0, result.stdout[-20000:]
    assert result.stdout.count("2 passed, 1 skipped") == 3, result.stdout[-5000:]


@pytest.mark.netns
def test_hosts_are_isolated_namespaces(cluster):
    assert len(cluster.hosts) == 2 and len({h.address for h in cluster.hosts}) == 2
    inside = subprocess.run(
        cluster.exec_argv(0, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert cluster.hosts[0].address + "/" in inside.stdout
    routes = subprocess.run(
        cluster.exec_argv(1, ["ip", "-4", "route", "show"]), capture_output=True, text=True,
        timeout=30,
    ).stdout  # fmt: skip
    assert "default" not in routes, "a simulated host must only reach the cluster's subnet"
    assert routes.split()[0] == str(cluster.subnet)


@pytest.mark.netns
def test_rate_cap_bounds_a_large_allreduce(netns, tmp_path):
    """8 MiB all-reduced across two hosts on 100 Mbit/s links takes at least 8 MiB / 100 Mbit/s.

    Whatever the algorithm, each host must receive at least the other host's contribution
    (N bytes) over its capped downlink, so every rank waits N * 8 / rate seconds or more, less
    what the token buckets let through at once. That is a physical lower bound, proof that the
    data crossed the (simulated) network; it is no speed claim.
    """
    nbytes = 8 << 20
    script = (
        "import json, os, sys, time, numpy as np, horovodlite as hvd; hvd.init(); "
        f"x = np.ones({nbytes // 4}, np.float32); times = {{}}\n"
        "for algorithm in ('ring', 'naive', 'mpi'):\n"
        "    hvd.allreduce(np.ones(8, np.float32), algorithm=algorithm, name='warm' + algorithm)\n"
        "    hvd.barrier(); start = time.perf_counter()\n"
        "    out = hvd.allreduce(x, op=hvd.Sum, algorithm=algorithm, name=algorithm)\n"
        "    times[algorithm] = time.perf_counter() - start\n"
        "    assert (out == hvd.size()).all()\n"
        "path = os.path.join(sys.argv[1], f'{hvd.rank()}.json')\n"
        "open(path, 'w').write(json.dumps(times))\n"
    )
    with SimulatedCluster(hosts=2, rate="100mbit") as capped:
        argv = [sys.executable, "-c", script, str(tmp_path)]
        result = capped.run(4, argv, slots_per_host=2, timeout=120)
        bound = (nbytes - 2 * capped.burst_bytes) * 8 / capped.rate_bits
    assert result.returncode == 0, result.stdout[-5000:]
    reports = {int(p.stem): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(reports) == [0, 1, 2, 3], result.stdout
    skew = 0.005  # ranks leave the barrier within milliseconds of each other
    for rank, times in reports.items():
        assert sorted(times) == ["mpi", "naive", "ring"]
        for algorithm, seconds in times.items():
            assert seconds >= bound - skew, (
                f"rank {rank}: {algorithm} all-reduce of {nbytes} bytes took {seconds:.3f} s, "
                f"less than the {bound:.3f} s that 100 Mbit/s links allow: it did not cross "
                f"the simulated network"
            )


@pytest.mark.netns
def test_horovodlite_run_simulated_hosts(netns, tmp_path):
    report = (
        "import json, os, sys, numpy as np, horovodlite as hvd; hvd.init(); "
        "r = {'rank': hvd.rank(), 'local_rank': hvd.local_rank(), 'cross_rank': hvd.cross_rank(),"
        " 'netns': os.stat('/proc/self/ns/net').st_ino, "
        " 'fusion': os.environ.get('HOROVODLITE_FUSION_THRESHOLD'), "
        " 'sum': float(hvd.allreduce(np.ones(1), op=hvd.Sum)[0])}; "
        "open(os.path.join(sys.argv[1], f'{hvd.rank()}.json'), 'w').write(json.dumps(r))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovodlite.run", "-np", "4", "--simulated-hosts", "2:1gbit",
         "--fusion-threshold-mb", "2", "--verbose", sys.executable, "-c", report, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"horovodlite-run --simulated-hosts hung:\n{out}")
    assert proc.returncode == 0, out
    assert "1000 Mbit/s" in out and "-launcher-exec" in out
    reports = sorted(
        (json.loads(p.read_text()) for p in tmp_path.glob("*.json")), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert [(r["local_rank"], r["cross_rank"]) for r in reports] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert reports[0]["netns"] == reports[1]["netns"] != reports[2]["netns"] == reports[3]["netns"]
    assert str(reports[0]["netns"]) != ROOT_NETNS
    assert {r["fusion"] for r in reports} == {str(2 << 20)} and {r["sum"] for r in reports} == {4}
    assert _names(f"{PREFIX}{proc.pid:x}_") == [], "horovodlite-run left its cluster behind"


@pytest.mark.netns
def test_sigterm_to_horovodlite_run_removes_the_cluster(netns):
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovodlite.run", "-np", "2", "--simulated-hosts", "2",
         sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for_ready(proc, 2)
        assert len(_names(f"{PREFIX}{proc.pid:x}_")) > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        assert _names(f"{PREFIX}{proc.pid:x}_") == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()


@pytest.mark.netns
def test_cleanup_on_exit_and_on_exception(netns):
    with SimulatedCluster(hosts=2, rate="1gbit") as first:
        created = _names(first.tag)
        # 2 namespaces, 2 veths, the bridge, the launcher script's folder.
        assert len(created) == 6, created
    assert _names(first.tag) == []
    with pytest.raises(RuntimeError, match="boom"):
        with SimulatedCluster(hosts=3) as second:
            assert len(_names(second.tag)) == 8
            raise RuntimeError("boom")
    assert _names(second.tag) == []
    second.close()  # twice is fine


@pytest.mark.netns
def test_parallel_clusters_get_their_own_names_and_subnets(netns):
    with SimulatedCluster(hosts=1) as a, SimulatedCluster(hosts=1) as b:
        assert a.tag != b.tag and a.bridge != b.bridge
        assert not a.subnet.overlaps(b.subnet)


@pytest.mark.netns
def test_leftovers_of_dead_runs_are_removed(netns):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now belongs to no process
    tag = f"{PREFIX}{dead.pid:x}_0"
    subprocess.run(["ip", "netns", "add", f"{tag}h0"], check=True)
    subprocess.run(["ip", "link", "add", f"{tag}b", "type", "bridge"], check=True)
    folder = os.path.join(tempfile.gettempdir(), f"{tag}-leftover")
    os.mkdir(folder)
    try:
        leftovers = _names(tag)
        assert len(leftovers) == 3, leftovers
        cleanup_stale()
        assert _names(tag) == []
    finally:
        subprocess.run(["ip", "netns", "delete", f"{tag}h0"], capture_output=True)
        subprocess.run(["ip", "link", "delete", f"{tag}b"], capture_output=True)
        if os.path.isdir(folder):
            os.rmdir(folder)


@pytest.mark.netns
def test_delay_uses_netem_or_says_why_not(netns):
    delayed = SimulatedCluster(hosts=2, delay="1ms")
    try:
        with delayed:
            qdisc = subprocess.run(
                ["tc", "-netns", delayed.hosts[0].namespace, "qdisc", "show", "dev", "eth0"],
                capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
            assert "netem" in qdisc and "delay 1ms" in qdisc, qdisc
    except LaunchError as error:  # kernels without sch_netem (CONFIG_NET_SCH_NETEM unset)
        assert "netem" in str(error) and "leave delay out" in str(error)
    assert _names(delayed.tag) == []


@pytest.mark.netns
def test_unreachable_host_is_reported(cluster):
    """A host that answers no ssh (a simulated host runs no sshd) stops the launch with exit 1."""
    address = cluster.hosts[1].address
    result = subprocess.run(
        [sys.executable, "-m", "horovodlite.run", "-np", "2", "-H", f"{address}:2",
         sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "unreachable host(s):" in result.stderr and f"  {address}: " in result.stderr


@pytest.mark.netns
def test_more_ranks_than_slots_is_refused(cluster):
    with pytest.raises(ValueError, match="cannot place 5 ranks on 2 simulated hosts"):
        cluster.mpiexec(5, ["true"], slots_per_host=2)


@pytest.mark.netns
def test_run_kills_a_job_that_outlives_its_timeout(cluster):
    result = cluster.run(2, ["sleep", "60"], slots_per_host=1, timeout=2)
    assert result.returncode == -9 and "killed after 2 s" in result.stdout
    for host in cluster.hosts:
        pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True,
                              text=True).stdout.split()  # fmt: skip
        assert pids == [], f"processes left on {host.name}: {pids}"
