"""Engine benchmark: fused async all-reduce of ResNet-50's gradients, and the engine's overheads.

    python benchmarks/engine_fusion.py --np 2,4          # launches one mpiexec job per count
    mpiexec -n 2 python benchmarks/engine_fusion.py --worker   # one job, prints JSON

Measures, in one job per rank count, taking turns so that background load hits all alike:
  * ResNet-50's 161 float32 gradient tensors (25,557,032 values) all-reduced (Average) as
    - fused:     161 named allreduce_async() calls, then synchronize() (the engine fuses them),
    - unfused:   the same with the fusion threshold set to 0,
    - one-by-one: 161 synchronous hvd.allreduce() calls,
    - one buffer: one hvd.allreduce() of a single 25,557,032-value array;
  * the idle engine: cycles per second and CPU seconds per second with nothing to do;
  * steady-state negotiation: a step of many small named async all-reduces, with names the cache
    knows (one small bit-vector all-reduce per cycle) versus new names every step (a full
    metadata exchange every cycle).
Each timed step starts after a barrier and counts the slowest rank; medians over repetitions.

    python benchmarks/engine_fusion.py --paths torch,tensorflow,keras --np 2,3,4

measures instead, per framework and rank count, the training step's gradient path side by side:
  * fused:         torch: 161 allreduce_async_() then synchronize() on separate tensors;
                   tensorflow: one grouped_allreduce() (DistributedGradientTape's path);
                   keras: the DistributedOptimizer's gradient reduction (GradientReducer);
  * one buffer:    one allreduce of a single tensor holding the same bytes (torch: allreduce_,
                   in place, as the fused path);
  * one sync each: 161 synchronous allreduce() calls;
  * optimizer:     torch only: DistributedOptimizer.synchronize() on 161 parameters given new
                   gradients each step (as after zero_grad()): the training script's own path.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
from training_jobs import job_result, run_job

# torchvision.models.resnet50(): the shapes of its 161 parameters, in named_parameters() order.
RESNET50_SHAPES = [
    # stem: conv1, bn1
    (64, 3, 7, 7),
    (64,),
    (64,),
    # layer1.0: conv1, bn1, conv2, bn2, conv3, bn3, downsample conv, bn
    (64, 64, 1, 1),
    (64,),
    (64,),
    (64, 64, 3, 3),
    (64,),
    (64,),
    (256, 64, 1, 1),
    (256,),
    (256,),
    (256, 64, 1, 1),
    (256,),
    (256,),
    # layer1.1: conv1, bn1, conv2, bn2, conv3, bn3
    (64, 256, 1, 1),
    (64,),
    (64,),
    (64, 64, 3, 3),
    (64,),
    (64,),
    (256, 64, 1, 1),
    (256,),
    (256,),
    # layer1.2: conv1, bn1, conv2, bn2, conv3, bn3
    (64, 256, 1, 1),
    (64,),
    (64,),
    (64, 64, 3, 3),
    (64,),
    (64,),
    (256, 64, 1, 1),
    (256,),
    (256,),
    # layer2.0: conv1, bn1, conv2, bn2, conv3, bn3, downsample conv, bn
    (128, 256, 1, 1),
    (128,),
    (128,),
    (128, 128, 3, 3),
    (128,),
    (128,),
    (512, 128, 1, 1),
    (512,),
    (512,),
    (512, 256, 1, 1),
    (512,),
    (512,),
    # layer2.1: conv1, bn1, conv2, bn2, conv3, bn3
    (128, 512, 1, 1),
    (128,),
    (128,),
    (128, 128, 3, 3),
    (128,),
    (128,),
    (512, 128, 1, 1),
    (512,),
    (512,),
    # layer2.2: conv1, bn1, conv2, bn2, conv3, bn3
    (128, 512, 1, 1),
    (128,),
    (128,),
    (128, 128, 3, 3),
    (128,),
    (128,),
    (512, 128, 1, 1),
    (512,),
    (512,),
    # layer2.3: conv1, bn1, conv2, bn2, conv3, bn3
    (128, 512, 1, 1),
    (128,),
    (128,),
    (128, 128, 3, 3),
    (128,),
    (128,),
    (512, 128, 1, 1),
    (512,),
    (512,),
    # layer3.0: conv1, bn1, conv2, bn2, conv3, bn3, downsample conv, bn
    (256, 512, 1, 1),
    (256,),
    (256,),
    (256, 256, 3, 3),
    (256,),
    (256,),
    (1024, 256, 1, 1),
    (1024,),
    (1024,),
    (1024, 512, 1, 1),
    (1024,),
    (1024,),
    # layer3.1: conv1, bn1, conv2, bn2, conv3, bn3
    (256, 1024, 1, 1),
    (256,),
    (256,),
    (256, 256, 3, 3),
    (256,),
    (256,),
    (1024, 256, 1, 1),
    (1024,),
    (1024,),
    # layer3.2: conv1, bn1, conv2, bn2, conv3, bn3
    (256, 1024, 1, 1),
    (256,),
    (256,),
    (256, 256, 3, 3),
    (256,),
    (256,),
    (1024, 256, 1, 1),
    (1024,),
    (1024,),
    # layer3.3: conv1, bn1, conv2, bn2, conv3, bn3
    (256, 1024, 1, 1),
    (256,),
    (256,),
    (256, 256, 3, 3),
    (256,),
    (256,),
    (1024, 256, 1, 1),
    (1024,),
    (1024,),
    # layer3.4: conv1, bn1, conv2, bn2, conv3, bn3
    (256, 1024, 1, 1),
    (256,),
    (256,),
    (256, 256, 3, 3),
    (256,),
    (256,),
    (1024, 256, 1, 1),
    (1024,),
    (1024,),
    # layer3.5: conv1, bn1, conv2, bn2, conv3, bn3
    (256, 1024, 1, 1),
    (256,),
    (256,),
    (256, 256, 3, 3),
    (256,),
    (256,),
    (1024, 256, 1, 1),
    (1024,),
    (1024,),
    # layer4.0: conv1, bn1, conv2, bn2, conv3, bn3, downsample conv, bn
    (512, 1024, 1, 1),
    (512,),
    (512,),
    (512, 512, 3, 3),
    (512,),
    (512,),
    (2048, 512, 1, 1),
    (2048,),
    (2048,),
    (2048, 1024, 1, 1),
    (2048,),
    (2048,),
    # layer4.1: conv1, bn1, conv2, bn2, conv3, bn3
    (512, 2048, 1, 1),
    (512,),
    (512,),
    (512, 512, 3, 3),
    (512,),
    (512,),
    (2048, 512, 1, 1),
    (2048,),
    (2048,),
    # layer4.2: conv1, bn1, conv2, bn2, conv3, bn3
    (512, 2048, 1, 1),
    (512,),
    (512,),
    (512, 512, 3, 3),
    (512,),
    (512,),
    (2048, 512, 1, 1),
    (2048,),
    (2048,),
    # fc
    (1000, 2048),
    (1000,),
]
assert len(RESNET50_SHAPES) == 161
assert sum(math.prod(shape) for shape in RESNET50_SHAPES) == 25_557_032

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(hvd, step) -> float:
    """Run `step()` on every rank after a barrier; return the slowest rank's seconds."""
    hvd.barrier()
    start = time.perf_counter()
    step()
    elapsed = time.perf_counter() - start
    return max(hvd.allgather_object(elapsed))


