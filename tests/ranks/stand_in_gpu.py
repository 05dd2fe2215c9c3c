"""A stand-in for CuPy on the host, for the staging code (horovodlite/staging.py) without a GPU.

Its arrays are numpy arrays ("GPU" memory that the host reaches only through `get` and `set`).
Copies between them and host memory are queued, as CUDA queues them on a stream, and run only
when something waits: an event recorded after them, a blocking copy down, or a "kernel" (an
assignment into a GPU array, a concatenation), which runs after everything queued before it.
So a host that reads or writes a pinned buffer before its copy has run sees the wrong data,
as it would on a GPU.
"""

import types

import numpy as np

_queued: list = []  # copies, in stream order
_ran = [0]  # how many of them have run


def run_until(count: int) -> None:
    """Run the queued copies up to the `count`th (the stream reaches that point)."""
    while _ran[0] < count:
        _queued[_ran[0]]()
        _ran[0] += 1


def run_all() -> None:
    run_until(len(_queued))


def pending() -> int:
    """Return how many queued copies have not run."""
    return len(_queued) - _ran[0]


def reset() -> None:
    run_all()
    _queued.clear()
    _ran[0] = 0


class Event:
    def __init__(self, block=False, disable_timing=False):
        self.mark = 0

    def record(self):
        self.mark = len(_queued)

    def synchronize(self):
        run_until(self.mark)


class DeviceArray(np.ndarray):
    """A "GPU" array."""

    def get(self, out, blocking=True):
        assert out.shape == self.shape and type(out) is np.ndarray
        source = self.view(np.ndarray)
        _queued.append(lambda: np.copyto(out, source))  # reads the GPU memory when it runs
        if blocking:
            run_all()
        return out

    def set(self, host):
        assert host.shape == self.shape and host.flags.c_contiguous
        target = self.view(np.ndarray)
        _queued.append(lambda: np.copyto(target, host))  # reads `host` when it runs

    def __setitem__(self, key, value):
        run_all()  # a kernel queued after the copies: it runs after them
        super().__setitem__(key, value)


def _empty(shape, dtype=None):
    return np.empty(shape, dtype=dtype).view(DeviceArray)


def _concatenate(arrays, out):
    run_all()
    return np.concatenate([a.view(np.ndarray) for a in arrays], out=out.view(np.ndarray))


def on_device(values) -> DeviceArray:
    """A new "GPU" array holding `values`."""
    return np.array(values).view(DeviceArray)


def to_host(array) -> np.ndarray:
    """The values of a "GPU" array once everything queued has run (as cupy.asnumpy)."""
    run_all()
    return array.view(np.ndarray).copy()


# The module, as CuPy is one (the core keys its choices by the array module: hashable).
GPU = types.ModuleType("stand_in_gpu")
GPU.empty = _empty
GPU.concatenate = _concatenate
GPU.cuda = types.SimpleNamespace(alloc_pinned_memory=bytearray, Event=Event)
