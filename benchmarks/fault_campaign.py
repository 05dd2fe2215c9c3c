"""Fault campaign: random programs on 2-4 ranks, one random fault each; nothing may hang.

Each trial draws, from its seed, a program (a sequence of synchronous and asynchronous
collectives of every kind, process sets, join, and sometimes a few steps of the torch
DistributedOptimizer loop), a rank count, and one fault injected by one rank at one step.
A third of the trials (from seed 300 on) run the program as an elastic job: under
`horovodlite-run --max-restarts 1`, inside `hvd.elastic.run`, committing the program's
progress (and the torch model and optimizer, where it trains one) after a random half of its
steps; the fault happens in the first run only, and the job must resume from its last commit
and finish with every step done exactly once and the right results. The faults:

- `sys_exit`, `os_exit`, `sigkill`, `exception`, `shutdown`: the rank leaves there;
- `stall`: the rank sleeps past the collective timeout (HOROVODLITE_COLLECTIVE_TIMEOUT) first;
- `shape`, `dtype`, `name`, `collective`, `way`: the rank calls a probe collective with another
  shape, dtype, name, kind of collective, or synchronously where the others call it
  asynchronously (or the reverse);
- `load`: no fault, two busy processes beside the job; `none`: no fault.

The job runs under horovodlite-run. An elastic trial passes when the job ends with status 0
after one restart, every rank resumed from a commit no older than the newest one a rank
reported before the fault, within its bound + RESTART seconds of it. Another trial passes when
either every rank finishes with results equal to numpy's (no fault), or the job ends within
its bound (collective timeout + TEARDOWN seconds) of the fault with a non-zero status and
every error a surviving rank prints names the faulty rank and a collective (for `os_exit` and
`sigkill` no Python runs in the rank: horovodlite-run names it; an uncaught `exception` aborts
the job at once, naming its rank).
The first uncaught error aborts the whole job, so a survivor may be torn down before it
prints: the report counts those that did. Anything else is a failure: a hang (killed at HANG
seconds), a wrong result, lost commits, or an error that does not name them.

    python benchmarks/fault_campaign.py --trials 300 --out benchmarks/results/fault_campaign.json
    python benchmarks/fault_campaign.py --seed 17 --verbose   # replay one trial

Not run in CI; run it under `nice` on a shared machine.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

EXITS = ["sys_exit", "os_exit", "sigkill", "exception", "shutdown"]
MISMATCHES = ["shape", "dtype", "name", "collective", "way"]
FAULTS = EXITS + ["stall"] + MISMATCHES + ["load", "none"]
KINDS = ["allreduce", "async", "allgather", "broadcast", "alltoall", "reducescatter",
         "grouped", "barrier", "process_set", "join"]  # fmt: skip
# HOROVODLITE_COLLECTIVE_TIMEOUT of a trial, seconds: short, so that trials which end by it
# end soon; longer where the program trains with torch, whose first steps can put one rank more
# than 6 s behind the others on a loaded machine (seed 105: the others timed out before the fault).
TIMEOUT, TORCH_TIMEOUT = 6.0, 20.0
TEARDOWN = 24.0  # a faulty trial must end within its timeout and this many seconds of its fault
RESTART = 60.0  # and an elastic one resume this much later (the restart imports everything again)
ELASTIC_FROM = 300  # seeds from here on may be elastic; earlier ones replay as they ran
HANG = 120.0  # a trial still running then (twice that if elastic) is killed: a hang
COLLECTIVE_WORDS = re.compile(
    r"allreduce|allgather|broadcast|alltoall|reducescatter|barrier|join|process_set|negotiation"
)


# -- the trial's plan, the same on every rank -----------------------------------------------------


def timeout_of(trial: dict) -> float:
    return TORCH_TIMEOUT if "torch" in trial["steps"] else TIMEOUT


def bound_of(trial: dict) -> float:
    """Seconds from the fault within which a faulty trial must end."""
    return timeout_of(trial) + TEARDOWN


def draw(seed: int) -> dict:
    """Return the trial `seed`: rank count, program, fault, faulty rank and step."""
    rng = np.random.default_rng([seed, 25])
    np_ = int(rng.integers(2, 5))
    steps = [str(k) for k in rng.choice(KINDS, size=int(rng.integers(4, 9)))]
    if rng.random() < 0.25:
        steps.insert(int(rng.integers(0, len(steps) + 1)), "torch")
    fault = FAULTS[seed % len(FAULTS)]
    at = int(rng.integers(0, len(steps)))
    if fault in MISMATCHES:
        steps.insert(at, "probe")
    trial = {"seed": seed, "np": np_, "steps": steps, "fault": fault,
             "rank": int(rng.integers(0, np_)), "at": at, "elastic": False}  # fmt: skip
    # Drawn from a generator of its own, so the programs of earlier seeds stay as they were.
    more = np.random.default_rng([seed, 25, 1])
    if seed >= ELASTIC_FROM and more.random() < 1 / 3:
        trial["elastic"] = True
        if "torch" in steps and more.random() < 0.5:  # two: a restart restores the momentum
            steps.insert(steps.index("torch") + 1, "torch")
            trial["at"] += int(trial["at"] > steps.index("torch"))
        trial["commits"] = [bool(c) for c in more.random(len(steps)) < 0.5]
    return trial


# -- the worker: one rank of a trial ---------------------------------------------------------------


def values(seed: int, step: int, rank: int, shape) -> np.ndarray:
    """Return a rank's input: small integers, so every sum is exact in float64."""
    return np.random.default_rng([seed, step, rank]).integers(-3, 5, size=shape).astype(np.float64)