def resnet50(hvd, engine, repeats: int) -> dict:
    rng = np.random.default_rng(hvd.rank())
    grads = [rng.standard_normal(shape).astype(np.float32) for shape in RESNET50_SHAPES]
    flat = np.concatenate([g.reshape(-1) for g in grads])
    threshold = engine.fusion_threshold

    def asynchronous():
        handles = [hvd.allreduce_async(g, name=f"grad.{i}") for i, g in enumerate(grads)]
        return [hvd.synchronize(h) for h in handles]

    def fused():
        engine.fusion_threshold = threshold
        return asynchronous()

    def unfused():
        engine.fusion_threshold = 0
        try:
            return asynchronous()
        finally:
            engine.fusion_threshold = threshold

    def one_by_one():
        return [hvd.allreduce(g, name=f"grad.{i}") for i, g in enumerate(grads)]

    def one_buffer():
        return hvd.allreduce(flat, name="flat")

    methods = {"fused": fused, "unfused": unfused, "one-by-one": one_by_one,
               "one buffer": one_buffer}  # fmt: skip
    # The methods compute the same thing: check it once, untimed.
    expected = one_buffer()
    for name in ("fused", "unfused", "one-by-one"):
        got = np.concatenate([r.reshape(-1) for r in methods[name]()])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    times = {name: [] for name in methods}
    for _ in range(repeats):
        for name, step in methods.items():
            hvd.barrier()  # every rank's engine sees the same threshold before any submission
            times[name].append(timed(hvd, step))
    return {name: {"median_s": float(np.median(t)), "min_s": min(t), "max_s": max(t)}
            for name, t in times.items()}  # fmt: skip


