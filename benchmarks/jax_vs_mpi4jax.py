"""horovodlite.jax against mpi4jax: all-reduce inside jax.jit, and a training step.

`python benchmarks/jax_vs_mpi4jax.py --np 2,4` starts one MPI job per rank count, prints two
tables and writes benchmarks/results/jax_vs_mpi4jax.json (and a plot where matplotlib is
installed). mpi4jax is only needed here, never by horovodlite: where it is not installed the
benchmark says so and runs nothing (or only the contenders named with --contenders that do not
need it).

All-reduce of float32 (op Sum), one call at a time, from 1 KiB to 64 MiB; the contenders take
turns size by size:

    hvd-jit      horovodlite.jax.allreduce inside jax.jit (an XLA custom call into the core)
    mpi4jax-jit  mpi4jax.allreduce inside jax.jit (an XLA custom call into MPI_Allreduce)
    mpi4py       mpi4py's Allreduce on numpy arrays, preallocated: the MPI library's floor
    hvd-numpy    horovodlite.allreduce (the core) on np.asarray of the jax.Array
    hvd-jit-donated, mpi4jax-jit-donated
                 the jitted calls again with the input donated (`donate_argnums`), as a
                 train step donates its state, and op Max, so that each result feeds the next
                 call: horovodlite reduces in the donated buffer itself, where XLA otherwise
                 copies the input into a fresh output first

A jitted call is timed to the end of its computation (block_until_ready). A block of calls
starts after a barrier and keeps the slowest rank's mean; each contender runs --repeats blocks
and the median is reported. Every contender's result is checked exactly (small integers).

Training: the MLP of examples/jax_digits.py (64-64-10), a wide one (64-1024-1024-10) and a
small CNN (two 3x3 convolutions of 16 and 32 channels on the 8x8 image, then a dense layer) on
scikit-learn's digits, batch --batch-size per rank, SGD with momentum, one jitted step:

    local        plain optax, no communication: the compute part of a step
    hvd          hvd.DistributedOptimizer (the gradient pytree as one fused all-reduce)
    mpi4jax      the same step with each gradient all-reduced by mpi4jax.allreduce and divided
                 by the size, by hand: what a user of mpi4jax writes

Each step is timed on every rank (to block_until_ready of the parameters); the slowest rank's
time counts, and the median over all blocks is kept. After two steps from equal parameters on
equal data, hvd and mpi4jax must hold the same parameters (the difference is reported).
"""

import argparse
import json
import os
import statistics
import sys
import time

from training_jobs import machine, run_jobs, slowest_rank

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ALLREDUCE = ("hvd-jit", "mpi4jax-jit", "mpi4py", "hvd-numpy", "hvd-jit-donated",
             "mpi4jax-jit-donated")
TRAINING = ("local", "hvd", "mpi4jax")
RATIOS = (("hvd-jit", "mpi4jax-jit"), ("hvd-jit-donated", "mpi4jax-jit-donated"))
NEEDS_MPI4JAX = {"mpi4jax-jit", "mpi4jax-jit-donated", "mpi4jax"}
# An MLP's layer widths, or CNN for the small convolutional network.
CNN = ((1, 16), (16, 32))  # (in, out) channels of its 3x3 convolutions, before a dense layer
MODELS = {"digits": (64, 64, 10), "wide": (64, 1024, 1024, 10), "cnn": CNN}
UNITS = {"K": 1 << 10, "M": 1 << 20}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--sizes", default="1K,64K,1M,16M,64M", help="all-reduce sizes in bytes")
    parser.add_argument("--contenders", default=",".join(ALLREDUCE + TRAINING))
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per contender")
    parser.add_argument("--block-seconds", type=float, default=0.2, help="one block's length")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=8, help="training blocks per contender")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each block")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--out", default=os.path.join(RESULTS, "jax_vs_mpi4jax.json"))
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds before a job's ranks are killed")  # fmt: skip
    parser.add_argument("--plot", default=os.path.join(HERE, "..", "docs", "img",
                                                       "bench_jax_mpi4jax.png"))  # fmt: skip
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def mpi4jax_missing():
    """Return why mpi4jax cannot be imported, or None."""
    try:
        import mpi4jax  # noqa: F401
    except ImportError as exc:
        return f"mpi4jax is not installed ({exc})"
    return None


# -- the worker: one MPI job ------------------------------------------------------------------


