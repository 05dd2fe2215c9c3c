"""Settings: every HOROVODLITE_* environment variable, read in this one module.

`init()` reads them once into a frozen `Settings`, so a bad value fails before any communicator
exists and no collective pays for an environment lookup (one costs more than a small all-reduce
may). Every setting that Horovod also has falls back to Horovod's `HOROVOD_*` name, so a Horovod
job script keeps its tuning; the `HOROVODLITE_*` name wins when both are set, and an empty value
counts as unset.
"""

import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Optional

from . import algorithms

__all__ = ["Settings", "env_value", "env_flag", "HOSTS_UPDATED_EXIT_CODE", "TRANSPORTS"]

# What HOROVODLITE_TRANSPORT may name (transport.py): the data plane of the collectives.
TRANSPORTS = ("auto", "mpi", "gloo", "nccl", "cupy-nccl")

# The exit status with which every rank of an elastic job leaves after `commit()` saw new hosts:
# the launcher restarts the job at the larger size from that commit instead of counting a failure.
HOSTS_UPDATED_EXIT_CODE = 75


def env_value(name: str, default, cast: Callable = str, horovod: bool = False):
    """Return HOROVODLITE_<name> cast by `cast`, else HOROVOD_<name> if `horovod`, else `default`.

    Raises:
        ValueError: the value does not parse, naming the variable.
    """
    prefixes = ("HOROVODLITE_", "HOROVOD_") if horovod else ("HOROVODLITE_",)
    for prefix in prefixes:
        value = os.environ.get(prefix + name)
        if value not in (None, ""):
            try:
                return cast(value)
            except ValueError as exc:
                raise ValueError(f"{prefix}{name}={value!r}: {exc}") from None
    return default