def idle(hvd, engine, seconds: float) -> dict:
    hvd.barrier()
    time.sleep(1.5)  # past the engine's fast cycles after the last work
    cycles, cpu, wall = engine.cycles, time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cycles, cpu = engine.cycles - cycles, time.process_time() - cpu
    wall = time.perf_counter() - wall
    per_rank = hvd.allgather_object((cycles / wall, cpu / wall))
    return {
        "cycles_per_s": float(np.median([c for c, _ in per_rank])),
        "cpu_s_per_s": float(np.median([c for _, c in per_rank])),
    }


def negotiation(hvd, engine, tensors: int, steps: int, repeats: int) -> dict:
    x = np.ones(16, dtype=np.float32)
    counter = [0]

    def step(fresh: bool):
        prefix = f"fresh{counter[0]}" if fresh else "steady"
        counter[0] += 1
        handles = [hvd.allreduce_async(x, name=f"{prefix}.{i}") for i in range(tensors)]
        for handle in handles:
            hvd.synchronize(handle)

    def run(kind: str):
        for _ in range(steps):
            if kind == "one-by-one":
                for i in range(tensors):
                    hvd.allreduce(x, name=f"sync.{i}")
            else:
                step(kind == "new names")

    kinds = ["cached names", "new names", "one-by-one"]
    run("cached names")  # the first step fills the cache
    times = {kind: [] for kind in kinds}
    cycles = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind in kinds:
            before = engine.cycles
            times[kind].append(timed(hvd, lambda kind=kind: run(kind)) / steps)
            cycles[kind].append((engine.cycles - before) / steps)
    return {kind: {"median_step_s": float(np.median(times[kind])),
                   "cycles_per_step": float(np.median(cycles[kind]))}
            for kind in kinds}  # fmt: skip


def _framework(name: str):
    """Return (hvd module, tensor from numpy, fused step maker) for a framework's path."""
    if name == "torch":
        import horovodlite.torch as hvd
        import torch

        def fused(grads):
            def step():
                handles = [hvd.allreduce_async_(g, name=f"grad.{i}") for i, g in enumerate(grads)]
                return [hvd.synchronize(h) for h in handles]

            return step

        return hvd, torch.from_numpy, fused
    import horovodlite.tensorflow as hvd
    import tensorflow as tf

    if name == "tensorflow":
        return hvd, tf.convert_to_tensor, lambda grads: lambda: hvd.grouped_allreduce(grads)
    import horovodlite.keras as hvd_keras
    import keras

    hvd_keras.init()

    def keras_fused(grads):
        # The reduction DistributedOptimizer.apply runs on the gradients (op Average).
        optimizer = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))
        reduce = optimizer._horovodlite
        return lambda: reduce(list(grads))

    return hvd_keras, tf.convert_to_tensor, keras_fused


def _torch_optimizer_step(hvd, grads: list):
    """Return a step of DistributedOptimizer.synchronize() on parameters with new gradients."""
    import torch

    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    named = [(f"p.{i}", p) for i, p in enumerate(params)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named)

    def step():
        for param, grad in zip(params, grads):
            param.grad = grad
        optimizer.synchronize()
        return [param.grad for param in params]

    step()  # the first step agrees on the gradients
    return step