def timed_blocks(comm, calls: dict, repeats: int, block_seconds: float) -> dict:
    """Return {contender: median seconds per call}: blocks in turn, the slowest rank's mean."""
    iterations = {}
    for name, call in calls.items():
        call()  # compiles a jitted contender
        start = time.perf_counter()
        for _ in range(3):
            call()
        estimate = slowest_rank(comm, [(time.perf_counter() - start) / 3])[0]
        iterations[name] = max(2, min(1000, int(block_seconds / max(estimate, 1e-7))))
    times = {name: [] for name in calls}
    names = list(calls)
    for repeat in range(repeats):
        shift = repeat % len(names)  # rotate the order: no contender always runs first
        for name in names[shift:] + names[:shift]:
            call, count = calls[name], iterations[name]
            call()
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(count):
                call()
            times[name] += slowest_rank(comm, [(time.perf_counter() - start) / count])
    return {name: statistics.median(values) for name, values in times.items()}


def allreduce_calls(contenders: list, x, comm, hvd, core) -> tuple:
    """Return ({contender: one blocking all-reduce of x}, {contender: its last result})."""
    import jax
    import numpy as np
    from mpi4py import MPI

    results = {}
    calls = {}
    if "hvd-jit" in contenders:
        reduce = jax.jit(lambda a: hvd.allreduce(a, op=hvd.Sum, name="bench.jit"))

        def hvd_jit():
            results["hvd-jit"] = reduce(x).block_until_ready()

        calls["hvd-jit"] = hvd_jit
    if "mpi4jax-jit" in contenders:
        import mpi4jax

        reduce_4j = jax.jit(lambda a: mpi4jax.allreduce(a, op=MPI.SUM, comm=comm))

        def mpi4jax_jit():
            results["mpi4jax-jit"] = reduce_4j(x).block_until_ready()

        calls["mpi4jax-jit"] = mpi4jax_jit
    if "mpi4py" in contenders:
        send, receive = np.asarray(x).copy(), np.empty(x.shape, np.float32)

        def mpi4py_call():
            comm.Allreduce(send, receive, op=MPI.SUM)
            results["mpi4py"] = receive

        calls["mpi4py"] = mpi4py_call
    if "hvd-numpy" in contenders:

        def hvd_numpy():
            results["hvd-numpy"] = core.allreduce(np.asarray(x), op=core.Sum, name="bench.np")

        calls["hvd-numpy"] = hvd_numpy
    donated = {
        "hvd-jit-donated": lambda a: hvd.allreduce(a, op=hvd.Max, name="bench.donated"),
        "mpi4jax-jit-donated": lambda a: _mpi4jax_allreduce(a, MPI.MAX, comm),
    }
    for name, function in donated.items():
        if name in contenders:
            calls[name] = _fed_back(jax.jit(function, donate_argnums=0), x, results, name)
    return calls, results


def _mpi4jax_allreduce(a, op, comm):
    import mpi4jax

    return mpi4jax.allreduce(a, op=op, comm=comm)


def _fed_back(reduce, x, results: dict, name: str):
    """Return a call of jitted `reduce` (which donates its input) on its own last result."""
    results[name] = x.copy()  # x itself is not donated: the other contenders read it

    def call():
        results[name] = reduce(results[name]).block_until_ready()

    return call


def allreduce_part(args, comm, hvd, core) -> tuple:
    import jax.numpy as jnp
    import numpy as np

    contenders = [c for c in args.contenders.split(",") if c in ALLREDUCE]
    rows, checks = [], {}
    if not contenders:
        return rows, checks
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        count = size // 4
        x = jnp.full((count,), comm.rank + 1, dtype=jnp.float32)
        calls, results = allreduce_calls(contenders, x, comm, hvd, core)
        medians = timed_blocks(comm, calls, args.repeats, args.block_seconds)
        expected = comm.size * (comm.size + 1) / 2
        for name in contenders:
            # (the donated contenders take the Max, the others the Sum, of rank + 1)
            want = comm.size if name.endswith("-donated") else expected
            exact = bool(np.all(np.asarray(results[name]) == want))
            exact = checks[f"{size} {name}"] = all(comm.allgather(exact))
            rows.append({"np": comm.size, "bytes": size, "contender": name,
                         "median_us": 1e6 * medians[name], "exact": exact})  # fmt: skip
        del calls, results
        if comm.rank == 0:
            print(f"np {comm.size}, {size} B: " + ", ".join(
                f"{n} {1e6 * medians[n]:.1f} us" for n in contenders), flush=True)  # fmt: skip
    return rows, checks


def digits(rank: int, size: int, batch: int):
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0).reshape(len(data.target), 64).astype(np.float32)
    start = rank * batch % (len(images) - batch)
    return images[start : start + batch], data.target[start : start + batch].astype(np.int32)


