"""What a server measures: pushes, bytes, the staleness of every push, and who died."""

import time

import numpy as np

__all__ = ["ServerStats", "job_report"]


class ServerStats:
    """Counters of one server, from its first message to its last."""

    def __init__(self, rank: int):
        self.rank = rank
        self.pushes = self.updates = self.bytes_in = self.bytes_out = 0
        self.pushes_by: dict = {}  # worker -> pushes received from it (its steps, seen here)
        self.staleness: list = []  # per push: updates applied since its parameters were pulled
        self.dead: dict = {}  # worker -> the steps it had pushed when it was found dead
        self.start = self.stop = None

    def pushed(self, worker: int) -> None:
        self.pushes += 1
        self.pushes_by[worker] = self.pushes_by.get(worker, 0) + 1

    def heard(self) -> None:
        self.start = self.start if self.start is not None else time.perf_counter()

    def summary(self) -> dict:
        seconds = (self.stop or time.perf_counter()) - (self.start or time.perf_counter())
        stale = np.asarray(self.staleness, dtype=np.int64)
        counts = np.bincount(stale) if stale.size else np.zeros(0, np.int64)
        return {
            "rank": self.rank,
            "pushes": self.pushes,
            "updates": self.updates,
            "seconds": seconds,
            "pushes_per_s": self.pushes / seconds if seconds > 0 else 0.0,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "bytes_per_s": (self.bytes_in + self.bytes_out) / seconds if seconds > 0 else 0.0,
            "staleness_mean": float(stale.mean()) if stale.size else 0.0,
            "staleness_max": int(stale.max()) if stale.size else 0,
            "staleness_histogram": counts.tolist(),  # [pushes with staleness 0, 1, 2, ...]
            "dead_workers": {str(w): step for w, step in sorted(self.dead.items())},
        }


def job_report(servers: list) -> dict:
    """Combine the servers' summaries into one report of the job."""
    width = max((len(s["staleness_histogram"]) for s in servers), default=0)
    hist = [
        sum(s["staleness_histogram"][k] for s in servers if k < len(s["staleness_histogram"]))
        for k in range(width)
    ]
    pushes = sum(s["pushes"] for s in servers)
    return {
        "servers": servers,
        "pushes": pushes,
        "pushes_per_s": sum(s["pushes_per_s"] for s in servers),
        "bytes_per_s": sum(s["bytes_per_s"] for s in servers),
        "bytes_moved": sum(s["bytes_in"] + s["bytes_out"] for s in servers),
        "staleness_histogram": hist,
        "staleness_mean": (
            sum(k * n for k, n in enumerate(hist)) / sum(hist) if sum(hist) else 0.0
        ),
        "staleness_max": max((k for k, n in enumerate(hist) if n), default=0),
        "dead_workers": sorted({int(w) for s in servers for w in s["dead_workers"]}),
    }