def gradient_paths(framework: str, repeats: int) -> dict:
    """Time one framework's fused gradient path, one buffer and one sync each, side by side."""
    import horovodlite as core

    hvd, tensor, make_fused = _framework(framework)
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in RESNET50_SHAPES]
    grads = [tensor(a) for a in arrays]
    flat = tensor(np.concatenate([a.reshape(-1) for a in arrays]))
    methods = {
        "fused": make_fused(grads),
        # The floor: the same bytes in one tensor, reduced in place where the framework has it
        # (torch's allreduce_), as the fused path reduces the gradients in place.
        "one buffer": (lambda: hvd.allreduce_(flat, name="flat")) if framework == "torch"
        else (lambda: hvd.allreduce(flat, name="flat")),
        "one sync each": lambda: [hvd.allreduce(g, name=f"sync.{i}") for i, g in enumerate(grads)],
    }
    if framework == "torch":
        methods["optimizer"] = _torch_optimizer_step(hvd, grads)
        # The same buffer in memory from torch's own allocator, as the gradients are: numpy
        # advises the kernel to back an allocation of 4 MiB or more with huge pages, and MPICH's
        # single copy between processes (CMA) moves those about twice as fast as 4 KiB pages.
        import torch

        own = torch.cat([g.reshape(-1) for g in grads])
        methods["one buffer, torch's memory"] = lambda: hvd.allreduce_(own, name="flat.torch")
    expected = np.asarray(methods["one buffer"]())
    for name in [n for n in methods if n != "one buffer"]:
        results = methods[name]()
        results = results if isinstance(results, list) else [results]  # (one buffer: one tensor)
        got = np.concatenate([np.asarray(r).reshape(-1) for r in results])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    # Beside the wall time (the slowest rank), what a busy machine disturbs less: the CPU time
    # the ranks spent (all threads, mean over ranks) and the engine's cycles per step.
    engine = core.state.current().engine
    times, cpu, cycles = ({name: [] for name in methods} for _ in range(3))
    for _ in range(repeats):
        for name, step in methods.items():
            before = time.process_time(), engine.cycles
            times[name].append(timed(core, step))
            cpu[name].append(np.mean(core.allgather_object(time.process_time() - before[0])))
            cycles[name].append(engine.cycles - before[1])
    return {name: {"median_s": float(np.median(t)), "min_s": min(t), "max_s": max(t),
                   "cpu_s": float(np.median(cpu[name])),
                   "cycles": float(np.median(cycles[name]))}
            for name, t in times.items()}  # fmt: skip


def worker(args) -> None:
    if args.path:
        gradients = gradient_paths(args.path, args.repeats)
        import horovodlite as core

        result = {"ranks": core.size(), "path": args.path, "gradients": gradients}
        if core.rank() == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return
    import horovodlite as hvd

    hvd.init()
    engine = hvd.state.current().engine
    result = {
        "ranks": hvd.size(),
        "cycle_time_ms": engine.cycle_time * 1000,
        "fusion_threshold": engine.fusion_threshold,
        "resnet50": resnet50(hvd, engine, args.repeats),
        "idle": idle(hvd, engine, args.idle_seconds),
        "negotiation": negotiation(hvd, engine, args.tensors, args.steps, args.repeats),
    }
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)


def launch_paths(args) -> list:
    """Run every --paths framework at every --np count; return their results."""
    results = []
    for path in args.paths:
        for np_ in args.np:
            command = [sys.executable, os.path.abspath(__file__), "--worker", "--path", path,
                       "--repeats", str(args.repeats)]  # fmt: skip
            print(f"$ {np_} ranks: {' '.join(command)}", file=sys.stderr, flush=True)
            results.append(job_result(run_job(np_, command)))
            results[-1]["load_average"] = os.getloadavg()
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # kept if a later job fails
    return results


def report_paths(results: list) -> str:
    lines = ["ResNet-50's 161 float32 gradients (97.5 MiB), median ms per step; fused / one "
             "buffer (target <= 1.15), one sync each / fused (target >= 1.3)",
             f"{'path':<11}{'ranks':>6}{'fused':>10}{'one buffer':>12}{'one sync each':>15}"
             f"{'fused/buffer':>14}{'sync/fused':>12}{'load avg':>10}"
             f"{'CPU ms: fused, buffer, each':>30}{'fused cycles':>14}"]  # fmt: skip
    optimizer, torch_memory = [], []
    for r in results:
        g = {k: v["median_s"] * 1e3 for k, v in r["gradients"].items()}
        if "optimizer" in g:
            optimizer.append(f"{r['ranks']} ranks: {g['optimizer']:.1f} ms, "
                             f"{g['optimizer'] / g['one buffer']:.2f}x one buffer")  # fmt: skip
        if "one buffer, torch's memory" in g:
            own = g["one buffer, torch's memory"]
            torch_memory.append(f"{r['ranks']} ranks: {own:.1f} ms, fused "
                                f"{g['fused'] / own:.2f}x it")  # fmt: skip
        lines.append(
            f"{r['path']:<11}{r['ranks']:>6}{g['fused']:>10.1f}{g['one buffer']:>12.1f}"
            f"{g['one sync each']:>15.1f}{g['fused'] / g['one buffer']:>13.2f}x"
            f"{g['one sync each'] / g['fused']:>11.2f}x{r['load_average'][0]:>10.2f}"
            + "".join(
                f"{r['gradients'][k].get('cpu_s', float('nan')) * 1e3:>10.0f}"
                for k in ("fused", "one buffer", "one sync each")
            )  # fmt: skip
            + f"{r['gradients']['fused'].get('cycles', float('nan')):>14.1f}"
        )
    if optimizer:
        lines.append("torch DistributedOptimizer.synchronize(): "
                     + "; ".join(optimizer))  # fmt: skip
    if torch_memory:
        lines.append("torch one buffer in torch's own memory (allreduce_): "
                     + "; ".join(torch_memory))  # fmt: skip
    return "\n".join(lines)