def training_part(args, comm, hvd) -> tuple:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from mpi4py import MPI

    contenders = [c for c in args.contenders.split(",") if c in TRAINING]
    if comm.size == 1:
        contenders = [c for c in contenders if c == "local"]
    rows, checks = [], {}
    if not contenders:
        return rows, checks
    x, y = digits(comm.rank, comm.size, args.batch_size)

    def init(spec):
        if spec is CNN:
            keys = jax.random.split(jax.random.key(0), len(spec) + 1)
            convs = [{"w": jax.random.normal(k, (3, 3, a, b)) * np.sqrt(2.0 / (9 * a)),
                      "b": jnp.zeros(b)} for k, (a, b) in zip(keys, spec)]  # fmt: skip
            flat = 64 * spec[-1][1]
            dense = {"w": jax.random.normal(keys[-1], (flat, 10)) * np.sqrt(2.0 / flat),
                     "b": jnp.zeros(10)}  # fmt: skip
            return [*convs, dense]
        keys = jax.random.split(jax.random.key(0), len(spec) - 1)
        return [
            {"w": jax.random.normal(k, (a, b)) * np.sqrt(2.0 / a), "b": jnp.zeros(b)}
            for k, a, b in zip(keys, spec[:-1], spec[1:])
        ]

    def loss_fn(params, x, y):
        if params[0]["w"].ndim == 4:  # the CNN: images as NHWC
            x = x.reshape(-1, 8, 8, 1)
            for layer in params[:-1]:
                x = jax.lax.conv_general_dilated(
                    x, layer["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
                )
                x = jax.nn.relu(x + layer["b"])
            x = x.reshape(x.shape[0], -1)
        else:
            for layer in params[:-1]:
                x = jax.nn.relu(x @ layer["w"] + layer["b"])
        logits = x @ params[-1]["w"] + params[-1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def mpi4jax_mean(grads):
        import mpi4jax

        def mean(g):
            return mpi4jax.allreduce(g, op=MPI.SUM, comm=comm) / comm.size

        return jax.tree.map(mean, grads)

    def step_of(contender):
        sgd = optax.sgd(0.01, momentum=0.9)
        tx = hvd.DistributedOptimizer(sgd, name="bench.grads") if contender == "hvd" else sgd
        reduce = mpi4jax_mean if contender == "mpi4jax" else (lambda g: g)

        @jax.jit
        def step(params, opt_state, x, y):
            grads = reduce(jax.grad(loss_fn)(params, x, y))
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return tx, step

    for model in args.models.split(","):
        start = init(MODELS[model])
        runs = {}
        for contender in contenders:
            tx, step = step_of(contender)
            runs[contender] = [step, start, tx.init(start)]
        # Two steps from the same parameters on the same data: hvd and mpi4jax agree.
        if "hvd" in runs and "mpi4jax" in runs:
            ends = []
            for contender in ("hvd", "mpi4jax"):
                step, params, opt_state = runs[contender]
                for _ in range(2):
                    params, opt_state = step(params, opt_state, x, y)
                ends.append(params)
            diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(*map(jax.tree.leaves, ends)))
            checks[f"{model}:hvd vs mpi4jax"] = slowest_rank(comm, [diff])[0]
        times = {c: [] for c in contenders}
        for round_ in range(args.rounds):
            shift = round_ % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                run = runs[contender]
                for _ in range(args.warmup):
                    run[1], run[2] = jax.block_until_ready(run[0](run[1], run[2], x, y))
                comm.Barrier()
                block = []
                for _ in range(args.steps):
                    begin = time.perf_counter()
                    run[1], run[2] = jax.block_until_ready(run[0](run[1], run[2], x, y))
                    block.append(time.perf_counter() - begin)
                times[contender] += slowest_rank(comm, block)
        parameters = sum(leaf.size for leaf in jax.tree.leaves(start))
        for contender, values in times.items():
            median = statistics.median(values)
            rows.append({"np": comm.size, "model": model, "parameters": parameters,
                         "contender": contender, "median_ms": 1e3 * median,
                         "steps_per_s": 1 / median, "steps": len(values)})  # fmt: skip
        if comm.rank == 0:
            print(f"np {comm.size}, {model}: " + ", ".join(
                f"{r['contender']} {r['steps_per_s']:.0f} steps/s" for r in rows
                if r["model"] == model), flush=True)  # fmt: skip
    return rows, checks


def worker(args) -> None:
    import horovodlite.jax as hvd
    from mpi4py import MPI

    import horovodlite as core

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()  # mpi4jax's and mpi4py's traffic, apart from anything else
    allreduce, allreduce_checks = allreduce_part(args, comm, hvd, core)
    training, training_checks = training_part(args, comm, hvd)
    if comm.rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"np": comm.size, "allreduce": allreduce, "training": training,
                       "exact": allreduce_checks, "checks": training_checks}, f)  # fmt: skip
    comm.Free()


# -- the driver: one job per rank count, then the tables ---------------------------------------


