"""Synthetic training throughput (img/s): horovodlite against real Horovod and torch DDP.

The kind of benchmark Horovod ships as pytorch_synthetic_benchmark, written here: every rank
trains a torchvision-style model (ResNet-18/50, AlexNet) on one fixed random batch of
ImageNet-sized images (3x224x224, 1000 random labels), SGD wrapped in each library's data
parallelism; after warm-up steps, timed iterations of a few steps each give img/s. Contenders:

    local         no communication at all: the compute part (at 1 rank: the compute time)
    hvdlite       horovodlite.torch.DistributedOptimizer (this venv's MPICH)
    hvdlite-gloo  the same with HOROVODLITE_TRANSPORT=gloo: the gradients' data over
                  torch.distributed's Gloo, the agreement over MPI (not run unless asked)
    horovod-mpi   real Horovod's DistributedOptimizer, MPI controller and operations
    horovod-gloo  real Horovod's DistributedOptimizer, Gloo controller and operations
    ddp           torch DistributedDataParallel on the Gloo backend

Real Horovod runs where its venv exists (HOROVOD_PYTHON, default /tmp/hvd-real/bin/python, as
../shared/tools/hvd-real.sh builds it; launched with that venv's mpiexec), else it is skipped.
Two settings: `host`, ranks on this machine (shared memory and loopback), and `sim`, one rank
on each of several simulated hosts whose links are capped (horovodlite.run.simcluster: network
namespaces on a bridge; needs root). Each contender runs `--runs` times, the contenders taking
turns; the table gives the median run's total img/s, beside the bounds that the measured compute
time and the link rate allow:

    compute     step time of `local` at 1 rank (one process alone on the machine)
    comm        ring all-reduce bytes per rank, 2(n-1)/n x gradient bytes, over the link rate
    serial      n x batch / (compute + comm): no overlap of communication with backward
    overlapped  n x batch / max(compute, comm): communication entirely hidden (or compute)

    python benchmarks/synthetic_training.py --settings host,sim --runs 3
"""

import argparse
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
CONTENDERS = ("hvdlite", "horovod-mpi", "horovod-gloo", "ddp")
HOROVOD_PYTHON = os.environ.get("HOROVOD_PYTHON", "/tmp/hvd-real/bin/python")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="host,sim", help="host and/or sim")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--runs", type=int, default=3, help="runs per contender (median kept)")
    parser.add_argument("--np", type=int, default=2, help="ranks in the host setting")
    parser.add_argument("--model", default="resnet18", help="host setting's model")
    parser.add_argument("--batch-size", type=int, default=16, help="host setting, per rank")
    parser.add_argument("--sim-hosts", type=int, default=4, help="simulated hosts, 1 rank each")
    parser.add_argument("--sim-model", default="alexnet")
    parser.add_argument("--sim-batch-size", type=int, default=8)
    parser.add_argument("--link-rate", default="1gbit")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps")
    parser.add_argument("--steps", type=int, default=2, help="steps per timed iteration")
    parser.add_argument("--iters", type=int, default=3, help="timed iterations per run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job")
    parser.add_argument("--out", default=os.path.join(RESULTS, "synthetic_training.json"))
    parser.add_argument("--plot", default=None, help="write a bar chart here (matplotlib)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-batch", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- the models: torchvision's definitions, written out --------------------------------------
# (The PyPI torchvision wheel's compiled ops expect CUDA libraries beside CPU torch; these give
# the same layers and parameter counts: resnet18 11,689,512, resnet50 25,557,032, alexnet
# 61,100,840. `tiny` is for smoke tests.)


def build_model(name: str):
    from torch import nn

    def conv_bn(cin, cout, kernel, stride=1, relu=True):
        layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
                  nn.BatchNorm2d(cout)]  # fmt: skip
        return layers + [nn.ReLU(inplace=True)] if relu else layers

    class Block(nn.Module):
        """A residual block: basic (two 3x3) or bottleneck (1x1, 3x3, 1x1 with 4x expansion)."""

        def __init__(self, cin, planes, stride, bottleneck):
            super().__init__()
            cout = planes * (4 if bottleneck else 1)
            if bottleneck:
                body = [*conv_bn(cin, planes, 1), *conv_bn(planes, planes, 3, stride),
                        *conv_bn(planes, cout, 1, relu=False)]  # fmt: skip
            else:
                body = [*conv_bn(cin, planes, 3, stride), *conv_bn(planes, cout, 3, relu=False)]
            self.body = nn.Sequential(*body)
            self.shortcut = nn.Identity()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1, stride, relu=False))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    def resnet(blocks, bottleneck):
        layers, cin = [*conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
        for stage, count in enumerate(blocks):
            planes = 64 * 2**stage
            for i in range(count):
                layers.append(Block(cin, planes, 2 if stage and not i else 1, bottleneck))
                cin = planes * (4 if bottleneck else 1)
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        return model

    if name == "resnet18":
        return resnet((2, 2, 2, 2), bottleneck=False)
    if name == "resnet50":
        return resnet((3, 4, 6, 3), bottleneck=True)
    if name == "alexnet":
        relu = nn.ReLU(inplace=True)
        return nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), relu, nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), relu, nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), relu, nn.Conv2d(384, 256, 3, padding=1), relu,
            nn.Conv2d(256, 256, 3, padding=1), relu, nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(), nn.Dropout(0.5),
            nn.Linear(256 * 36, 4096), relu, nn.Dropout(0.5), nn.Linear(4096, 4096), relu,
            nn.Linear(4096, 1000),
        )  # fmt: skip
    if name == "tiny":
        return nn.Sequential(nn.Conv2d(3, 8, 3, 2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, 1000))  # fmt: skip
    raise ValueError(f"unknown model {name!r}: use resnet18, resnet50, alexnet or tiny")