def env_flag(value: str) -> bool:
    """Parse a yes/no setting: 0, false, no and off are False; 1, true, yes and on are True."""
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True)
class Settings:
    """Every setting of one initialized job. Environment names drop the HOROVODLITE_ prefix.

    Attributes:
        check_metadata: CHECK_METADATA (default on): agree on every collective's metadata first.
        allreduce_algorithm: ALLREDUCE_ALGORITHM: "ring", "naive", "mpi", "hierarchical", or
            None (by size); HIERARCHICAL_ALLREDUCE=1 (Horovod's too) means "hierarchical".
        hierarchical_allgather: HIERARCHICAL_ALLGATHER (Horovod's too): 1 gathers host by host
            (algorithms/hierarchical.py), 0 never; unset lets the default choose.
        ring_segment_bytes: RING_SEGMENT_BYTES (1 MiB): the ring's largest single message.
        cycle_time: CYCLE_TIME (ms; Horovod's too), stored in seconds: the engine's cycle.
        fusion_threshold: FUSION_THRESHOLD (bytes; Horovod's too): 0 disables fusion.
        stall_check: STALL_CHECK_TIME_SECONDS (Horovod's too): seconds before a stall warning.
        stall_shutdown: STALL_SHUTDOWN_TIME_SECONDS (Horovod's too): 0 never stops the engine.
        collective_timeout: COLLECTIVE_TIMEOUT (600): seconds one wait on other ranks may last
            before it fails and the job is torn down.
        timeline: TIMELINE (Horovod's too): a Chrome-trace file written by rank 0, or None.
        timeline_mark_cycles: TIMELINE_MARK_CYCLES (Horovod's too): mark engine cycles.
        overlap: OVERLAP (1 or 0; unset: decided by the cores per rank): whether the engine
            runs cycles while requests are still being submitted, to overlap communication
            with computation, or only once somebody waits for a result.
        exit_report_dir: EXIT_REPORT_DIR, set by horovodlite-run: a folder where each rank
            notes its process at init() and its leaving at shutdown, so that the launcher can
            name a rank that ended without leaving (os._exit, a signal, a crash).
        elastic_job_id: ELASTIC_JOB_ID, set by `horovodlite-run --min-np/--max-np`: the elastic
            job this process belongs to (the same across restarts), or None outside elastic runs.
        elastic_dir: ELASTIC_DIR (default: `horovodlite-elastic` in the system temp folder): where
            each rank keeps its durable copies of the committed state, under the job id.
        elastic_hosts_file: ELASTIC_HOSTS_FILE, set by the elastic launcher: a file it rewrites
            (one line, a counter) whenever host discovery finds new slots, which `commit()` and
            `check_host_updates()` watch.
        elastic_hosts_baseline: ELASTIC_HOSTS_BASELINE, set by the elastic launcher: the counter
            in the hosts file when it started this run; a different counter means new hosts.
        elastic_restart: ELASTIC_RESTART (0): how many times the elastic launcher restarted the
            job before this run.
        transport: TRANSPORT ("auto"): what moves the collectives' data once the ranks agreed
            (transport.py): "auto" (MPI for host buffers; for GPU buffers NCCL if there, else
            CUDA-aware MPI, else MPI through host memory), "mpi", "gloo" (torch.distributed's
            Gloo for host buffers), "nccl" (torch.distributed's NCCL for GPU buffers) or
            "cupy-nccl" (CuPy's NCCL binding for GPU buffers).
        gloo_iface: GLOO_IFACE (Horovod's too): the network interface whose address the `gloo`
            transport uses across hosts (else torch's GLOO_SOCKET_IFNAME, else the address of
            the host's name; hosts.py).
    """

    check_metadata: bool = True
    allreduce_algorithm: Optional[str] = None
    hierarchical_allgather: Optional[bool] = None
    ring_segment_bytes: int = 1 << 20
    cycle_time: float = 0.001
    fusion_threshold: int = 128 * 1024 * 1024
    stall_check: float = 60.0
    stall_shutdown: float = 0.0
    collective_timeout: float = 600.0
    timeline: Optional[str] = None
    timeline_mark_cycles: bool = False
    overlap: Optional[bool] = None
    exit_report_dir: Optional[str] = None
    elastic_job_id: Optional[str] = None
    elastic_dir: str = os.path.join(tempfile.gettempdir(), "horovodlite-elastic")
    elastic_hosts_file: Optional[str] = None
    elastic_hosts_baseline: Optional[int] = None
    elastic_restart: int = 0
    transport: str = "auto"
    gloo_iface: Optional[str] = None

    @classmethod
    def from_environment(cls) -> "Settings":
        """Read every setting from the environment.

        Raises:
            ValueError: a value does not parse, or names no known algorithm.
        """
        algorithm = env_value("ALLREDUCE_ALGORITHM", None)
        if algorithm is None and env_value("HIERARCHICAL_ALLREDUCE", False, env_flag, True):
            algorithm = "hierarchical"  # Horovod's switch for the same thing
        try:
            algorithm = algorithms.requested_algorithm(algorithm)
        except ValueError as exc:
            raise ValueError(f"HOROVODLITE_ALLREDUCE_ALGORITHM={algorithm!r}: {exc}") from None
        segment = _positive(
            "RING_SEGMENT_BYTES", env_value("RING_SEGMENT_BYTES", cls.ring_segment_bytes, int)
        )
        return cls(
            check_metadata=env_value("CHECK_METADATA", True, env_flag),
            allreduce_algorithm=algorithm,
            hierarchical_allgather=env_value("HIERARCHICAL_ALLGATHER", None, env_flag, True),
            ring_segment_bytes=segment,
            cycle_time=env_value("CYCLE_TIME", 1.0, float, horovod=True) / 1000.0,
            fusion_threshold=env_value("FUSION_THRESHOLD", cls.fusion_threshold, int, True),
            stall_check=env_value("STALL_CHECK_TIME_SECONDS", cls.stall_check, float, True),
            stall_shutdown=env_value(
                "STALL_SHUTDOWN_TIME_SECONDS", cls.stall_shutdown, float, horovod=True
            ),
            collective_timeout=_positive(
                "COLLECTIVE_TIMEOUT", env_value("COLLECTIVE_TIMEOUT", cls.collective_timeout, float)
            ),
            timeline=env_value("TIMELINE", None, str, horovod=True),
            timeline_mark_cycles=bool(env_value("TIMELINE_MARK_CYCLES", 0, int, horovod=True)),
            overlap=env_value("OVERLAP", None, env_flag),
            exit_report_dir=env_value("EXIT_REPORT_DIR", None, str),
            elastic_job_id=env_value("ELASTIC_JOB_ID", None, str),
            elastic_dir=env_value("ELASTIC_DIR", cls.elastic_dir, str),
            elastic_hosts_file=env_value("ELASTIC_HOSTS_FILE", None, str),
            elastic_hosts_baseline=env_value("ELASTIC_HOSTS_BASELINE", None, int),
            elastic_restart=env_value("ELASTIC_RESTART", 0, int),
            transport=env_value("TRANSPORT", "auto", _transport_name),
            gloo_iface=env_value("GLOO_IFACE", None, str, horovod=True),
        )


def _transport_name(value: str) -> str:
    name = value.strip().lower()
    if name not in TRANSPORTS:
        raise ValueError(f"expected one of {', '.join(TRANSPORTS)}")
    return name


def _positive(name: str, value):
    if not value > 0:
        raise ValueError(f"HOROVODLITE_{name} must be positive, got {value}")
    return value
