"""Durable copies of an elastic state's commits: one folder per rank, the last two commits kept.

A commit file is a header (magic, payload length, SHA-256 of the payload) and the payload. It is
written under a temporary name, flushed to disk, then renamed: a reader sees the whole file or
none of it. A reader also checks the length and the checksum, so a file cut short or damaged
after the rename (a full disk, a crash of the machine before the data reached the disk) is
skipped as well, and the commit before it is used instead. Nothing here communicates.
"""

import glob
import hashlib
import os
import re
import struct
import warnings
from typing import Optional

__all__ = ["CommitStore", "commit_folder"]

_MAGIC = b"HVDLITE-COMMIT\x01"
_HEADER = struct.Struct(">Q32s")  # payload length, SHA-256 of the payload
_NAME = re.compile(r"^commit-(\d{12})\.bin$")
KEEP = 2  # commits kept per rank: the newest, and the one before in case it is damaged


def commit_folder(elastic_dir: str, job_id: str, rank: int) -> str:
    """Return the folder where rank `rank` of elastic job `job_id` keeps its commits."""
    return os.path.join(elastic_dir, job_id, f"rank-{rank}")


class CommitStore:
    """The commit files of one rank: write atomically, read the newest intact one."""

    def __init__(self, folder: str):
        self.folder = folder

    def path(self, number: int) -> str:
        """Return the file of commit `number`."""
        return os.path.join(self.folder, f"commit-{number:012d}.bin")

    def write(self, number: int, payload: bytes) -> str:
        """Store `payload` as commit `number`, atomically, and drop all but the last KEEP commits.

        Returns the file's path.
        """
        os.makedirs(self.folder, exist_ok=True)
        final = self.path(number)
        temporary = f"{final}.tmp-{os.getpid()}"
        header = _MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest())
        with open(temporary, "wb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
        _fsync_folder(self.folder)
        self._prune(keep_from=number)
        return final

    def numbers(self) -> list:
        """Return the numbers of the commit files present (intact or not), newest first."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        found = (_NAME.match(name) for name in names)
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def read(self, number: int) -> Optional[bytes]:
        """Return commit `number`'s payload, or None if the file is missing, short or damaged."""
        try:
            with open(self.path(number), "rb") as f:
                data = f.read()
        except OSError:
            return None
        start = len(_MAGIC) + _HEADER.size
        if len(data) < start or not data.startswith(_MAGIC):
            return None
        length, digest = _HEADER.unpack_from(data, len(_MAGIC))
        payload = data[start:]
        if len(payload) != length or hashlib.sha256(payload).digest() != digest:
            return None
        return payload

    def newest(self) -> tuple:
        """Return (number, payload) of the newest intact commit, or (-1, None) if there is none.

        A damaged file is reported with a warning and skipped in favour of the one before it.
        """
        for number in self.numbers():
            payload = self.read(number)
            if payload is not None:
                return number, payload
            warnings.warn(
                f"horovodlite elastic: {self.path(number)} is incomplete or damaged: skipped",
                RuntimeWarning,
                stacklevel=2,
            )
        return -1, None

    def _prune(self, keep_from: int) -> None:
        """Remove commits older than the KEEP newest up to `keep_from`, and leftover temp files."""
        kept = [n for n in self.numbers() if n <= keep_from][:KEEP]
        for number in self.numbers():
            if number not in kept and number <= keep_from:
                _remove(self.path(number))
        for leftover in glob.glob(os.path.join(glob.escape(self.folder), "commit-*.bin.tmp-*")):
            _remove(leftover)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable (POSIX: the folder entry lives in the folder's data)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder; the rename is still atomic
    finally:
        os.close(fd)
