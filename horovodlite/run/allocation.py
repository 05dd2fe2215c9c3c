"""The hosts and slots of a batch scheduler's allocation, read from the job's environment.

Inside a job, horovodlite-run finds where it may run without -H or --hostfile:

- Slurm: `SLURM_JOB_NODELIST` (compressed, e.g. `node[01-04,07],gpu-a[1-2]`), with
  `SLURM_TASKS_PER_NODE` (`2(x3),1`: 2 tasks on each of 3 nodes, then 1) and `SLURM_NTASKS`;
- PBS Pro / Torque: `PBS_NODEFILE`, a file naming each host once per slot;
- LSF: `LSB_MCPU_HOSTS`, `host1 4 host2 2`;
- the Kubernetes MPI Operator: the hostfile it mounts in the launcher pod (`/etc/mpi/hostfile`,
  named by `OMPI_MCA_orte_default_hostfile`, `HYDRA_HOST_FILE` or `I_MPI_HYDRA_HOST_FILE`).

Everything is checked before anything starts: a malformed value raises ValueError naming the
variable, what was expected and the text found.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import NamedTuple

from .hosts import checked_host, parse_hostfile

__all__ = [
    "Allocation",
    "SCHEDULERS",
    "detect_allocation",
    "expand_nodelist",
    "expand_tasks_per_node",
    "slurm_allocation",
    "pbs_allocation",
    "lsf_allocation",
    "kubernetes_allocation",
]

# The MPI Operator mounts the hostfile here and names it in the launcher's environment.
KUBERNETES_HOSTFILE = "/etc/mpi/hostfile"
_KUBERNETES_VARIABLES = ("OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE",
                         "I_MPI_HYDRA_HOST_FILE")  # fmt: skip


class Allocation(NamedTuple):
    """Where a scheduler lets this job run: its hosts, and the number of tasks it asked for."""

    scheduler: str  # "Slurm", "PBS", "LSF" or "Kubernetes"
    hosts: list  # Host entries, in the scheduler's order
    tasks: int  # the default -np: the tasks the job asked for (at most the slots)
    source: str  # the variables or file read, for messages

    def describe(self) -> str:
        """Return one line: scheduler, tasks, hosts and where they were read."""
        hosts = ",".join(f"{h.name}:{h.slots}" for h in self.hosts)
        return f"{self.scheduler} allocation: {self.tasks} tasks on {hosts} (from {self.source})"


# --- Slurm's compressed lists --------------------------------------------------------------------

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
# A name piece: anything but brackets and commas (Slurm allows dots, e.g. 10.0.0.[1-3]).
_PIECE = re.compile(r"[^\[\],\s]+")


def _expand_ranges(text: str, where: str) -> list:
    """Return the numbers of `1-3,07` as strings, zero-padded to the width of each low bound."""
    numbers = []
    for part in text.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"{where}: bad range {part!r} in [{text}]: expected N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"{where}: range {part!r} in [{text}] runs backwards")
        if int(high) - int(low) >= 1_000_000:
            raise ValueError(f"{where}: range {part!r} names more than a million hosts")
        # As Slurm: the low bound's digits set the width (08-10 gives 08 09 10, 8-10 gives 8 9 10).
        numbers += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return numbers


def _expand_entry(entry: str, where: str) -> list:
    """Expand one `prefix[ranges]prefix[ranges]...` entry (a product over its bracket groups)."""
    choices, position = [], 0
    while position < len(entry):
        if entry[position] == "[":
            close = entry.find("]", position)
            if close < 0:
                raise ValueError(f"{where}: {entry!r} opens '[' without closing it")
            choices.append(_expand_ranges(entry[position + 1 : close], where))
            position = close + 1
            if position < len(entry) and entry[position] != "[":
                # Slurm rejects a name that goes on after a bracket, unless another follows.
                nxt = entry.find("[", position)
                if nxt < 0:
                    raise ValueError(
                        f"{where}: {entry!r} goes on after ']': names end with a range"
                    )
                choices.append([entry[position:nxt]])
                position = nxt
            continue
        match = _PIECE.match(entry, position)
        if match is None:
            raise ValueError(f"{where}: unexpected {entry[position]!r} in {entry!r}")
        choices.append([match.group(0)])
        position = match.end()
    return ["".join(parts) for parts in itertools.product(*choices)]


def _split_top_level(text: str, where: str) -> list:
    """Split at commas outside brackets."""
    entries, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError(f"{where}: nested '[' in {text!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"{where}: ']' without '[' in {text!r}")
            depth = 0
        elif char == "," and not depth:
            entries.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError(f"{where}: {text!r} opens '[' without closing it")
    return entries + [text[start:]]


def expand_nodelist(text: str, where: str = "SLURM_JOB_NODELIST") -> list:
    """Expand Slurm's compressed host list (`node[01-04,07],gpu-a[1-2]`) into host names.

    Names keep the order and repetitions written, as `scontrol show hostnames` does.

    Raises:
        ValueError: an empty list or entry, unbalanced brackets, or a bad range.
    """
    if not text or not text.strip():
        raise ValueError(f"{where} is empty: expected host names such as node[01-04],gpu1")
    names = []
    for entry in _split_top_level(text.strip(), where):
        if not entry:
            raise ValueError(f"{where}={text!r}: empty entry (stray ',')")
        names += _expand_entry(entry, f"{where}={text!r}")
    return names


_TASKS = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def expand_tasks_per_node(text: str, where: str = "SLURM_TASKS_PER_NODE") -> list:
    """Expand Slurm's `2(x3),1` into [2, 2, 2, 1].

    Raises:
        ValueError: an entry that is not N or N(xK) with N >= 0 and K >= 1.
    """
    counts = []
    for part in (text or "").split(","):
        match = _TASKS.fullmatch(part.strip())
        if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
            raise ValueError(
                f"{where}={text!r}: bad entry {part!r}: expected N or N(xK), e.g. 2(x3),1"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _positive(environ: dict, name: str) -> int | None:
    text = environ.get(name)
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise ValueError(f"{name}={text!r}: expected a positive integer")
    return int(text)


def _hosts(pairs: list, where: str) -> list:
    """Hosts from (name, slots) pairs: checked names, one entry per host, no empty host."""
    hosts = [checked_host(name, slots, where) for name, slots in pairs if slots > 0]
    seen = set()
    for host in hosts:
        if host.name in seen:
            raise ValueError(f"{where}: host {host.name!r} is listed twice")
        seen.add(host.name)
    if not hosts:
        raise ValueError(f"{where}: the allocation has no slots")
    return hosts


def slurm_allocation(environ: dict) -> Allocation:
    """Read a Slurm job's nodes and tasks per node."""
    name = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in environ else "SLURM_NODELIST"
    nodes = expand_nodelist(environ[name], name)
    if "SLURM_TASKS_PER_NODE" in environ:
        counts = expand_tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
        if len(counts) != len(nodes):
            raise ValueError(
                f"SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']!r} gives {len(counts)} "
                f"nodes, but {name}={environ[name]!r} names {len(nodes)}"
            )
    else:  # e.g. salloc --nodes=2 without tasks: one per node
        counts = [1] * len(nodes)
    hosts = _hosts(list(zip(nodes, counts)), f"{name} and SLURM_TASKS_PER_NODE")
    slots = sum(h.slots for h in hosts)
    tasks = _positive(environ, "SLURM_NTASKS") or slots
    if tasks > slots:
        raise ValueError(f"SLURM_NTASKS={tasks} is more than the {slots} tasks per node listed")
    return Allocation("Slurm", hosts, tasks, f"{name}, SLURM_TASKS_PER_NODE")


