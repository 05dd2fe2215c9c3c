"""The contenders: horovodlite's algorithms, the MPI library called directly, and torch's Gloo.

A contender builds, for one collective and element count, a `Case`: `call()` runs the collective
once (what is timed) and `verify()` runs it once on known data and checks the result exactly.
All data is float32 holding small integers, so every sum is exact in any order.

- ring, naive, mpi: `hvd.allreduce(..., algorithm=...)` (reducescatter: ring, mpi) through the
  public API, metadata check included.
- auto: horovodlite's default choice (`algorithm=None`); for broadcast and allgather, which have
  one implementation, the public call. auto-nocheck: the same with HOROVODLITE_CHECK_METADATA=0.
- mpi-native: mpi4py's buffer methods on a duplicate of COMM_WORLD (MPI_Allreduce, MPI_Bcast,
  MPI_Allgather, MPI_Reduce_scatter_block), the floor a Python caller can reach.
- gloo: torch.distributed with the Gloo backend, an outside peer, started with a TCP store on
  rank 0's address; rank and size come from MPI.
"""

import contextlib
import dataclasses
import os
from functools import partial
from typing import Callable, NamedTuple

import numpy as np
from mpi4py import MPI

from horovodlite.hosts import interface_address
from horovodlite.run.cli import environment

__all__ = ["ALL_CONTENDERS", "COLLECTIVES", "Case", "Contender", "make_contenders", "pattern"]

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reducescatter")
ALL_CONTENDERS = ("ring", "naive", "mpi", "hierarchical", "auto", "auto-nocheck", "mpi-native",
                  "gloo")  # fmt: skip

_HOROVODLITE_SUPPORT = {
    "ring": ("allreduce", "reducescatter"),
    "naive": ("allreduce",),
    "mpi": ("allreduce", "reducescatter"),
    "hierarchical": ("allreduce", "allgather"),
    "auto": COLLECTIVES,
    "auto-nocheck": COLLECTIVES,
}
_DTYPE = np.dtype(np.float32)
_ROOT = 0


class Case(NamedTuple):
    """One contender ready to run one collective at one size."""

    call: Callable[[], object]
    verify: Callable[[], bool]


def pattern(count: int, rank: int) -> np.ndarray:
    """Return rank `rank`'s input: small integers as float32, so sums are exact."""
    return (np.arange(count, dtype=np.int64) % 13 + rank).astype(_DTYPE)


def _reduced(count: int, ranks: int) -> np.ndarray:
    """Return the sum over ranks of pattern(count, r)."""
    return (ranks * (np.arange(count, dtype=np.int64) % 13) + ranks * (ranks - 1) // 2).astype(
        _DTYPE
    )


def _gathered(part: int, ranks: int) -> np.ndarray:
    return np.concatenate([pattern(part, r) for r in range(ranks)]) if part else np.empty(0, _DTYPE)


class _Buffers:
    """Inputs and the expected result of one collective at one count, on this rank."""

    def __init__(self, collective: str, count: int, comm):
        self.collective, self.count, self.ranks, self.rank = collective, count, comm.size, comm.rank
        self.part = count // comm.size  # allgather input and reducescatter output per rank
        self.input = pattern(self.part if collective == "allgather" else count, self.rank)

    def reset(self) -> None:
        self.input[...] = pattern(self.input.size, self.rank)

    def expected(self) -> np.ndarray:
        n, count, part = self.ranks, self.count, self.part
        if self.collective == "allreduce":
            return _reduced(count, n)
        if self.collective == "broadcast":
            return pattern(count, _ROOT)
        if self.collective == "allgather":
            return _gathered(part, n)
        return _reduced(count, n)[self.rank * part : (self.rank + 1) * part]

    def output(self) -> np.ndarray:
        """Return an output array of the result's size."""
        if self.collective == "allgather":
            return np.empty(self.part * self.ranks, _DTYPE)
        return np.empty(self.part if self.collective == "reducescatter" else self.count, _DTYPE)


def _checker(buffers: _Buffers, run: Callable[[], object], result=None):
    """Return verify(): reset the inputs, run once, compare (`result()` or run's return value)."""

    def verify() -> bool:
        buffers.reset()
        out = run()
        got = np.asarray(result() if result is not None else out).reshape(-1)
        expected = buffers.expected()
        return got.shape == expected.shape and bool(np.array_equal(got, expected))

    return verify


class Contender:
    """A named competitor; `case(collective, count)` builds what the sweep times."""

    def __init__(self, name: str, comm, env: dict = None):
        self.name, self.comm, self.env = name, comm, dict(env or {})

    def supports(self, collective: str) -> bool:
        raise NotImplementedError

    def case(self, collective: str, count: int) -> Case:
        raise NotImplementedError

    def environment(self):
        """Set this contender's environment variables for the duration of the block."""
        return environment(self.env)

    def close(self) -> None:
        """Release what the contender started."""