def launch(args) -> list:
    results = []
    for np_ in args.np:
        command = [sys.executable, os.path.abspath(__file__), "--worker",
                   "--repeats", str(args.repeats), "--idle-seconds", str(args.idle_seconds),
                   "--tensors", str(args.tensors), "--steps", str(args.steps)]  # fmt: skip
        print(f"$ {np_} ranks: {' '.join(command)}", file=sys.stderr, flush=True)
        results.append(job_result(run_job(np_, command)))
    return results


def report(results: list) -> str:
    counts = [r["ranks"] for r in results]
    lines = ["ResNet-50 gradients, 161 float32 tensors, 97.5 MiB: median ms per step "
             "(x slower than one buffer)"]  # fmt: skip
    lines.append(f"{'method':<12}" + "".join(f"{f'{n} ranks':>22}" for n in counts))
    for method in ("fused", "unfused", "one-by-one", "one buffer"):
        cells = []
        for r in results:
            t = r["resnet50"][method]["median_s"]
            base = r["resnet50"]["one buffer"]["median_s"]
            cells.append(f"{t * 1e3:>12.1f} ({t / base:>5.2f}x)")
        lines.append(f"{method:<12}" + "".join(f"{c:>22}" for c in cells))
    lines.append("")
    speedups = [r["resnet50"]["one-by-one"]["median_s"] / r["resnet50"]["fused"]["median_s"]
                for r in results]  # fmt: skip
    lines.append("fused speed-up over one-by-one: " + ", ".join(
        f"{r['ranks']} ranks {s:.2f}x" for r, s in zip(results, speedups)))  # fmt: skip
    lines.append("")
    lines.append(
        "idle engine: "
        + ", ".join(
            f"{r['ranks']} ranks {r['idle']['cycles_per_s']:.0f} cycles/s, "
            f"{r['idle']['cpu_s_per_s'] * 100:.1f}% of a core per rank"
            for r in results
        )
    )
    lines.append("")
    tensors = results[0].get("tensors", "")
    lines.append(f"negotiation, a step of small named async all-reduces{tensors}: "
                 "median ms per step (engine cycles per step)")  # fmt: skip
    lines.append(f"{'names':<14}" + "".join(f"{f'{n} ranks':>20}" for n in counts))
    for kind in ("cached names", "new names", "one-by-one"):
        cells = [
            f"{r['negotiation'][kind]['median_step_s'] * 1e3:>10.2f} "
            f"({r['negotiation'][kind]['cycles_per_step']:>4.1f})"
            for r in results
        ]
        lines.append(f"{kind:<14}" + "".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4])
    parser.add_argument("--worker", action="store_true", help="run inside an MPI job")
    parser.add_argument(
        "--paths",
        type=lambda s: s.split(","),
        default=None,
        help="torch,tensorflow,keras: time the frameworks' gradient paths",
    )
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--tensors", type=int, default=100, help="per negotiation step")
    parser.add_argument("--steps", type=int, default=20, help="negotiation steps per repeat")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "engine_fusion.json"))
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.paths:
        load = os.getloadavg()
        results = launch_paths(args)
        text = report_paths(results)
        print(text)
        out = args.out.replace("engine_fusion.json", "engine_fusion_paths.json")
        with open(out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "load_average_before": load,
                       "results": results, "table": text}, f, indent=1)  # fmt: skip
        return
    results = launch(args)
    for r in results:
        r["tensors"] = f" ({args.tensors} x 16 float32 per step)"
    text = report(results)
    print(text)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "results": results, "table": text}, f, indent=1)


if __name__ == "__main__":
    main()
