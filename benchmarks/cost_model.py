"""The all-reduce cost model with measured constants, checked against benchmark results.

    python benchmarks/cost_model.py benchmarks/results/multihost_1gbit.json \
        benchmarks/results/multihost_2rph.json --link-ceiling 0.957

Constants (docs/algorithms.md#cost-model):
  a_net  per ring step across the simulated network: MPI over TCP plus Python, fitted from the
         ring's smallest measured all-reduce on the capped cluster (T / 2(n-1));
  a_shm  per ring step on shared memory, measured here under `mpiexec -n 2` (8-byte ring);
  beta   per byte on a capped link: 8 / (link rate x payload fraction), the fraction from
         benchmarks/link_ceiling.py (plain TCP);
  b_shm  per byte moved between two ranks over shared memory (measured here: an MPI message of
         16 MiB between two ranks, one way);
  gamma  per byte of a float32 reduction in numpy (measured here).

Each prediction is printed beside every measured point of the given result files (ring,
hierarchical and naive all-reduce), with its error, then predictions at 16, 64 and 256 ranks on
25 and 100 Gbit/s links.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

_MEASURE_FLAG = "--measure-constants"


def measure_constants() -> dict:
    """Run under mpiexec -n 2: the shared-memory step latency, per-byte copy and reduce time."""
    from mpi4py import MPI

    from horovodlite.algorithms.ring import ring_allreduce
    from horovodlite.ops import ReduceOp

    comm = MPI.COMM_WORLD
    tiny = np.ones(2, np.float32)
    for _ in range(200):
        ring_allreduce(comm, tiny, ReduceOp.SUM, np, 1 << 20)
    comm.Barrier()
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        ring_allreduce(comm, tiny, ReduceOp.SUM, np, 1 << 20)
    a_shm = (time.perf_counter() - start) / rounds / 2  # 2(n-1) = 2 steps
    big = np.ones(4 << 20, np.float32)  # 16 MiB
    times = []
    for _ in range(7):
        comm.Barrier()
        start = time.perf_counter()
        if comm.rank == 0:
            comm.Send(big, 1)
            comm.Recv(big[:1], 1)
        else:
            comm.Recv(big, 0)
            comm.Send(big[:1], 0)
        times.append(time.perf_counter() - start)
    b_shm = statistics.median(times) / big.nbytes
    other = np.ones_like(big)
    reduce_times = []
    for _ in range(7):
        start = time.perf_counter()
        np.add(big, other, out=big)
        reduce_times.append(time.perf_counter() - start)
    gamma = statistics.median(reduce_times) / big.nbytes
    return {"a_shm": a_shm, "b_shm": b_shm, "gamma": gamma}


def _constants_from_mpiexec() -> dict:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    out = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, __file__, _MEASURE_FLAG],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def ring_time(n: int, size: float, a: float, beta: float, gamma: float) -> float:
    """Flat ring on n ranks whose slowest hop has per-byte time `beta`, pipelined segments."""
    if n == 1:
        return 0.0
    return 2 * (n - 1) * a + (n - 1) / n * size * (max(beta, gamma) + beta)


def hierarchical_time(hosts: int, local: int, size: float, c: dict, beta: float) -> float:
    """Reduce-scatter in the host, a ring per slice across hosts (the host link shared by the
    host's `local` ranks), all-gather in the host."""
    inside = ring_time(local, size, c["a_shm"], c["b_shm"], c["gamma"])
    across = ring_time(hosts, size / local, c["a_net"], local * beta, c["gamma"])
    return inside + across


def naive_time(n: int, size: float, c: dict, beta: float) -> float:
    """Through rank 0: its link takes in (n-1) buffers and sends out (n-1), one after another."""
    return 2 * c["a_net"] + 2 * (n - 1) * size * beta


def predict(contender: str, hosts: int, local: int, size: float, c: dict, beta: float):
    """The model's time for a benchmark contender, or None where it models no algorithm."""
    n = hosts * local
    if contender == "auto":  # the default choice: MPI's own up to 1 MiB, not modelled
        if size <= 1 << 20:
            return None
        contender = "hierarchical" if local > 1 else "ring"
    if contender == "ring":
        return ring_time(n, size, c["a_net"], beta, c["gamma"])
    if contender == "hierarchical":
        return hierarchical_time(hosts, local, size, c, beta)
    if contender == "naive":
        return naive_time(n, size, c, beta)
    return None


def _load(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs.extend(json.load(f)["runs"])
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON files of simulated-cluster runs")
    parser.add_argument("--link-ceiling", type=float, default=0.957,
                        help="payload fraction of the link rate (benchmarks/link_ceiling.py)")
    parser.add_argument("--min-size", type=int, default=65536,
                        help="smallest message to compare (smaller ones fit a_net)")
    args = parser.parse_args(argv)  # fmt: skip
    c = _constants_from_mpiexec()
    runs = [r for r in _load(args.results) if r["facts"].get("link_rate_bits")]
    fitting = min(
        (r for r in runs if r["facts"]["ranks_per_host"] == 1), key=lambda r: r["facts"]["hosts"]
    )
    rate = fitting["facts"]["link_rate_bits"]
    beta = 8 / (rate * args.link_ceiling)
    ring_rows = [row for row in fitting["rows"] if row["contender"] == "ring"]
    smallest = min(ring_rows, key=lambda row: row["bytes"])
    n = fitting["facts"]["ranks"]
    bandwidth_part = ring_time(n, smallest["bytes"], 0.0, beta, c["gamma"])
    c["a_net"] = max(0.0, smallest["time_us"] * 1e-6 - bandwidth_part) / (2 * (n - 1))
    print("constants: " + ", ".join(
        [f"a_net {c['a_net'] * 1e6:.0f} µs (from the ring at {smallest['bytes']} B, "
         f"{fitting['setting']})", f"a_shm {c['a_shm'] * 1e6:.1f} µs",
         f"beta {beta * 1e9:.2f} ns/B ({rate / 1e9:g} Gbit/s x {args.link_ceiling})",
         f"b_shm {c['b_shm'] * 1e9:.3f} ns/B", f"gamma {c['gamma'] * 1e9:.3f} ns/B"]))  # fmt: skip
    print()
    print("| setting | algorithm | size | measured ms | model ms | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    errors = []
    for run in runs:
        facts = run["facts"]
        hosts, local = facts["hosts"], facts["ranks_per_host"]
        run_beta = 8 / (facts["link_rate_bits"] * args.link_ceiling)
        for row in run["rows"]:
            if row["collective"] != "allreduce" or row["bytes"] < args.min_size:
                continue
            model = predict(row["contender"], hosts, local, row["bytes"], c, run_beta)
            if model is None:
                continue
            measured = row["time_us"] * 1e-3
            error = model * 1e3 / measured - 1
            errors.append(abs(error))
            print(f"| {run['setting']} | {row['contender']} | {_size(row['bytes'])} | "
                  f"{measured:,.1f} | {model * 1e3:,.1f} | {error:+.0%} |")  # fmt: skip
    if errors:
        print(f"\n{len(errors)} points: median |error| {statistics.median(errors):.0%}, "
              f"largest {max(errors):.0%}")
    print()
    print("Predicted all-reduce time (ms), 8 ranks per host where hierarchical:")
    print()
    print("| link | ranks | size | ring | hierarchical | naive | ring bus bandwidth / link |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for gbit in (25, 100):
        link_beta = 8 / (gbit * 1e9 * args.link_ceiling)
        for ranks in (16, 64, 256):
            for size in (4 << 20, 64 << 20, 256 << 20):
                ring = ring_time(ranks, size, c["a_net"], link_beta, c["gamma"])
                hier = hierarchical_time(ranks // 8, 8, size, c, link_beta)
                naive = naive_time(ranks, size, c, link_beta)
                busbw = 2 * (ranks - 1) / ranks * size / ring * 8 / (gbit * 1e9)
                print(f"| {gbit} Gbit/s | {ranks} | {_size(size)} | {ring * 1e3:,.1f} | "
                      f"{hier * 1e3:,.1f} | {naive * 1e3:,.0f} | {busbw:.0%} |")  # fmt: skip
    return 0


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


if __name__ == "__main__":
    if _MEASURE_FLAG in sys.argv:
        from mpi4py import MPI

        constants = measure_constants()
        if MPI.COMM_WORLD.rank == 0:
            print(json.dumps(constants))
        raise SystemExit(0)
    raise SystemExit(main())
