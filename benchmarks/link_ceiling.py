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

    sudo python benchmarks/link_ceiling.py --link-rate 1gbit --size 64M
"""

import argparse
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link-rate", default="1gbit")
    parser.add_argument("--size", default="64M", help="bytes per transfer (default 64M)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ring-hosts", default="4,8", help="host counts of the ring of streams")
    args = parser.parse_args(argv)
    size, rate = parse_size(args.size), parse_rate(args.link_rate)
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
