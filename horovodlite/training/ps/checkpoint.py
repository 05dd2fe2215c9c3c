"""The servers' checkpoints: each server its shard and optimizer state, every k updates.

Each server writes its own files, in `{root}/ps-server-{k}` for the k-th server (by shard, not
by rank, so a job restarted at another size finds them), through the elastic commits' store
(training/commit_store.py): written under a temporary name, flushed, renamed, checksummed, the
last two kept. A checkpoint is numbered by the server's update count (its version) and holds:

- `version`: the optimizer updates applied to the shard;
- `steps`: {worker rank: the steps of that worker applied to the shard};
- `layout`: the server count and the shard's pieces, so a checkpoint of another model or server
  count is refused rather than loaded into the wrong rows;
- `state`: the binding's bytes (the pieces' values and the optimizer's state).

On resume every server offers the numbers it holds intact and the job resumes from the newest
number that every server holds: under synchronous training the servers' versions move together,
so one server's newer checkpoint waits for the others'; asynchronously the newest common one is
at most one checkpoint interval older than the newest.
"""

import os
import pickle
from typing import Optional

from ..commit_store import CommitStore

__all__ = ["ServerCheckpoints", "checkpoint_folder", "checkpoint_root", "choose_resume"]


def checkpoint_folder(root: str, server_index: int) -> str:
    """Return the folder of the `server_index`-th server's checkpoints under `root`."""
    return os.path.join(root, f"ps-server-{server_index}")


class ServerCheckpoints:
    """One server's checkpoint files.

    Args:
        root: the job's checkpoint folder.
        server_index: which server (shard) this is.
        every: write a checkpoint every this many updates.
        layout: (server count, the shard's pieces as tuples): what a checkpoint must match.
    """

    def __init__(self, root: str, server_index: int, every: int, layout: tuple):
        self.store = CommitStore(checkpoint_folder(root, server_index))
        self.every, self.layout = every, layout

    def due(self, version: int) -> bool:
        return version % self.every == 0

    def write(self, version: int, steps: dict, state: bytes) -> str:
        """Store checkpoint `version` atomically; return its file."""
        record = {"version": version, "steps": dict(steps), "layout": self.layout, "state": state}
        return self.store.write(version, pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))

    def intact(self) -> dict:
        """Return {number: steps} of the checkpoints that read back whole.

        Raises:
            ValueError: a checkpoint was written for another model or server count.
        """
        found = {}
        for number in self.store.numbers():
            record = self.read(number)
            if record is not None:
                found[number] = record["steps"]
        return found

    def drop_newer(self, version: int) -> None:
        """Remove the checkpoints past `version`: the future of a run the job did not keep."""
        for number in self.store.numbers():
            if number > version:
                try:
                    os.remove(self.store.path(number))
                except FileNotFoundError:
                    pass

    def read(self, number: int) -> Optional[dict]:
        """Return checkpoint `number` (see the module docstring), or None if damaged."""
        payload = self.store.read(number)
        if payload is None:
            return None
        record = pickle.loads(payload)
        if record["layout"] != self.layout:
            raise ValueError(
                f"the parameter-server checkpoint {self.store.path(number)} was written for "
                f"another model or server count ({record['layout'][0]} servers): use another "
                "checkpoint folder, or remove it to start afresh"
            )
        return record


def checkpoint_root(every, folder, elastic_dir: str, elastic_job_id) -> Optional[str]:
    """Return the job's checkpoint folder, or None when the servers do not checkpoint.

    Raises:
        TypeError, ValueError: a bad `every`, or no folder to write to.
    """
    if every is None:
        return None
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(f"checkpoint_every must be None or an int, got {type(every).__name__}")
    if every < 1:
        raise ValueError(f"checkpoint_every must be at least 1 (updates), got {every}")
    if folder is not None:
        return os.fspath(folder)
    if elastic_job_id:
        return os.path.join(elastic_dir, elastic_job_id)
    raise ValueError(
        "checkpoint_every needs a folder: pass checkpoint_dir=, or run under horovodlite-run's "
        "elastic mode (--min-np/--max-np), whose job folder is then used"
    )


def choose_resume(offers: list) -> tuple:
    """Return (version, steps) to resume from, or (None, {}) to start afresh.

    Args:
        offers: per server, {checkpoint number: steps} of its intact checkpoints.
    """
    if not offers or not all(offers):
        return None, {}
    common = set(offers[0]).intersection(*offers[1:])
    if not common:
        return None, {}
    version = max(common)
    return version, offers[0][version]