def check(got, expected, what: str) -> None:
    if not np.array_equal(np.asarray(got), np.asarray(expected)):
        raise AssertionError(f"WRONG RESULT in {what}: got {got!r}, expected {expected!r}")


def run_step(hvd, trial: dict, step: int, kind: str) -> None:
    seed, me, n = trial["seed"], hvd.rank(), hvd.size()
    name = f"s{step}.{kind}"
    faulty = me == trial["rank"] and step == trial["at"]
    rng = np.random.default_rng([seed, step])  # the same on every rank
    shape = (int(rng.integers(1, 6)), 3)
    mine = values(seed, step, me, shape)
    every = [values(seed, step, r, shape) for r in range(n)]
    if kind == "allreduce":
        check(hvd.allreduce(mine, op=hvd.Sum, name=name), sum(every), name)
    elif kind == "async":
        count = int(rng.integers(1, 5))
        order = np.random.default_rng([seed, step, me]).permutation(count)  # per rank
        handles = {}
        for j in order:
            x = values(seed, step * 10 + j, me, shape)
            handles[j] = hvd.allreduce_async(x, op=hvd.Sum, name=f"{name}.{j}")
        for j in reversed(order):
            expected = sum(values(seed, step * 10 + j, r, shape) for r in range(n))
            check(hvd.synchronize(handles[j]), expected, f"{name}.{j}")
    elif kind == "allgather":
        rows = [values(seed, step, r, (r + 1, 2)) for r in range(n)]
        check(hvd.allgather(rows[me], name=name), np.concatenate(rows), name)
    elif kind == "broadcast":
        root = step % n
        check(hvd.broadcast(mine, root_rank=root, name=name), every[root], name)
    elif kind == "alltoall":
        sent = [values(seed, step, r, (n, 2)) for r in range(n)]
        check(hvd.alltoall(sent[me], name=name), np.stack([s[me] for s in sent]), name)
    elif kind == "reducescatter":
        full = [values(seed, step, r, (2 * n, 3)) for r in range(n)]
        got = hvd.reducescatter(full[me], op=hvd.Sum, name=name)
        check(got, sum(full)[2 * me : 2 * me + 2], name)
    elif kind == "grouped":
        parts = [[values(seed, step * 10 + j, r, (j + 1,)) for j in range(3)] for r in range(n)]
        got = hvd.grouped_allreduce(parts[me], op=hvd.Sum, name=name)
        for j in range(3):
            check(got[j], sum(p[j] for p in parts), f"{name}.{j}")
    elif kind == "barrier":
        hvd.barrier()
    elif kind == "process_set":
        members = sorted({int(r) for r in rng.choice(n, size=int(rng.integers(1, n + 1)))})
        subset = hvd.add_process_set(members)
        if me in members:
            got = hvd.allreduce(mine, op=hvd.Sum, name=name, process_set=subset)
            check(got, sum(every[r] for r in members), name)
        hvd.remove_process_set(subset)
    elif kind == "join":
        counts = [1 + (r + step) % 3 for r in range(n)]
        for i in range(counts[me]):
            x = values(seed, step * 10 + i, me, shape)
            expected = sum(values(seed, step * 10 + i, r, shape) for r in range(n) if counts[r] > i)
            check(hvd.allreduce(x, op=hvd.Sum, name=f"{name}.{i}"), expected, f"{name}.{i}")
        last = hvd.join()  # ranks with the most batches join last: any of them, if several
        latest = [r for r in range(n) if counts[r] == max(counts)]
        check(last if last in latest else None, last, f"{name} last rank (one of {latest})")
    elif kind == "probe":
        probe(hvd, trial, step, mine, faulty)
    elif kind == "torch":
        torch_steps(trial, step)


