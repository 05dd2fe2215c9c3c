"""The most a capped simulated link carries: one plain TCP stream between two simulated hosts.

The ring's bus bandwidth is judged against the link rate, but TCP/IP headers and the kernel's
pacing take their share of every frame before any library sees a byte. This sends `--size` bytes
over a plain socket from one simulated host to another, several times, and prints the payload
rate as a fraction of the link rate: the ceiling for any all-reduce on that link (MPI, Gloo, the
ring), since a ring rank's uplink carries one such stream. Then the same bytes as one MPI message
between two ranks on the two hosts, and as the ring sends them (segments of
HOROVODLITE_RING_SEGMENT_BYTES, non-blocking): what the MPI transport itself costs. Last, a ring
of streams on `--ring-hosts` hosts: every rank sends to its right neighbour while it receives
from its left, with no dependency between the two: what an all-reduce ring's links carry at
best when all hosts (and their ranks) share this machine's cores.

Last, with `--allreduce-size`, the all-reduce itself on `--allreduce-hosts` hosts, one job, the
contenders taking turns call by call: horovodlite's ring through `hvd.allreduce_` (and, with
`--before REV`, the ring of that git revision in its place, the same call), the ring function
called directly (what the public call adds: its checks and the engine), Gloo, MPI's own
MPI_Allreduce, and the ring of streams carrying the same bytes a ring rank sends, 2(n-1)/n of
the buffer: the ceiling for the all-reduce's traffic on these links, beside the link rate.

    sudo python benchmarks/link_ceiling.py --link-rate 1gbit --size 64M
    sudo python benchmarks/link_ceiling.py --size 0 \
        --allreduce-size 16M --allreduce-hosts 4 --allreduce-repeats 15 --before f51e23a
"""

import argparse
import os
import statistics
import subprocess
import sys

from horovodlite.bench.method import parse_size
from horovodlite.run.netns import parse_rate
from horovodlite.run.simcluster import SimulatedCluster

_RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 5123))
for _ in range(int(sys.argv[3])):
    conn, _ = server.accept()
    left, start = int(sys.argv[2]), None
    while left:
        data = conn.recv(1 << 20)
        start = start or time.perf_counter()
        left -= len(data)
    print(time.perf_counter() - start, flush=True)
    conn.sendall(b"x")
    conn.close()
