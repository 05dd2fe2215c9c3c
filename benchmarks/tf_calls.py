"""What one collective of horovodlite.tensorflow costs, eagerly and inside a tf.function.

    mpiexec -n 2 python benchmarks/tf_calls.py               # prints a table
    mpiexec -n 2 python benchmarks/tf_calls.py --out results/tf_calls/after_a.json

In one MPI job, for each size (float32, Average), the contenders taking turns block by block
(each block starts after a barrier and keeps the slowest rank's mean; the median of `--repeats`
blocks, training_jobs.timed_in_turns):

    eager allreduce          hvd.allreduce(x)
    eager allreduce, taped   the same under a tf.GradientTape watching x (the gradient's op)
    function allreduce       a tf.function of hvd.allreduce(x)
    eager grouped            hvd.grouped_allreduce of `--count` tensors
    function grouped         the same in a tf.function
    eager allgather          hvd.allgather(x)
    eager broadcast          hvd.broadcast(x, 0)
    mpi4py allreduce         MPI_Allreduce of the same numpy array, preallocated, then / size:
                             the MPI library's floor
    function no-op           a tf.function returning x + 0: what calling any tf.function costs
    function numpy_function  a tf.function of an identity tf.numpy_function: the floor of a
                             Python op inside a graph, which every collective there is

Every collective's result is checked against numpy's.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import horovodlite.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402
from training_jobs import save_rows, timed_in_turns, turn_arguments  # noqa: E402

CONTENDERS = ("eager allreduce", "eager allreduce, taped", "function allreduce", "eager grouped",
              "function grouped", "eager allgather", "eager broadcast", "mpi4py allreduce",
              "function no-op", "function numpy_function")  # fmt: skip


def calls_for(x, xs, comm, results: dict) -> dict:
    """Return {contender: one call}; the collectives keep their last result in `results`."""

    def keep(name, call):
        return lambda: results.__setitem__(name, call())

    def taped():
        with tf.GradientTape() as tape:
            tape.watch(x)
            return hvd.allreduce(x)

    allreduce = tf.function(lambda x: hvd.allreduce(x))
    grouped = tf.function(lambda xs: hvd.grouped_allreduce(xs))
    no_op = tf.function(lambda x: x + 0)
    identity = tf.function(lambda x: tf.numpy_function(lambda a: a, [x], x.dtype, stateful=True))
    send = x.numpy()
    out = np.empty_like(send)

    def mpi4py_allreduce():
        comm.Allreduce(send, out, op=MPI.SUM)
        np.divide(out, comm.size, out=out)
        return out

    return {
        "eager allreduce": keep("eager allreduce", lambda: hvd.allreduce(x)),
        "eager allreduce, taped": keep("eager allreduce, taped", taped),
        "function allreduce": keep("function allreduce", lambda: allreduce(x)),
        "eager grouped": keep("eager grouped", lambda: hvd.grouped_allreduce(xs)),
        "function grouped": keep("function grouped", lambda: grouped(xs)),
        "eager allgather": keep("eager allgather", lambda: hvd.allgather(x)),
        "eager broadcast": keep("eager broadcast", lambda: hvd.broadcast(x, 0)),
        "mpi4py allreduce": keep("mpi4py allreduce", mpi4py_allreduce),
        "function no-op": lambda: no_op(x),
        "function numpy_function": lambda: identity(x),
    }


def expected_results(values: int, count: int, comm) -> dict:
    """Return what each collective contender must give: every rank holds rank + i."""
    n = comm.size
    mean = lambda i: np.full(values, (n - 1) / 2 + i, np.float32)  # noqa: E731
    return {
        "eager allreduce": mean(0),
        "eager allreduce, taped": mean(0),
        "function allreduce": mean(0),
        "eager grouped": [mean(i) for i in range(count)],
        "function grouped": [mean(i) for i in range(count)],
        "eager allgather": np.repeat(np.arange(n, dtype=np.float32), values),
        "eager broadcast": np.zeros(values, np.float32),
        "mpi4py allreduce": mean(0),
    }


def main() -> None:
    args = turn_arguments(__doc__.splitlines()[0], sizes="1024,1048576", count=8,
                          block_seconds=0.2, unit="tensor")  # fmt: skip
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        values = nbytes // 4
        x = tf.fill([values], float(comm.rank))
        xs = [tf.fill([values], float(comm.rank + i)) for i in range(args.count)]
        results: dict = {}
        medians = timed_in_turns(comm, calls_for(x, xs, comm, results), args.repeats,
                                 args.block_seconds)  # fmt: skip
        expected = expected_results(values, args.count, comm)
        for name, seconds in medians.items():
            exact = None
            if name in expected:
                got = tf.nest.map_structure(np.asarray, results[name])
                exact = all(comm.allgather(all(
                    np.allclose(g, e, rtol=1e-6) for g, e in
                    zip(tf.nest.flatten(got), tf.nest.flatten(expected[name]))
                )))  # fmt: skip
            rows.append({"np": comm.size, "bytes": nbytes, "contender": name,
                         "median_us": 1e6 * seconds, "exact": exact})  # fmt: skip
    if comm.rank == 0:
        print("| ranks | contender | " + " | ".join(args.sizes.split(",")) + " bytes |")
        print("| --- " * (2 + len(args.sizes.split(","))) + "|")
        for name in CONTENDERS:
            cells = [r for r in rows if r["contender"] == name]
            line = [f"{r['median_us']:,.1f}" + (" !" if r["exact"] is False else "")
                    for r in cells]  # fmt: skip
            print(f"| {comm.size} | {name} | " + " | ".join(line) + " |")
        print("µs per call, median of blocks, slowest rank (! = differs from numpy's result)")
        save_rows(args.out, "tf_calls", rows)
    comm.Free()


if __name__ == "__main__":
    main()