def probe(hvd, trial: dict, step: int, mine, faulty: bool) -> None:
    """The collective a mismatch fault is injected into: an all-reduce, sync or async."""
    name, fault = f"s{step}.probe", trial["fault"]
    asynchronous = trial["seed"] % 2 == 1
    x, kind = mine, "allreduce"
    if faulty:
        announce_fault()
        if fault == "shape":
            x = np.ones(mine.size + 1)
        elif fault == "dtype":
            x = mine.astype(np.float32)
        elif fault == "name":
            name = f"s{step}.other"
        elif fault == "collective":
            kind = "allgather"
        elif fault == "way":
            asynchronous = not asynchronous
    if asynchronous:
        call = hvd.allreduce_async if kind == "allreduce" else hvd.allgather_async
        hvd.synchronize(call(x, name=name))
    else:
        (hvd.allreduce if kind == "allreduce" else hvd.allgather)(x, name=name)


def torch_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def torch_batches(trial: dict, step: int, n: int, count: int = 3) -> list:
    """The whole batches of a torch step (2 rows per rank), the same on every rank."""
    import torch

    generator = torch.Generator().manual_seed(trial["seed"] + step)
    return [
        (torch.randn(2 * n, 4, generator=generator), torch.randn(2 * n, 1, generator=generator))
        for _ in range(count)
    ]


def torch_steps(trial: dict, step: int) -> None:
    """Three steps of the DistributedOptimizer, checked against one process on the whole batch."""
    import torch  # noqa: I001 - the framework first, then its binding

    import horovodlite.torch as hvt

    me, n = hvt.rank(), hvt.size()
    single, mine = torch_model(trial["seed"]), torch_model(trial["seed"])
    reference = torch.optim.SGD(single.parameters(), lr=0.1)
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(mine.parameters(), lr=0.1), named_parameters=mine.named_parameters()
    )
    for x, y in torch_batches(trial, step, n):
        reference.zero_grad()
        torch.nn.functional.mse_loss(single(x), y).backward()
        reference.step()
        optimizer.zero_grad()
        part = slice(2 * me, 2 * me + 2)
        torch.nn.functional.mse_loss(mine(x[part]), y[part]).backward()
        optimizer.step()
    for a, b in zip(single.parameters(), mine.parameters()):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"WRONG RESULT in s{step}.torch: parameters differ")


def torch_elastic_step(trial: dict, step: int, model, optimizer) -> None:
    """Three DistributedOptimizer steps (SGD with momentum) of the elastic state's model."""
    import horovodlite.torch as hvt
    import torch

    part = slice(2 * hvt.rank(), 2 * hvt.rank() + 2)
    for x, y in torch_batches(trial, step, hvt.size()):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
        optimizer.step()


