"""Keras model.fit step time: horovodlite.keras.DistributedOptimizer against TensorFlow's
MultiWorkerMirroredStrategy.

`python benchmarks/keras_fit.py --np 2,4` starts one MPI job per rank count (and one single
process), prints a table and writes benchmarks/results/keras_fit.json. In each job every rank
trains the same two models (the CNN of PyTorch's MNIST example and an MLP of 4096 x 4096
layers, as benchmarks/torch_ddp.py) with `model.fit` and each contender, the contenders taking
turns in short blocks so that background load hits all alike:

    local   the plain optimizer, no communication: the compute part of a step at this rank count
    hvd     horovodlite.keras.DistributedOptimizer (one fused all-reduce per step, in the graph)
    mwms    tf.distribute.MultiWorkerMirroredStrategy: every rank is a worker, TF_CONFIG names
            the workers' gRPC servers on 127.0.0.1; gradients are all-reduced by TensorFlow's
            collective ops (ring, over gRPC)

Every contender reads the same per-rank tf.data pipeline (batch --batch-size per rank); for
mwms it is handed to each worker by `distribute_datasets_from_function`. A step is one batch of
`model.fit` (SGD with momentum, jit_compile=False): the time between the ends of consecutive
batches, on every rank; the slowest rank's time counts, and the median over all blocks is kept.

Keras 3.15's `model.fit` does not run under MultiWorkerMirroredStrategy as released: it calls
`strategy.reduce` on the (x, y) batch tuple and with `axis=0` on scalar metrics, and the
strategy rejects both. `_let_keras_fit_run_under` wraps `strategy.reduce` to reduce each tensor
of a structure on its own, with `axis=None` for scalars: the smallest change that lets fit run.
"""

import json
import os
import random
import socket
import time

from training_jobs import argument_parser, run_and_report, slowest_rank, summary

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CONTENDERS = ("local", "hvd", "mwms")


def parse_args(argv=None):
    parser = argument_parser(__doc__, CONTENDERS, os.path.join(RESULTS, "keras_fit.json"))
    parser.add_argument("--threads", type=int, default=0, help="TF threads per rank (0: cpus/np)")
    args = parser.parse_args(argv)
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: a step's time runs from the previous one's end")
    return args


# -- the worker: one MPI job ------------------------------------------------------------------


def start_multi_worker_strategy(comm):
    """Every rank becomes a worker of one MultiWorkerMirroredStrategy cluster on 127.0.0.1.

    TF_CONFIG must be set, and the strategy made, before TensorFlow runs any op.
    """
    import tensorflow as tf

    if comm.size > 1:
        workers = [f"127.0.0.1:{port}" for port in comm.bcast(
            free_ports(comm.size) if comm.rank == 0 else None, root=0
        )]  # fmt: skip
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": comm.rank}}
        )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _let_keras_fit_run_under(strategy)
    return strategy


def free_ports(count: int) -> list:
    """`count` ports that are free now, below the kernel's ephemeral range.

    TensorFlow's gRPC server binds its port on all addresses. A port from the ephemeral range
    (what binding port 0 gives) can be taken by an outgoing connection, TensorFlow's or MPI's,
    before the server starts; below the range the kernel never hands ports out by itself.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_start = int(f.read().split()[0])
    except OSError:
        ephemeral_start = 32768
    ports: list = []
    for port in random.sample(range(10000, ephemeral_start), k=min(1000, ephemeral_start - 10000)):
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"found only {len(ports)} free ports of {count} below {ephemeral_start}")


def _let_keras_fit_run_under(strategy) -> None:
    """Work around Keras 3.15's fit under MultiWorkerMirroredStrategy (see the module doc)."""
    import tensorflow as tf

    reduce = strategy.reduce

    def reduce_each(op, value, axis=None):
        def one(v):
            scalar = strategy.experimental_local_results(v)[0].shape.rank == 0
            return reduce(op, v, None if scalar else axis)

        return tf.nest.map_structure(one, value)

    strategy.reduce = reduce_each


