"""Asynchronous training with sharded parameter servers, without the framework (see docs/ps.md).

`layout` decides which server holds which rows of which parameter, `clocks` the consistency rule
(asynchronous, bounded staleness, synchronous), `server` and `worker` the two sides of the
messages (`protocol`), `waits` waiting without a busy core and telling a dead peer, `stats` what
the servers measure, `startup` the job's communicator, the roles and the checks every rank
agrees on before training.
"""

from .clocks import Clocks
from .layout import Piece, plan_shards
from .server import ServerLoop
from .stats import job_report
from .worker import WorkerClient

__all__ = ["Clocks", "Piece", "ServerLoop", "WorkerClient", "job_report", "plan_shards"]