def announce_fault() -> None:
    """Tell the driver when the fault happens: the time to end is counted from here."""
    sys.stdout.write(f"FAULT AT {time.time():.3f}\n")
    sys.stdout.flush()


def inject(hvd, trial: dict) -> None:
    """Do the trial's fault on the faulty rank, before the faulty step's collective."""
    fault = trial["fault"]
    announce_fault()
    if fault == "sys_exit":
        sys.exit(3)
    if fault == "os_exit":
        os._exit(3)
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "exception":
        raise RuntimeError("the fault campaign's injected exception")
    if fault == "shutdown":
        hvd.shutdown()  # and carry on: this rank's next collective raises
    if fault == "stall":
        time.sleep(timeout_of(trial) + 4)


def worker(seed: int) -> None:
    import horovodlite as hvd

    trial = draw(seed)
    if "torch" in trial["steps"]:
        import horovodlite.torch  # noqa: F401 - seconds on a loaded machine: not inside a step
    hvd.init()
    if trial["elastic"]:
        return elastic_worker(hvd, trial)
    me, start, step = hvd.rank(), time.monotonic(), -1
    try:
        for step, kind in enumerate(trial["steps"]):
            if me == trial["rank"] and step == trial["at"] and trial["fault"] in EXITS + ["stall"]:
                inject(hvd, trial)
            run_step(hvd, trial, step, kind)
    except Exception as exc:
        report_error(me, step, start, exc)
        raise
    sys.stdout.write(f"RANK {me} OK\n")
    sys.stdout.flush()


def report_error(me: int, step: int, start: float, exc: Exception) -> None:
    # One write per line: the ranks' lines reach the launcher's output whole.
    took = time.monotonic() - start
    sys.stdout.write(f"RANK {me} ERROR at step {step} after {took:.1f} s: "
                     f"{type(exc).__name__}: {exc}\n")  # fmt: skip
    sys.stdout.flush()


def elastic_worker(hvd, trial: dict) -> None:
    """The program inside hvd.elastic.run, committed after the drawn steps; faults in run 0."""
    from horovodlite.training import elastic

    me, steps, restart = hvd.rank(), trial["steps"], int(os.environ["HOROVODLITE_ELASTIC_RESTART"])
    # done: the steps whose results this state holds, in order; a restart must resume with
    # exactly the steps of its last commit, and end with every step once.
    model = optimizer = None
    if "torch" in steps:  # the model and its optimizer (momentum) are committed too
        import torch  # noqa: I001 - the framework first, then its binding

        import horovodlite.torch as hvt

        model = torch_model(trial["seed"])
        optimizer = hvt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(),
        )
        state = hvt.elastic.TorchState(model=model, optimizer=optimizer, step=0, done=[])
    else:
        state = elastic.ObjectState(step=0, done=[])
    start = time.monotonic()

    @elastic.run
    def program(state):
        if restart:
            sys.stdout.write(f"RANK {me} RESUMED commit {state.commit_number} step {state.step} "
                             f"AT {time.time():.3f}\n")  # fmt: skip
            sys.stdout.flush()
        step = state.step
        try:
            for step in range(state.step, len(steps)):
                faulty = me == trial["rank"] and step == trial["at"] and restart == 0
                if faulty and trial["fault"] in EXITS + ["stall"]:
                    inject(hvd, trial)
                if steps[step] == "torch":
                    torch_elastic_step(trial, step, model, optimizer)
                else:
                    run_step(hvd, dict(trial, at=trial["at"] if restart == 0 else -1), step,
                             steps[step])  # fmt: skip
                state.done = state.done + [step]
                state.step = step + 1
                if trial["commits"][step]:
                    state.commit()
                    sys.stdout.write(f"RANK {me} COMMITTED {state.commit_number} step "
                                     f"{state.step}\n")  # fmt: skip
                    sys.stdout.flush()
        except Exception as exc:
            report_error(me, step, start, exc)
            raise

    program(state)
    check(state.done, list(range(len(steps))), "the steps done (each once, in order)")
    if model is not None:
        reference = torch_model(trial["seed"])
        plain = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        for step in (s for s, kind in enumerate(steps) if kind == "torch"):
            for x, y in torch_batches(trial, step, hvd.size()):
                plain.zero_grad()
                torch.nn.functional.mse_loss(reference(x), y).backward()
                plain.step()
        for a, b in zip(reference.parameters(), model.parameters()):
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                raise AssertionError("WRONG RESULT after the elastic torch steps: parameters "
                                     "differ from one process on the whole batches")  # fmt: skip
    sys.stdout.write(f"RANK {me} OK restart {restart}\n")
    sys.stdout.flush()