"""

_SENDER = """
import socket, sys, time
payload = bytes(int(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    for attempt in range(100):
        try:
            conn = socket.create_connection((sys.argv[1], 5123))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    conn.sendall(payload)
    conn.recv(1)
    conn.close()
"""


_MPI_STREAM = """
import os, statistics, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
size, repeats = int(sys.argv[1]), int(sys.argv[2])
segment = int(os.environ.get("HOROVODLITE_RING_SEGMENT_BYTES", 1 << 20))
buf = np.zeros(size, np.uint8)
def whole():
    if comm.rank == 0:
        comm.Send(buf, 1)
    else:
        comm.Recv(buf, 0)
def segmented():
    parts = [buf[lo : lo + segment] for lo in range(0, size, segment)]
    if comm.rank == 0:
        MPI.Request.Waitall([comm.Isend(p, 1) for p in parts])
    else:
        MPI.Request.Waitall([comm.Irecv(p, 0) for p in parts])
for name, run in (("one message", whole), ("segments", segmented)):
    run()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        run()
        comm.Barrier()  # the receiver's end: the barrier's latency is noise here
        times.append(time.perf_counter() - start)
    if comm.rank == 0:
        print(name, statistics.median(times), flush=True)
"""


_MPI_RING = """
import statistics, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
size, repeats, segment = int(sys.argv[1]), int(sys.argv[2]), 1 << 20
out, incoming = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
def ring():
    sends = [comm.Isend(out[lo : lo + segment], (r + 1) % n) for lo in range(0, size, segment)]
    receives = [comm.Irecv(incoming[lo : lo + segment], (r - 1) % n)
                for lo in range(0, size, segment)]
    MPI.Request.Waitall(sends + receives)
ring()
times = []
for _ in range(repeats):
    comm.Barrier()
    start = time.perf_counter()
    ring()
    times.append(time.perf_counter() - start)
slowest = comm.allreduce(statistics.median(times), MPI.MAX)
if r == 0:
    print("ring", slowest, flush=True)
"""


_ALLREDUCE = """
import importlib.util, os, statistics, subprocess, sys, time
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
import horovodlite as hvd
from horovodlite import algorithms

hvd.init()
comm = MPI.COMM_WORLD.Dup()
n, r = comm.size, comm.rank
size, repeats, before = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
buf = np.ones(size // 4, np.float32)
current = algorithms.ALLREDUCE["ring"]
rings = {"ring": current}
if before:  # the ring module of another revision, imported as a sibling of the current one
    path = f"/tmp/ring_before_{os.getpid()}.py"
    with open(path, "w") as f:
        f.write(subprocess.run(["git", "show", f"{before}:horovodlite/algorithms/ring.py"],
                               capture_output=True, text=True, check=True).stdout)
    spec = importlib.util.spec_from_file_location("horovodlite.algorithms.ring_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.remove(path)
    rings[f"ring {before}"] = module.ring_allreduce
address = os.environ["HOST0_ADDRESS"]
store = dist.TCPStore(address, 0, n, is_master=True, wait_for_workers=False) if r == 0 else None
port = comm.bcast(store.port if r == 0 else None)
if r:
    store = dist.TCPStore(address, port, n, is_master=False)
dist.init_process_group("gloo", store=store, rank=r, world_size=n)
tensor = torch.ones(size // 4)
part = 2 * (n - 1) * size // n  # bytes a ring rank sends in one all-reduce
out, incoming = np.zeros(part, np.uint8), np.zeros(part, np.uint8)

def ring_call(function):
    def call():
        algorithms.ALLREDUCE["ring"] = function
        try:
            hvd.allreduce_(buf, op=hvd.Sum, algorithm="ring", name="ring")
        finally:
            algorithms.ALLREDUCE["ring"] = current
    return call

def streams():
    segment = 1 << 20
    sends = [comm.Isend(out[lo : lo + segment], (r + 1) % n) for lo in range(0, part, segment)]
    receives = [comm.Irecv(incoming[lo : lo + segment], (r - 1) % n)
                for lo in range(0, part, segment)]
    MPI.Request.Waitall(sends + receives)

calls = {name: ring_call(f) for name, f in rings.items()}
segment = int(os.environ.get("HOROVODLITE_RING_SEGMENT_BYTES", 1 << 20))
calls["ring, the bare function"] = lambda: current(comm, buf, hvd.Sum, np, segment)
calls |= {"gloo": lambda: dist.all_reduce(tensor),
          "MPI_Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM),
          "ring of streams": streams}
names = list(calls)
times = {name: [] for name in names}
for name in names:
    calls[name]()
for i in range(repeats):
    for name in names[i % len(names):] + names[: i % len(names)]:
        buf[:] = 1
        comm.Barrier()
        start = time.perf_counter()
        calls[name]()
        times[name].append(comm.allreduce(time.perf_counter() - start, MPI.MAX))
        if name != "ring of streams" and name != "gloo":
            assert buf[0] == n and buf[-1] == n, (name, buf[0], buf[-1])
if r == 0:
    for name in names:
        print("allreduce", name, "|", statistics.median(times[name]), min(times[name]),
              max(times[name]), flush=True)
dist.destroy_process_group()
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link-rate", default="1gbit")
    parser.add_argument("--size", default="64M", help="bytes per transfer (default 64M)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ring-hosts", default="4,8", help="host counts of the ring of streams")
    parser.add_argument("--allreduce-size", default=None, help="all-reduce bytes (e.g. 16M)")
    parser.add_argument("--allreduce-hosts", type=int, default=4)
    parser.add_argument("--allreduce-repeats", type=int, default=15)
    parser.add_argument("--before", default=None, help="git revision of the ring to compare")
    args = parser.parse_args(argv)
    size, rate = parse_size(args.size), parse_rate(args.link_rate)
    if size == 0:  # --size 0: the all-reduce only
        return _allreduce(args, rate) if args.allreduce_size else 0
    with SimulatedCluster(2, rate=args.link_rate) as cluster:
        receiver_host = cluster.hosts[1]
        receiver = subprocess.Popen(
            cluster.exec_argv(1, [sys.executable, "-c", _RECEIVER, receiver_host.address,
                                  str(size), str(args.repeats)]),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        subprocess.run(
            cluster.exec_argv(0, [sys.executable, "-c", _SENDER, receiver_host.address,
                                  str(size), str(args.repeats)]),
            check=True, timeout=600,
        )  # fmt: skip
        out, _ = receiver.communicate(timeout=60)
        mpi = cluster.run(
            2, [sys.executable, "-c", _MPI_STREAM, str(size), str(args.repeats)],
            slots_per_host=1, timeout=600,
        )  # fmt: skip
    # The first chunk's arrival starts the clock, so connection set-up does not count.
    seconds = statistics.median(float(line) for line in out.split())
    _report("plain TCP", seconds, size, rate, args)
    lines = [line for line in mpi.stdout.splitlines() if line.startswith(("one message", "seg"))]
    if mpi.returncode != 0 or len(lines) != 2:
        print(f"the MPI run failed (status {mpi.returncode}):\n{mpi.stdout[-2000:]}")
        return 1
    for line in lines:
        name, value = line.rsplit(" ", 1)
        _report(f"MPI, {name}", float(value), size, rate, args)
    for hosts in (int(k) for k in args.ring_hosts.split(",") if k):
        with SimulatedCluster(hosts, rate=args.link_rate) as cluster:
            ring = cluster.run(
                hosts, [sys.executable, "-c", _MPI_RING, str(size), str(args.repeats)],
                slots_per_host=1, timeout=600,
            )  # fmt: skip
        found = [line for line in ring.stdout.splitlines() if line.startswith("ring ")]
        if ring.returncode != 0 or not found:
            print(f"the ring of streams failed (status {ring.returncode}):\n{ring.stdout[-2000:]}")
            return 1
        seconds = float(found[0].split()[1])
        _report(f"MPI ring of streams, {hosts} hosts, slowest rank", seconds, size, rate, args)
    if args.allreduce_size:
        return _allreduce(args, rate)
    return 0


def _allreduce(args, rate: int) -> int:
    size, hosts = parse_size(args.allreduce_size), args.allreduce_hosts
    with SimulatedCluster(hosts, rate=args.link_rate) as cluster:
        job = cluster.run(
            hosts, [sys.executable, "-c", _ALLREDUCE, str(size), str(args.allreduce_repeats),
                    args.before or ""],
            slots_per_host=1, timeout=600,
            env={"HOST0_ADDRESS": cluster.hosts[0].address, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
    rows = [line.split(" ", 1)[1] for line in job.stdout.splitlines() if line.startswith("allre")]
    if job.returncode != 0 or not rows:
        print(f"the all-reduce job failed (status {job.returncode}):\n{job.stdout[-3000:]}")
        return 1
    ideal = 2 * (hosts - 1) / hosts * size * 8 / rate  # the ring's bytes at the link rate
    medians = {}
    for row in rows:
        name, figures = row.split(" | ")
        medians[name] = [float(x) for x in figures.split()]
    gloo = medians.get("gloo", [None])[0]
    print(f"\nall-reduce of {args.allreduce_size} on {hosts} hosts at {args.link_rate}, median "
          f"(min, max) of {args.allreduce_repeats} calls, slowest rank; % of link = "
          f"2(n-1)/n x size / time / link rate (the bound: {ideal * 1e3:.1f} ms):")  # fmt: skip
    for name, (median, low, high) in medians.items():
        versus = f", {median / gloo:.3f}x Gloo's time" if gloo else ""
        print(f"  {name:22s} {median * 1e3:8.1f} ms ({low * 1e3:.1f}, {high * 1e3:.1f}) "
              f"{ideal / median:6.1%} of the link{versus}")  # fmt: skip
    return 0


def _report(what: str, seconds: float, size: int, rate: int, args) -> None:
    payload_rate = size * 8 / seconds
    print(
        f"{what}, {args.size} per transfer, median of {args.repeats}: {seconds * 1e3:.1f} ms, "
        f"{payload_rate / 1e9:.3f} Gbit/s payload = {payload_rate / rate:.1%} of the "
        f"{args.link_rate} link rate"
    )


if __name__ == "__main__":
    raise SystemExit(main())