# -- the worker: one rank of one contender ----------------------------------------------------


def _rank_and_size() -> tuple:
    # MPICH's Hydra and horovodrun both say who we are in the environment; no MPI needed here.
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("HOROVOD_RANK", "HOROVOD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def _distributed(contender: str, model, optimizer):
    """Wrap `model` and `optimizer` in the contender's data parallelism; return both."""
    if contender in ("hvdlite", "hvdlite-gloo", "horovod-mpi", "horovod-gloo"):
        if contender.startswith("hvdlite"):
            import horovodlite.torch as hvd
        else:
            if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ and "PMI_RANK" in os.environ:
                _horovod_gloo_env()
            import horovod.torch as hvd
        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer
    if contender == "ddp":
        import torch
        import torch.distributed as dist

        rank, size = _rank_and_size()
        dist.init_process_group("gloo", rank=rank, world_size=size)  # MASTER_ADDR/PORT: driver
        return torch.nn.parallel.DistributedDataParallel(model), optimizer
    if contender == "local":
        return model, optimizer
    raise ValueError(f"unknown contender {contender!r}: use local or one of {CONTENDERS}")


def worker(args) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    rank, size = _rank_and_size()
    torch.manual_seed(0)
    model = build_model(args.worker_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = _distributed(args.worker, model, optimizer)
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(args.worker_batch, 3, args.image_size, args.image_size,
                         generator=generator)  # fmt: skip
    labels = torch.randint(0, 1000, (args.worker_batch,), generator=generator)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.iters):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        rates.append(args.worker_batch * args.steps / (time.perf_counter() - start))
    parameters = sum(p.numel() for p in model.parameters())
    print("RESULT " + json.dumps({"rank": rank, "size": size, "img_per_s": rates,
                                  "parameters": parameters}), flush=True)  # fmt: skip
    if args.worker == "ddp":
        torch.distributed.destroy_process_group()


# -- the driver -------------------------------------------------------------------------------


def _worker_argv(python: str, contender: str, model: str, batch: int, args) -> list:
    return [python, os.path.abspath(__file__), "--worker", contender, "--worker-model", model,
            "--worker-batch", str(batch), "--image-size", str(args.image_size),
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--iters", str(args.iters),
            "--threads", str(args.threads)]  # fmt: skip


def _contender_env(contender: str, master: str) -> dict:
    env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if contender == "ddp":
        env |= {"MASTER_ADDR": master, "MASTER_PORT": str(random.randint(20000, 40000))}
    if contender == "horovod-mpi":
        env |= {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"}
    if contender == "hvdlite-gloo":
        env |= {"HOROVODLITE_TRANSPORT": "gloo"}
    return env


def _parse_job(contender: str, np: int, output: str, returncode: int) -> dict:
    # Ranks' lines may arrive run together through the launcher: decode each record in place.
    decoder, rows = json.JSONDecoder(), []
    for match in re.finditer(r"RESULT (?=\{)", output):
        rows.append(decoder.raw_decode(output, match.end())[0])
    if returncode != 0 or len(rows) != np:
        raise RuntimeError(f"{contender} at {np} rank(s) failed (status {returncode}, "
                           f"{len(rows)} of {np} results):\n{output[-3000:]}")  # fmt: skip
    # Every rank's median iteration; a synchronous job's total is their sum (Horovod's "total").
    per_rank = [statistics.median(row["img_per_s"]) for row in rows]
    return {"img_per_s": sum(per_rank), "per_rank": per_rank,
            "parameters": rows[0]["parameters"]}  # fmt: skip


def _run_job(command: list, env: dict, timeout: float, kill_left_over=None) -> tuple:
    """Run a job in its own process group; return (output, status), killing it on timeout."""
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        return proc.communicate(timeout=timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        if kill_left_over is not None:
            kill_left_over()
        return proc.communicate()[0] + f"\n*** killed after {timeout} s ***", -9


def _horovod_available() -> str:
    """Return why real Horovod cannot run, or ""."""
    if not os.access(HOROVOD_PYTHON, os.X_OK):
        return f"{HOROVOD_PYTHON} does not exist (build it: bash ../shared/tools/hvd-real.sh)"
    check = subprocess.run([HOROVOD_PYTHON, "-c", "import horovod.torch"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    return "" if check.returncode == 0 else f"horovod.torch does not import: {check.stderr[-300:]}"


class HostLauncher:
    """Runs a contender's ranks on this machine."""

    name = "host"
    master = "127.0.0.1"

    def run(self, contender: str, np: int, argv: list, timeout: float) -> dict:
        from horovodlite.run.mpi_launcher import find_mpiexec

        env = {**os.environ, **_contender_env(contender, self.master)}
        if contender == "horovod-gloo":
            horovodrun = os.path.join(os.path.dirname(HOROVOD_PYTHON), "horovodrun")
            command = [horovodrun, "--gloo", "-np", str(np), "-H", f"localhost:{np}", *argv]
        elif np == 1:
            command = argv
        else:
            mpiexec = (os.path.join(os.path.dirname(HOROVOD_PYTHON), "mpiexec")
                       if contender.startswith("horovod") else find_mpiexec())  # fmt: skip
            command = [mpiexec, "-n", str(np), *argv]
        return _parse_job(contender, np, *_run_job(command, env, timeout))


class SimLauncher:
    """Runs a contender with one rank on each host of a simulated cluster."""

    name = "sim"

    def __init__(self, cluster):
        self.cluster = cluster
        self.master = cluster.hosts[0].address

    def run(self, contender: str, np: int, argv: list, timeout: float) -> dict:
        mpiexec = None
        if contender.startswith("horovod"):
            mpiexec = os.path.join(os.path.dirname(HOROVOD_PYTHON), "mpiexec")
        env = _contender_env(contender, self.master)
        server = None
        if contender == "horovod-gloo":
            # horovodrun would reach the hosts over ssh; instead its rendezvous server runs
            # here (on the bridge's side) and mpiexec only starts the processes, each of which
            # takes its Horovod rank from MPICH's PMI_RANK (see _horovod_gloo_env).
            server = subprocess.Popen(
                [HOROVOD_PYTHON, "-c", _RENDEZVOUS, str(np)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            env |= {"HOROVOD_GLOO_RENDEZVOUS_ADDR": self.cluster.bridge_address,
                    "HOROVOD_GLOO_RENDEZVOUS_PORT": server.stdout.readline().strip(),
                    "HOROVOD_GLOO_IFACE": "eth0"}  # fmt: skip
        from horovodlite.run.netns import kill_namespace_processes

        def kill_left_over():
            for host in self.cluster.hosts:
                kill_namespace_processes(host.namespace)

        command, full_env = self.cluster.mpiexec(np, argv, 1, env, mpiexec=mpiexec)
        hosts_files = self._hostname_to_eth0() if server is not None else []
        try:
            output, returncode = _run_job(command, full_env, timeout, kill_left_over)
        finally:
            if server is not None:
                server.stdin.close()
                server.wait(timeout=30)
            for path in hosts_files:
                os.remove(path)
                os.rmdir(os.path.dirname(path))
        return _parse_job(contender, np, output, returncode)

    def _hostname_to_eth0(self) -> list:
        """Make the host name resolve to eth0's address inside each simulated host.

        Horovod's Gloo contexts of process sets ignore HOROVOD_GLOO_IFACE and take the address
        the host name resolves to, here 127.0.0.1 on every simulated host; `ip netns exec`
        mounts /etc/netns/NAMESPACE/hosts over /etc/hosts, so one file per host fixes that.
        """
        name = platform.node()
        with open("/etc/hosts") as f:  # without the lines naming this host (127.0.x.1)
            others = "".join(line for line in f if name not in line.split()[1:])
        paths = []
        for host in self.cluster.hosts:
            path = os.path.join("/etc/netns", host.namespace, "hosts")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(f"{host.address} {name}\n{others}")
            paths.append(path)
        return paths


# Horovod's own rendezvous server for `np` processes, one on each of the hosts host0, host1, ...:
# prints its port, serves until its stdin closes.
_RENDEZVOUS = """
import sys
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer
np = int(sys.argv[1])
server = RendezvousServer()
port = server.start()
server.init(get_host_assignments(parse_hosts(",".join(f"host{i}:1" for i in range(np))), np))
print(port, flush=True)
sys.stdin.read()
server.stop()
"""


def _horovod_gloo_env() -> None:
    # What horovodrun --gloo gives each process, for one process per simulated host.
    rank, size = os.environ["PMI_RANK"], os.environ["PMI_SIZE"]
    os.environ.update({
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_RANK": rank, "HOROVOD_SIZE": size, "HOROVOD_HOSTNAME": f"host{rank}",
        "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": rank, "HOROVOD_CROSS_SIZE": size,
    })  # fmt: skip


def _bounds(compute: float, grad_bytes: int, np: int, batch: int, rate_bits) -> dict:
    bounds = {"compute_s": compute, "compute_img_per_s": np * batch / compute}
    if rate_bits:
        comm = 2 * (np - 1) / np * grad_bytes * 8 / rate_bits
        bounds |= {"comm_s": comm, "serial_img_per_s": np * batch / (compute + comm),
                   "overlapped_img_per_s": np * batch / max(compute, comm)}  # fmt: skip
    return bounds


def run_setting(setting: str, contenders: list, args) -> dict:
    """Measure every contender `args.runs` times in one setting; return the medians and bounds."""
    if setting == "host":
        np, model, batch, rate = args.np, args.model, args.batch_size, None
    else:
        from horovodlite.run.netns import parse_rate

        np, model, batch = args.sim_hosts, args.sim_model, args.sim_batch_size
        rate = parse_rate(args.link_rate)
    load = [os.getloadavg()]
    host = HostLauncher()

    def measure(launcher, contender, ranks):
        python = HOROVOD_PYTHON if contender.startswith("horovod") else sys.executable
        argv = _worker_argv(python, contender, model, batch, args)
        try:
            result = launcher.run(contender, ranks, argv, args.timeout)
        except RuntimeError as error:  # one failed job is reported, the others still run
            print(f"  {setting} {contender} np={ranks}: FAILED\n{error}", flush=True)
            result = None
        load.append(os.getloadavg())
        if result is not None:
            print(f"  {setting} {contender} np={ranks}: {result['img_per_s']:.2f} img/s (load "
                  f"{load[-1][0]:.1f})", flush=True)  # fmt: skip
        return result

    runs = {c: [] for c in ["local@1", "local", *contenders]}
    cluster = launcher = None
    try:
        if setting == "sim":
            from horovodlite.run.simcluster import SimulatedCluster

            cluster = SimulatedCluster(np, rate=args.link_rate).__enter__()
            launcher = SimLauncher(cluster)
        for run in range(args.runs):
            shift = run % len(contenders)  # rotate the order so no contender is always first
            runs["local@1"].append(measure(host, "local", 1))
            runs["local"].append(measure(host, "local", np))
            for contender in contenders[shift:] + contenders[:shift]:
                runs[contender].append(measure(launcher or host, contender, np))
    finally:
        if cluster is not None:
            cluster.__exit__(None, None, None)
    done = {c: [r for r in values if r is not None] for c, values in runs.items()}
    medians = {c: statistics.median(r["img_per_s"] for r in v) if v else None
               for c, v in done.items()}  # fmt: skip
    if medians["local@1"] is None:
        raise RuntimeError(f"{setting}: the compute time could not be measured (local failed)")
    parameters = done["local@1"][0]["parameters"]
    return {
        "setting": setting, "np": np, "model": model, "batch_per_rank": batch,
        "image_size": args.image_size, "parameters": parameters,
        "gradient_bytes": 4 * parameters, "link_rate_bits": rate,
        "runs": {c: [r and r["img_per_s"] for r in v] for c, v in runs.items()},
        "median_img_per_s": medians,
        "bounds": _bounds(batch / medians["local@1"], 4 * parameters, np, batch, rate),
        "load_average_1_5_15": load,
    }  # fmt: skip


def report(results: list) -> None:
    for res in results:
        bounds, medians = res["bounds"], res["median_img_per_s"]
        loads = [entry[0] for entry in res["load_average_1_5_15"]]
        where = f"{res['np']} ranks on this host"
        if res["link_rate_bits"]:
            rate = res["link_rate_bits"] / 1e9
            where = f"{res['np']} simulated hosts at {rate:g} Gbit/s, 1 rank each"
        print(f"\n{res['setting']}: {where}; {res['model']}, batch {res['batch_per_rank']} per "
              f"rank, {res['gradient_bytes'] / 2**20:.1f} MiB of gradients; total img/s, median "
              f"of {len(res['runs']['local@1'])} runs (1-minute load {min(loads):.1f} to "
              f"{max(loads):.1f})")  # fmt: skip
        ours = medians.get("hvdlite")
        for contender, value in medians.items():
            runs = ", ".join("failed" if v is None else f"{v:.2f}" for v in res["runs"][contender])
            ratio = ""
            if ours and value and contender not in ("hvdlite", "local@1", "local"):
                ratio = f"  hvdlite / this {ours / value:.2f}"
            shown = "failed" if value is None else f"{value:8.2f}"
            print(f"  {contender:14s} {shown:>8s}   ({runs}){ratio}")
        print(f"  compute time per step at 1 rank: {bounds['compute_s'] * 1e3:.0f} ms "
              f"({bounds['compute_img_per_s']:.2f} img/s for {res['np']} ranks with no "
              f"communication and a core each)")  # fmt: skip
        if "comm_s" in bounds:
            print(f"  ring bytes over the link: {bounds['comm_s'] * 1e3:.0f} ms per step; bound "
                  f"{bounds['serial_img_per_s']:.2f} img/s serial, "
                  f"{bounds['overlapped_img_per_s']:.2f} overlapped")  # fmt: skip
            if ours:
                print(f"  hvdlite: serial bound / hvdlite {bounds['serial_img_per_s'] / ours:.2f}"
                      f", overlapped bound / hvdlite "
                      f"{bounds['overlapped_img_per_s'] / ours:.2f}")  # fmt: skip


def plot(results: list, path: str) -> None:
    """Bar chart of the median img/s per contender and setting, the bounds as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results):
        names = [c for c, v in res["median_img_per_s"].items() if v and c != "local@1"]
        values = [res["median_img_per_s"][c] for c in names]
        colors = ["tab:green" if c.startswith("hvdlite") else "tab:gray" if c == "local"
                  else "tab:blue" for c in names]  # fmt: skip
        ax.bar(names, values, color=colors)
        for i, value in enumerate(values):
            ax.text(i, value, f"{value:.1f}", ha="center", va="bottom", fontsize=8)
        bounds = res["bounds"]
        lines = [("overlapped_img_per_s", "bound, overlapped", "--"),
                 ("serial_img_per_s", "bound, serial", ":")]  # fmt: skip
        for key, label, style in lines:
            if key in bounds:
                ax.axhline(bounds[key], color="tab:red", linestyle=style, label=label)
        title = (f"{res['np']} simulated hosts, {res['link_rate_bits'] / 1e9:g} Gbit/s"
                 if res["link_rate_bits"] else f"{res['np']} ranks, one host")  # fmt: skip
        ax.set_title(f"{title}: {res['model']}, batch {res['batch_per_rank']}/rank", fontsize=9)
        ax.set_ylabel("images/s (all ranks)")
        ax.tick_params(axis="x", labelsize=8, rotation=20)
        if "comm_s" in bounds:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    contenders = [c for c in args.contenders.split(",") if c]
    if any(c.startswith("horovod") for c in contenders):
        missing = _horovod_available()
        if missing:
            print(f"skipping real Horovod: {missing}")
            contenders = [c for c in contenders if not c.startswith("horovod")]
    results = [run_setting(s, contenders, args) for s in args.settings.split(",") if s]
    report(results)
    import torch

    document = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "options": {k: v for k, v in vars(args).items() if not k.startswith("worker")},
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)
    print(f"\nwrote {args.out}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