def pbs_allocation(environ: dict) -> Allocation:
    """Read a PBS/Torque job's node file: each host once per slot."""
    path = environ["PBS_NODEFILE"]
    with open(path) as f:
        names = [line.split()[0] for line in f if line.split()]
    counts: dict = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    if not counts:
        raise ValueError(f"PBS_NODEFILE {path} lists no host")
    hosts = _hosts(list(counts.items()), f"PBS_NODEFILE {path}")
    return Allocation("PBS", hosts, sum(counts.values()), f"PBS_NODEFILE={path}")


def lsf_allocation(environ: dict) -> Allocation:
    """Read an LSF job's `LSB_MCPU_HOSTS` (`host1 4 host2 2`)."""
    text = environ["LSB_MCPU_HOSTS"]
    words = text.split()
    if not words or len(words) % 2:
        raise ValueError(f"LSB_MCPU_HOSTS={text!r}: expected pairs of host and slots")
    pairs = []
    for name, slots in zip(words[::2], words[1::2]):
        if not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"LSB_MCPU_HOSTS={text!r}: {name} has slots {slots!r}")
        pairs.append((name, int(slots)))
    hosts = _hosts(pairs, "LSB_MCPU_HOSTS")
    return Allocation("LSF", hosts, sum(h.slots for h in hosts), "LSB_MCPU_HOSTS")


def _kubernetes_hostfile(environ: dict) -> str | None:
    for name in _KUBERNETES_VARIABLES:
        if environ.get(name):
            return environ[name]
    if "KUBERNETES_SERVICE_HOST" in environ and os.path.isfile(KUBERNETES_HOSTFILE):
        return KUBERNETES_HOSTFILE
    return None


def kubernetes_allocation(environ: dict) -> Allocation:
    """Read the MPI Operator's hostfile (`worker-0.NAME slots=N` or `worker-0.NAME:N` lines)."""
    path = _kubernetes_hostfile(environ)
    hosts = parse_hostfile(path)
    return Allocation("Kubernetes", hosts, sum(h.slots for h in hosts), f"hostfile {path}")


# Checked in this order: an allocation inside another (a Slurm job on a Kubernetes node) is the
# innermost, which sets its variables last and more specifically.
SCHEDULERS = (
    ("Slurm", lambda env: "SLURM_JOB_NODELIST" in env or "SLURM_NODELIST" in env,
     slurm_allocation),
    ("PBS", lambda env: bool(env.get("PBS_NODEFILE")), pbs_allocation),
    ("LSF", lambda env: bool(env.get("LSB_MCPU_HOSTS")), lsf_allocation),
    ("Kubernetes", lambda env: _kubernetes_hostfile(env) is not None, kubernetes_allocation),
)  # fmt: skip


def detect_allocation(environ: dict | None = None) -> Allocation | None:
    """Return the allocation this process runs in, or None outside any scheduler's job.

    Raises:
        ValueError: the scheduler's variables or files are malformed.
        OSError: a node file or hostfile cannot be read.
    """
    environ = os.environ if environ is None else environ
    for _, present, read in SCHEDULERS:
        if present(environ):
            return read(environ)
    return None