def allreduce_table(rows: list) -> str:
    by = {}
    for r in rows:
        by.setdefault((r["np"], r["bytes"]), {})[r["contender"]] = r
    present = [c for c in ALLREDUCE if any(r["contender"] == c for r in rows)]
    pairs = [(ours, theirs) for ours, theirs in RATIOS if ours in present and theirs in present]
    header = ["ranks", "size", *present] + [f"{ours} / {theirs}" for ours, theirs in pairs]
    lines = [header, ["---"] * len(header)]
    for (np, size), cells in sorted(by.items()):
        line = [str(np), human(size)]
        line += [f"{cells[c]['median_us']:,.1f}" + ("" if cells[c]["exact"] else " !")
                 if c in cells else "" for c in present]  # fmt: skip
        for ours, theirs in pairs:
            line.append(f"{cells[ours]['median_us'] / cells[theirs]['median_us']:.2f}")
        lines.append(line)
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def training_table(rows: list) -> str:
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["parameters"], r["np"]), {})[r["contender"]] = r
    present = [c for c in TRAINING if any(r["contender"] == c for r in rows)]
    ratio = "hvd" in present and "mpi4jax" in present
    header = ["model", "parameters", "ranks", *present] + (["hvd / mpi4jax"] if ratio else [])
    lines = [header, ["---"] * len(header)]
    for (model, parameters, np), cells in sorted(by.items()):
        line = [model, f"{parameters:,}", str(np)]
        line += [f"{cells[c]['steps_per_s']:,.0f}" if c in cells else "" for c in present]
        if ratio and "hvd" in cells:
            line.append(f"{cells['hvd']['steps_per_s'] / cells['mpi4jax']['steps_per_s']:.2f}")
        lines.append(line)
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def human(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def plot(rows: list, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["np"] for r in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.5 * len(counts), 4), squeeze=False)
    for ax, np in zip(axes[0], counts):
        for contender in ALLREDUCE:
            points = sorted((r["bytes"], r["median_us"]) for r in rows
                            if r["np"] == np and r["contender"] == contender)  # fmt: skip
            if points:
                ax.loglog(*zip(*points), marker="o", label=contender)
        ax.set_title(f"all-reduce of float32, {np} ranks")
        ax.set_xlabel("bytes")
        ax.set_ylabel("µs per call (median, slowest rank)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"plot: {path}", flush=True)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    contenders = args.contenders.split(",")
    unknown = set(contenders) - set(ALLREDUCE + TRAINING)
    if unknown:
        sys.exit(f"unknown contenders {sorted(unknown)}: choose from {ALLREDUCE + TRAINING}")
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown and set(contenders) & set(TRAINING):
        sys.exit(f"unknown models {sorted(unknown)}: choose from {tuple(MODELS)} (or leave out "
                 f"the training contenders {TRAINING})")  # fmt: skip
    missing = mpi4jax_missing() if NEEDS_MPI4JAX & set(contenders) else None
    if missing:
        print(f"skipped: {missing}; it is only needed for this benchmark: pip install nanobind "
              "cython, then MPI4JAX_BUILD_MPICC=$(which mpicc) pip install --no-build-isolation "
              "mpi4jax (or run only --contenders "
              "hvd-jit,mpi4py,hvd-numpy,hvd-jit-donated,local,hvd)")  # fmt: skip
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    load_before = os.getloadavg()
    counts = [int(n) for n in args.np.split(",")]
    jobs = run_jobs(__file__, counts, sys.argv[1:], args.out, timeout=args.timeout)
    import jax

    versions = {"jax": jax.__version__}
    if not mpi4jax_missing():
        import mpi4jax

        versions["mpi4jax"] = mpi4jax.__version__
    report = {
        "benchmark": "jax_vs_mpi4jax",
        "command": " ".join(["python", "benchmarks/jax_vs_mpi4jax.py", *sys.argv[1:]]),
        "machine": machine(load_before, **versions),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "out", "plot")},
        # glibc's allocator settings, where set: they decide whether XLA's fresh buffers fault
        "malloc": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "allreduce": [r for job in jobs for r in job["allreduce"]],
        "training": [r for job in jobs for r in job["training"]],
        "allreduce_exact": {f"np{job['np']} {k}": v for job in jobs
                            for k, v in job["exact"].items()},
        "training_max_abs_diff": {f"np{job['np']} {k}": v for job in jobs
                                  for k, v in job["checks"].items()},
    }  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if report["allreduce"]:
        print(allreduce_table(report["allreduce"]))
        print("all-reduce: µs per call, median of blocks, slowest rank (! = wrong result)\n")
        if args.plot:
            plot(report["allreduce"], args.plot)
    if report["training"]:
        print(training_table(report["training"]))
        print("training: steps per second (median step, slowest rank)")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
