"""horovodlite.run(fn, args, np=...): run a Python function on every rank of a job, get the results.

Horovod's `horovod.run`. The function and its arguments travel to the ranks with cloudpickle (so
functions defined in the calling script work), the ranks start through horovodlite-run, and each
rank's return value comes back through a file in a private temporary folder.

"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile

import cloudpickle

from ..exceptions import HorovodLiteError
from .cli import main

__all__ = ["run"]

# Horovod arguments for things horovodlite-run does not do: refused by name rather than ignored.
_ELASTIC = ("min_np", "max_np", "reset_limit")
_UNSUPPORTED = ("slots", "start_timeout", "ssh_port", "ssh_identity_file", "disable_cache",
                "output_filename", "network_interface")  # fmt: skip


def run(
    func,
    args=(),
    kwargs=None,
    np=1,
    min_np=None,
    max_np=None,
    slots=None,
    reset_limit=None,
    hosts=None,
    hostfile=None,
    start_timeout=None,
    ssh_port=None,
    ssh_identity_file=None,
    disable_cache=None,
    output_filename=None,
    verbose=None,
    use_gloo=None,
    use_mpi=None,
    mpi_args=None,
    network_interface=None,
    executable=None,
) -> list:
    """Run `func(*args, **kwargs)` on `np` processes; return their results in rank order.

    `func` calls `hvd.init()` itself, as a training script would. Hosts come from `hosts`
    ("host1:2,host2:2") or `hostfile`, as for horovodlite-run; `mpi_args` is a string of extra
    launcher arguments; `executable` is the Python that runs the ranks (default: this one).

    Raises:
        ValueError: an argument horovodlite does not support (Gloo, elastic, ssh settings).
        HorovodLiteError: the job failed (the ranks' output, above, says why).
    """
    given = dict(locals())
    if use_gloo:
        raise ValueError("horovodlite runs on MPI only: drop use_gloo=True (or pass use_mpi=True)")
    for name in _ELASTIC + _UNSUPPORTED:
        if given[name] is not None:
            what = "elastic runs are" if name in _ELASTIC else "it is"
            raise ValueError(f"horovodlite.run: {name}= is given, but {what} not supported; "
                             f"drop the argument")  # fmt: skip
    launch = ["-np", str(np)]
    launch += ["-H", hosts] if hosts else []
    launch += ["--hostfile", hostfile] if hostfile else []
    launch += ["--verbose"] if verbose else []
    launch += [f"--mpi-args={mpi_args}"] if mpi_args else []
    with tempfile.TemporaryDirectory(prefix="horovodlite-run-") as folder:
        payload = os.path.join(folder, "function.pkl")
        with open(payload, "wb") as f:
            cloudpickle.dump((func, tuple(args), dict(kwargs or {})), f)
        # mpi4py's runner aborts the whole job when the function raises on one rank.
        command = [executable or sys.executable, "-m", "mpi4py", "-m",
                   "horovodlite.run.function_rank", payload, folder]  # fmt: skip
        status = main(launch + command)
        if status != 0:
            raise HorovodLiteError(
                f"horovodlite.run: the job exited with status {status}; the ranks' output above "
                f"says why"
            )
        return [_load(os.path.join(folder, f"result.{rank}.pkl"), rank) for rank in range(np)]


def _load(path: str, rank: int):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        raise HorovodLiteError(
            f"horovodlite.run: rank {rank} returned no result (did the job start {rank + 1} "
            f"processes?)"
        ) from None