# -- the driver ------------------------------------------------------------------------------------


def run_trial(seed: int, verbose: bool = False) -> dict:
    trial = draw(seed)
    env = dict(os.environ, HOROVODLITE_COLLECTIVE_TIMEOUT=str(timeout_of(trial)),
               PYTHONUNBUFFERED="1")  # fmt: skip
    argv = [sys.executable, "-m", "horovodlite.run", "-np", str(trial["np"]), sys.executable,
            os.path.abspath(__file__), "--worker", str(seed)]  # fmt: skip
    commits = tempfile.TemporaryDirectory(prefix="fault-campaign-")
    if trial["elastic"]:  # one restart, at once; the commits in a folder of this trial's
        argv[5:5] = ["--max-restarts", "1", "--restart-delay", "0"]
        env["HOROVODLITE_ELASTIC_DIR"] = commits.name
    busy = []
    if trial["fault"] == "load":
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=HANG * (2 if trial["elastic"] else 1))
        code, ended = proc.returncode, time.time()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, code, ended = proc.communicate()[0], None, time.time()
    finally:
        for p in busy:
            p.kill()
            p.wait()
        commits.cleanup()
    seconds = time.monotonic() - start
    fault_at = re.search(r"FAULT AT ([0-9.]+)", out)
    resumed = [float(t) for t in re.findall(r"RESUMED commit \d+ step \d+ AT ([0-9.]+)", out)]
    if fault_at:  # from the fault to the end of the job (start-up and imports vary with load)
        seconds = (max(resumed) if resumed else ended) - float(fault_at.group(1))
    judged = judge_elastic if trial["elastic"] else judge
    outcome, why = judged(trial, code, out, seconds)
    if verbose or outcome not in ("correct", "error named"):
        print(out[-6000:], file=sys.stderr)
    return {**trial, "outcome": outcome, "why": why, "seconds": round(seconds, 2), "status": code}


def judge(trial: dict, code, out: str, seconds: float) -> tuple:
    """Return (outcome, reason) of a finished trial."""
    n, fault, bad = trial["np"], trial["fault"], trial["rank"]
    if code is None:
        return "hang", f"killed after {HANG:.0f} s"
    if "WRONG RESULT" in out:
        return "wrong", "a rank computed a wrong result"
    if fault in ("none", "load"):
        oks = [f"RANK {r} OK" in out for r in range(n)]
        return ("correct", "") if code == 0 and all(oks) else ("failed", f"status {code}")
    if "FAULT AT" not in out:
        return "before the fault", f"status {code}: the job ended before the fault was injected"
    if code == 0:
        return "silent", "the job ended with status 0 despite the fault"
    if seconds > bound_of(trial):
        return "late", f"ended after {seconds:.0f} s"
    if fault in ("os_exit", "sigkill"):  # no Python in the rank: the launcher names it
        named = f"rank {bad} (pid" in out and "ended without leaving horovodlite" in out
        return ("error named", "") if named else ("error unnamed", "launcher did not name it")
    if fault == "exception":  # not in a collective: the rank names itself and aborts the job
        named = f"horovodlite: rank {bad} exits on an uncaught RuntimeError" in out
        return ("error named", "") if named else ("error unnamed", "the rank was not named")
    # The first rank whose error goes uncaught aborts the job (as `python -m mpi4py` does), so
    # a survivor may be torn down before it prints: every error printed must name both.
    survivors = [r for r in range(n) if r != bad or fault in MISMATCHES]
    printed = 0
    for r in survivors:
        found = re.search(rf"RANK {r} ERROR at step \d+ after [0-9.]+ s: (.*)", out)
        if found is None:
            continue
        printed += 1
        text = found.group(1)
        names_rank = r == bad or re.search(rf"\branks? \[?(\d+, )*{bad}\b", text)
        if not (names_rank and COLLECTIVE_WORDS.search(text)):
            return "error unnamed", f"rank {r}: {text[:300]}"
    if not printed:
        return "error unnamed", "no rank printed an error"
    return "error named", f"{printed} of {len(survivors)} printed"