class Horovodlite(Contender):
    """horovodlite's public collectives with a fixed `algorithm=` (None for the default)."""

    def __init__(self, name: str, comm):
        super().__init__(name, comm)
        self.algorithm = None if name.startswith("auto") else name

    @contextlib.contextmanager
    def environment(self):
        """auto-nocheck: what HOROVODLITE_CHECK_METADATA=0 does (init() reads the variable);
        hierarchical: what HOROVODLITE_HIERARCHICAL_ALLGATHER=1 does for the all-gather."""
        import horovodlite

        state = horovodlite.state.current()
        saved = state.settings
        if self.name == "auto-nocheck":
            state.settings = dataclasses.replace(saved, check_metadata=False)
        elif self.name == "hierarchical":
            state.settings = dataclasses.replace(saved, hierarchical_allgather=True)
        try:
            yield
        finally:
            state.settings = saved

    def supports(self, collective: str) -> bool:
        return collective in _HOROVODLITE_SUPPORT[self.name]

    def case(self, collective: str, count: int) -> Case:
        import horovodlite as hvd

        b, algorithm = _Buffers(collective, count, self.comm), self.algorithm
        if collective == "allreduce":
            run = partial(hvd.allreduce, b.input, op=hvd.Sum, algorithm=algorithm)
        elif collective == "reducescatter":
            run = partial(hvd.reducescatter, b.input, op=hvd.Sum, algorithm=algorithm)
        elif collective == "allgather":
            run = partial(hvd.allgather, b.input)
        else:
            run = partial(hvd.broadcast_, b.input, root_rank=_ROOT)
        return Case(run, _checker(b, run))


class MpiNative(Contender):
    """mpi4py's buffer methods on a private duplicate of COMM_WORLD: no checks, no copies."""

    def __init__(self, comm):
        super().__init__("mpi-native", comm.Dup())

    def supports(self, collective: str) -> bool:
        return True

    def case(self, collective: str, count: int) -> Case:
        comm, b = self.comm, _Buffers(collective, count, self.comm)
        out = b.output()
        send, receive = [b.input, MPI.FLOAT], [out, MPI.FLOAT]
        if collective == "allreduce":
            run = partial(comm.Allreduce, send, receive, MPI.SUM)
        elif collective == "reducescatter":
            run = partial(comm.Reduce_scatter_block, send, receive, MPI.SUM)
        elif collective == "allgather":
            run = partial(comm.Allgather, send, receive)
        else:
            out = b.input
            run = partial(comm.Bcast, send, _ROOT)
        return Case(run, _checker(b, run, result=lambda: out))

    def close(self) -> None:
        self.comm.Free()


class Gloo(Contender):
    """torch.distributed on Gloo over TCP; rank 0 hosts the store, its port sent over MPI.

    Rank 0's address is that of $GLOO_SOCKET_IFNAME (set on the simulated cluster), else
    127.0.0.1.
    """

    def __init__(self, comm, timeout_s: float = 300):
        super().__init__("gloo", comm)
        from datetime import timedelta

        import torch.distributed as dist

        self.torch, self.dist = __import__("torch"), dist
        interface = os.environ.get("GLOO_SOCKET_IFNAME")
        address = interface_address(interface) if interface else "127.0.0.1"
        timeout = timedelta(seconds=timeout_s)
        store = None
        if comm.rank == 0:
            store = dist.TCPStore(
                address, 0, comm.size, is_master=True, timeout=timeout, wait_for_workers=False
            )
        address, port = comm.bcast((address, store.port if store else None), root=0)
        if store is None:
            store = dist.TCPStore(address, port, comm.size, is_master=False, timeout=timeout)
        dist.init_process_group(
            "gloo", store=store, rank=comm.rank, world_size=comm.size, timeout=timeout
        )
        self.store = store
        # Newer torch renames all_gather_into_tensor and reduce_scatter_tensor (*_single).
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = (
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        )

    def supports(self, collective: str) -> bool:
        return True

    def case(self, collective: str, count: int) -> Case:
        dist, torch = self.dist, self.torch
        b = _Buffers(collective, count, self.comm)
        tensor = torch.from_numpy(b.input)  # shares memory with b.input
        out_array = b.output()
        out = torch.from_numpy(out_array)
        if collective == "allreduce":
            run, out_array = partial(dist.all_reduce, tensor), b.input
        elif collective == "reducescatter":
            run = partial(self.reduce_scatter, out, tensor)
        elif collective == "allgather":
            run = partial(self.all_gather, out, tensor)
        else:
            run, out_array = partial(dist.broadcast, tensor, src=_ROOT), b.input
        return Case(run, _checker(b, run, result=lambda: out_array))

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def _gloo_missing() -> str:
    """Return why Gloo cannot run here, or ""."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch build has no Gloo backend"
    return ""


def make_contenders(names: list, comm) -> tuple:
    """Return (contenders, {name: why it was skipped}) for the contender `names`.

    Raises:
        ValueError: an unknown name.
    """
    unknown = [name for name in names if name not in ALL_CONTENDERS]
    if unknown:
        raise ValueError(f"unknown contenders {unknown}: choose from {', '.join(ALL_CONTENDERS)}")
    contenders, skipped = [], {}
    for name in names:
        if name == "mpi-native":
            contenders.append(MpiNative(comm))
        elif name == "gloo":
            # Every rank must agree, or some would wait in init_process_group forever.
            reasons = comm.allgather(_gloo_missing())
            reason = next((r for r in reasons if r), "")
            if reason:
                skipped[name] = reason
            else:
                contenders.append(Gloo(comm))
        else:
            contenders.append(Horovodlite(name, comm))
    return contenders, skipped
