"""The engine's cost per request: many small async all-reduces against one synchronous call each.

    python benchmarks/engine_requests.py --np 2,3 --repeats 11     # one mpiexec job per count
    mpiexec -n 2 python benchmarks/engine_requests.py --worker     # one job, prints JSON
    mpiexec -n 2 python benchmarks/engine_requests.py --worker --profile 20   # where time goes

Measures, in one job per rank count, for each array size (`--values`, float32), taking turns so
that background load hits all alike (issue #38):
  * async, 2 threads: `--count` arrays submitted with allreduce_async(a, name=...) from two
    threads (half each, interleaved: thread t takes arrays t, t+2, ...), then synchronized,
  * async, 1 thread: the same from one thread,
  * one sync each:    `--count` synchronous hvd.allreduce() calls, one by one,
  * grouped:          one grouped_allreduce() of all of them (one agreement, one buffer),
  * mpi each:         mpi4py's Allreduce called directly on each array (then / size),
  * mpi one buffer:   mpi4py's Allreduce on all of them already in one buffer: the floor.
The names are the same every step, as a training loop's are. Each timed step starts after a
barrier and counts the slowest rank; besides, rank 0's time to submit (the slower thread) and to
wait, and the engine's cycles per step. Medians over `--repeats`, after `--warmup` untimed
rounds of every contender: on the 2-core machine the first steps of a job ran 1.5-3.5x slower,
some jobs for five or more rounds (its threads badly placed until the scheduler settles), and
pulled the median of 11 up in about a third of the jobs (docs/benchmarks.md, stop 57).

With --profile N the worker instead runs N steps of "async, 2 threads" under cProfile on rank 0
(the submitting threads and the engine thread each profiled on their own) and prints the top of
each profile.
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time

import numpy as np
from mpi4py import MPI
from training_jobs import job_result, run_job

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENDERS = ("async, 2 threads", "async, 1 thread", "one sync each", "grouped", "mpi each",
              "mpi one buffer")


class Submitters:
    """Two long-lived threads that submit their share of a step's arrays when told to."""

    def __init__(self, hvd, threads: int = 2):
        self.hvd, self.threads = hvd, threads
        self.start = threading.Barrier(threads + 1)
        self.done = threading.Barrier(threads + 1)
        self.work = None  # (arrays, names) of the current step; None stops the threads
        self.handles = [None] * threads
        self.submit_s = [0.0] * threads
        self.profiles = None  # per thread cProfile.Profile, in profile mode
        self._threads = [threading.Thread(target=self._run, args=(t,), daemon=True)
                         for t in range(threads)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def _run(self, t: int) -> None:
        while True:
            self.start.wait()
            if self.work is None:
                return
            arrays, names = self.work
            profile = None if self.profiles is None else self.profiles[t]
            if profile is not None:
                profile.enable()
            begin = time.perf_counter()
            self.handles[t] = [
                self.hvd.allreduce_async(arrays[i], name=names[i])
                for i in range(t, len(arrays), self.threads)
            ]
            self.submit_s[t] = time.perf_counter() - begin
            if profile is not None:
                profile.disable()
            self.done.wait()

    def submit(self, arrays: list, names: list) -> list:
        """Submit `arrays` from the threads; return their handles in array order."""
        self.work = (arrays, names)
        self.start.wait()
        self.done.wait()
        handles = [None] * len(arrays)
        for t, theirs in enumerate(self.handles):
            handles[t :: self.threads] = theirs
        return handles

    def close(self) -> None:
        self.work = None
        self.start.wait()


def timed(hvd, step) -> float:
    """Run `step()` on every rank after a barrier; return the slowest rank's seconds."""
    hvd.barrier()
    start = time.perf_counter()
    step()
    elapsed = time.perf_counter() - start
    return max(hvd.allgather_object(elapsed))


def contenders(hvd, submitters: Submitters, arrays: list, names: list, phases: dict) -> dict:
    """Return {contender: step()}; async steps record rank 0's submit and wait seconds."""

    def async_threads():
        begin = time.perf_counter()
        handles = submitters.submit(arrays, names)
        submitted = time.perf_counter()
        results = [hvd.synchronize(h) for h in handles]
        phases["submit_s"], phases["wait_s"] = submitted - begin, time.perf_counter() - submitted
        return results

    def async_one():
        begin = time.perf_counter()
        handles = [hvd.allreduce_async(a, name=n) for a, n in zip(arrays, names)]
        submitted = time.perf_counter()
        results = [hvd.synchronize(h) for h in handles]
        phases["submit_s"], phases["wait_s"] = submitted - begin, time.perf_counter() - submitted
        return results

    group = f"group.{arrays[0].size}"
    comm = MPI.COMM_WORLD
    flat = np.concatenate(arrays)
    outs, flat_out = [np.empty_like(a) for a in arrays], np.empty_like(flat)

    def mpi_each():  # the MPI library called directly, one call per array (Average: then / n)
        for a, out in zip(arrays, outs):
            comm.Allreduce(a, out)
            np.divide(out, comm.size, out=out)
        return outs

    def mpi_one_buffer():  # our floor's peer: the arrays already in one buffer, one call
        comm.Allreduce(flat, flat_out)
        np.divide(flat_out, comm.size, out=flat_out)
        return [flat_out]

    return {
        "async, 2 threads": async_threads,
        "async, 1 thread": async_one,
        "one sync each": lambda: [hvd.allreduce(a, name=n) for a, n in zip(arrays, names)],
        "grouped": lambda: hvd.grouped_allreduce(arrays, name=group),
        "mpi each": mpi_each,
        "mpi one buffer": mpi_one_buffer,
    }


def measure(hvd, engine, submitters, values: int, count: int, repeats: int, warmup: int) -> dict:
    rng = np.random.default_rng(hvd.rank())
    arrays = [rng.standard_normal(values).astype(np.float32) for _ in range(count)]
    names = [f"small.{values}.{i}" for i in range(count)]
    phases: dict = {}
    steps = contenders(hvd, submitters, arrays, names, phases)
    expected = np.concatenate(steps["one sync each"]())
    for name in CONTENDERS:  # the contenders compute the same thing; also fills the cache
        np.testing.assert_allclose(np.concatenate(steps[name]()), expected, rtol=1e-6, err_msg=name)
    for _ in range(warmup):
        for name in CONTENDERS:
            timed(hvd, steps[name])
    times, cycles, submit, wait = ({name: [] for name in CONTENDERS} for _ in range(4))
    for _ in range(repeats):
        for name in CONTENDERS:
            phases.clear()
            before = engine.cycles
            times[name].append(timed(hvd, steps[name]))
            cycles[name].append(engine.cycles - before)
            if phases:
                submit[name].append(phases["submit_s"])
                wait[name].append(phases["wait_s"])
    out = {}
    for name in CONTENDERS:
        t = times[name]
        out[name] = {"median_s": float(np.median(t)), "min_s": min(t), "max_s": max(t),
                     "cycles": float(np.median(cycles[name]))}  # fmt: skip
        if submit[name]:
            out[name]["rank0_submit_s"] = float(np.median(submit[name]))
            out[name]["rank0_wait_s"] = float(np.median(wait[name]))
    return out


def profile(hvd, engine, submitters, values: int, count: int, steps: int) -> None:
    """Run `steps` steps of "async, 2 threads" with cProfile on rank 0; print the profiles."""
    arrays = [np.ones(values, dtype=np.float32) for _ in range(count)]
    names = [f"small.{values}.{i}" for i in range(count)]
    phases: dict = {}
    step = contenders(hvd, submitters, arrays, names, phases)["async, 2 threads"]
    step()  # fills the cache
    main, engine_profile = cProfile.Profile(), cProfile.Profile()
    cycle = engine._cycle

    def profiled_cycle():  # the engine thread's own profile: cProfile sees one thread
        engine_profile.enable()
        try:
            return cycle()
        finally:
            engine_profile.disable()

    if hvd.rank() == 0:
        submitters.profiles = [cProfile.Profile() for _ in range(submitters.threads)]
        engine._cycle = profiled_cycle
    for _ in range(steps):
        hvd.barrier()
        if hvd.rank() == 0:
            main.enable()
        step()
        if hvd.rank() == 0:
            main.disable()
    engine._cycle = cycle
    if hvd.rank() != 0:
        return
    for title, prof in [("submitting threads", submitters.profiles),
                        ("main thread (synchronize)", [main]),
                        ("engine thread (cycles)", [engine_profile])]:  # fmt: skip
        text = io.StringIO()
        stats = pstats.Stats(*prof, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        print(f"==== {title}, {steps} steps of {count} requests ====\n{text.getvalue()}")


def worker(args) -> None:
    import horovodlite as hvd

    hvd.init()
    engine = hvd.state.current().engine
    submitters = Submitters(hvd)
    try:
        if args.profile:
            profile(hvd, engine, submitters, args.values[-1], args.count, args.profile)
            return
        result = {"ranks": hvd.size(), "count": args.count,
                  "sizes": {str(v): measure(hvd, engine, submitters, v, args.count, args.repeats,
                                             args.warmup)
                            for v in args.values}}  # fmt: skip
        if hvd.rank() == 0:
            print("RESULT " + json.dumps(result), flush=True)
    finally:
        submitters.close()


def launch(args) -> list:
    results = []
    for np_ in args.np:
        command = [sys.executable, os.path.abspath(__file__), "--worker",
                   "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                   "--count", str(args.count),
                   "--values", ",".join(map(str, args.values))]  # fmt: skip
        print(f"$ {np_} ranks: {' '.join(command)}", file=sys.stderr, flush=True)
        load = os.getloadavg()
        results.append(job_result(run_job(np_, command)))
        results[-1]["load_average"] = [load[0], os.getloadavg()[0]]
    return results


def report(results: list) -> str:
    lines = ["median ms per step (engine cycles per step); async: rank 0's submit + wait ms; "
             "sync/async: one sync each / async, 2 threads (target >= 1.3 at 2 ranks)"]  # fmt: skip
    for r in results:
        for values, by_name in r["sizes"].items():
            cells = []
            for name in CONTENDERS:
                m = by_name[name]
                cell = f"{name} {m['median_s'] * 1e3:.2f} ({m['cycles']:.0f})"
                if "rank0_submit_s" in m:
                    cell += f" [{m['rank0_submit_s'] * 1e3:.2f} + {m['rank0_wait_s'] * 1e3:.2f}]"
                cells.append(cell)
            ratio = by_name["one sync each"]["median_s"] / by_name["async, 2 threads"]["median_s"]
            lines.append(f"{r['ranks']} ranks, {r['count']} x {values} float32, load "
                         f"{r['load_average'][0]:.1f}-{r['load_average'][1]:.1f}: "
                         + "; ".join(cells) + f"; sync/async {ratio:.2f}x")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=lambda s: [int(v) for v in s.split(",")], default=[2, 3])
    parser.add_argument("--worker", action="store_true", help="run inside an MPI job")
    parser.add_argument("--values", type=lambda s: [int(v) for v in s.split(",")],
                        default=[256, 1024], help="float32 values per array")  # fmt: skip
    parser.add_argument("--count", type=int, default=200, help="arrays per step")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds of every contender")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="with --worker: profile this many async steps on rank 0")  # fmt: skip
    parser.add_argument("--out", default=os.path.join(HERE, "results", "engine_requests.json"))
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = launch(args)
    text = report(results)
    print(text)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "results": results, "table": text}, f, indent=1)


if __name__ == "__main__":
    main()
