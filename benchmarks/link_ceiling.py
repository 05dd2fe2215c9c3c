"""The most a capped simulated link carries: one plain TCP stream between two simulated hosts.

The ring's bus bandwidth is judged against the link rate, but TCP/IP headers and the kernel's
pacing take their share of every frame before any library sees a byte. This sends `--size` bytes
over a plain socket from one simulated host to another, several times, and prints the payload
rate as a fraction of the link rate: the ceiling for any all-reduce on that link (MPI, Gloo, the
ring), since a ring rank's uplink carries one such stream.

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link-rate", default="1gbit")
    parser.add_argument("--size", default="64M", help="bytes per transfer (default 64M)")
    parser.add_argument("--repeats", type=int, default=5)
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
    # The first chunk's arrival starts the clock, so connection set-up does not count.
    seconds = statistics.median(float(line) for line in out.split())
    payload_rate = size * 8 / seconds
    print(
        f"plain TCP, {args.size} per transfer, median of {args.repeats}: {seconds * 1e3:.1f} ms, "
        f"{payload_rate / 1e9:.3f} Gbit/s payload = {payload_rate / rate:.1%} of the "
        f"{args.link_rate} link rate"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