def build_model(kind: str, width: int):
    import keras
    from keras import layers

    if kind == "cnn":  # the network of PyTorch's MNIST example: 1.2 M parameters
        return keras.Sequential([
            keras.Input((28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(2), layers.Flatten(),
            layers.Dense(128, activation="relu"), layers.Dense(10),
        ])  # fmt: skip
    if kind == "mlp":  # 1024 -> width -> width -> width -> 10: 37.8 M parameters at 4096
        return keras.Sequential([
            keras.Input((1024,)), layers.Dense(width, activation="relu"),
            layers.Dense(width, activation="relu"), layers.Dense(width, activation="relu"),
            layers.Dense(10),
        ])  # fmt: skip
    raise ValueError(f"unknown model {kind!r}: use cnn or mlp")


def dataset(kind: str, batch_size: int, batches: int, seed: int):
    """This rank's batches, repeated forever."""
    import numpy as np
    import tensorflow as tf

    generator = np.random.default_rng(seed)
    shape = (28, 28, 1) if kind == "cnn" else (1024,)
    x = generator.standard_normal((batches * batch_size, *shape), dtype=np.float32)
    y = generator.integers(0, 10, batches * batch_size)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat()


class Contender:
    """One contender's compiled model and its input."""

    def __init__(self, name: str, kind: str, args, weights: list, data, strategy):
        import contextlib

        import horovodlite.keras as hvd
        import keras

        self.name = name
        scope = strategy.scope() if name == "mwms" else contextlib.nullcontext()
        with scope:
            self.model = build_model(kind, args.mlp_width)
            self.model.set_weights(weights)
            optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
            if name == "hvd":
                optimizer = hvd.DistributedOptimizer(optimizer)
            self.model.compile(
                optimizer,
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=False,
            )
        self.data = data
        if name == "mwms":  # each worker reads its own rank's batches, as under hvd
            self.data = strategy.distribute_datasets_from_function(lambda _: data)

    def fit(self, steps: int) -> list:
        """Train `steps` batches; return the times at which each ended."""
        import keras

        ends = []
        timer = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter())
        )
        self.model.fit(
            self.data, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0, callbacks=[timer]
        )
        return ends


def worker(args) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    threads = args.threads or max(1, (os.cpu_count() or 1) // size)
    import tensorflow as tf

    # Before the strategy: both fix how TensorFlow's runtime starts.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    contenders = args.contenders.split(",")
    strategy = start_multi_worker_strategy(comm) if "mwms" in contenders else None
    import horovodlite.keras as hvd
    import keras
    import numpy as np

    hvd.init()
    results, checks = [], {}
    for kind in args.models.split(","):
        keras.utils.set_random_seed(0)
        weights = build_model(kind, args.mlp_width).get_weights()
        data = dataset(kind, args.batch_size, args.warmup + args.steps, seed=rank)
        runs = {c: Contender(c, kind, args, weights, data, strategy) for c in contenders}

        # Two steps from equal weights on equal data must give equal weights: hvd and mwms
        # compute the same thing, so their times are comparable. local, which does not
        # average, is the control: above one rank its weights differ.
        for contender in runs.values():
            contender.fit(2)
        for a, b in (("hvd", "mwms"), ("hvd", "local")):
            if a in runs and b in runs:
                gap = max(
                    float(np.max(np.abs(x - y)))
                    for x, y in zip(runs[a].model.get_weights(), runs[b].model.get_weights())
                )
                checks[f"{kind}:{a} vs {b}"] = slowest_rank(comm, [gap])[0]

        times = {c: [] for c in contenders}
        for round_ in range(args.rounds):
            shift = round_ % len(contenders)  # rotate the order so no contender is always first
            for name in contenders[shift:] + contenders[:shift]:
                comm.Barrier()
                ends = runs[name].fit(args.warmup + args.steps)
                steps = np.diff(ends)[args.warmup - 1 :]
                times[name].extend(slowest_rank(comm, steps.tolist()))
        params = runs[contenders[0]].model.count_params()
        results += [summary(size, kind, params, c, values) for c, values in times.items()]
        del runs
    if rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"np": size, "threads": threads, "results": results, "checks": checks}, f)


# -- the driver: one job per rank count, then the table --------------------------------------


def _versions() -> dict:
    import keras
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": keras.__version__}


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    run_and_report(__file__, args, CONTENDERS, ratio=("hvd", "mwms"), versions=_versions)


if __name__ == "__main__":
    main()