def judge_elastic(trial: dict, code, out: str, seconds: float) -> tuple:
    """Return (outcome, reason) of a finished elastic trial: resumed with nothing lost."""
    n, fault = trial["np"], trial["fault"]
    if code is None:
        return "hang", f"killed after {2 * HANG:.0f} s"
    if "WRONG RESULT" in out:
        return "wrong", "a rank computed a wrong result"
    restart = 0 if fault in ("none", "load") else 1
    if restart and "FAULT AT" not in out:
        return "before the fault", f"status {code}: run 0 ended before the fault was injected"
    if code != 0 or not all(f"RANK {r} OK restart {restart}" in out for r in range(n)):
        return "failed", f"status {code}, not every rank finished in run {restart}"
    if restart == 0:
        return "correct", ""
    committed = [int(c) for c in re.findall(r"RANK \d+ COMMITTED (\d+) ", out.split("RESUMED")[0])]
    resumed = [int(c) for c in re.findall(r"RANK \d+ RESUMED commit (\d+) ", out)]
    if len(resumed) != n or len(set(resumed)) != 1:
        return "failed", f"ranks resumed from commits {resumed}"
    if resumed[0] < max(committed, default=0):
        return "lost", f"resumed from commit {resumed[0]}, commit {max(committed)} was made"
    if seconds > bound_of(trial) + RESTART:
        return "late", f"resumed {seconds:.0f} s after the fault"
    return "resumed", f"from commit {resumed[0]}"


def table(results: list) -> str:
    """Return the Markdown table fault x outcome x time to end."""
    lines = ["| fault | program | trials | outcome | time to end, s (median / max) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for fault in FAULTS:
        for elastic in (False, True):
            mine = [r for r in results if r["fault"] == fault and r.get("elastic") == elastic]
            for outcome in sorted({r["outcome"] for r in mine}):
                times = sorted(r["seconds"] for r in mine if r["outcome"] == outcome)
                count = len(times)
                program = "elastic" if elastic else "plain"
                lines.append(f"| {fault} | {program} | {count} | {outcome} | "
                             f"{times[count // 2]:.1f} / {times[-1]:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--first", type=int, default=0, help="seed of the first trial")
    parser.add_argument("--seed", type=int, help="run only this trial, verbosely")
    parser.add_argument("--out", help="write every trial's result here (JSON)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.worker is not None:
        return worker(args.worker)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.trials)
    results = []
    for seed in seeds:
        result = run_trial(seed, args.verbose or args.seed is not None)
        results.append(result)
        kind = "elastic, " if result["elastic"] else ""
        print(f"seed {seed}: {kind}{result['np']} ranks, {result['fault']} by rank "
              f"{result['rank']} at "
              f"step {result['at']} of {result['steps']}: {result['outcome']} in "
              f"{result['seconds']:.1f} s {result['why']}", flush=True)  # fmt: skip
        if args.out:
            with open(args.out, "w") as f:
                limits = {"timeout": [TIMEOUT, TORCH_TIMEOUT], "teardown": TEARDOWN,
                          "restart": RESTART}  # fmt: skip
                json.dump({**limits, "results": results}, f, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
