"""A Plan: one validated collective, what the ranks must agree on, and how to run it.

Every collective is written once, as a function that returns a Plan. The synchronous call agrees
on the plan's fields with the other ranks and runs it at once; the engine (engine.py) negotiates
many plans per cycle, fuses compatible all-reduces, and runs them on its own communicators.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .agreement import agree

__all__ = ["Plan", "run_now"]


@dataclass
class Plan:
    """A collective ready to run.

    Attributes:
        fields: the metadata every rank must submit identically (see agreement.py).
        process_set_id: which process set runs it.
        error: an argument error found on this rank; raised on every rank instead of running.
        payload: one integer that may differ per rank (allgather's rows), or None.
        execute: `execute(comm, payloads) -> result`, run on every member rank after agreement.
        fusion: for all-reduces, the FusedAllreduce entry that lets the engine fuse it.
        inline: `inline(comm) -> result` for a collective small enough to travel inside the
            agreement message itself (collectives.py); the engine ignores it.
    """

    fields: dict
    process_set_id: int
    comm: Any
    error: Optional[Exception] = None
    payload: Optional[int] = None
    execute: Optional[Callable] = None
    fusion: Any = None
    inline: Optional[Callable] = None
    extra: dict = field(default_factory=dict)

    @property
    def name(self):
        return self.fields.get("name")

    @property
    def kind(self) -> str:
        return self.fields["collective"]


def run_now(plan: Plan):
    """Agree on `plan` with the other ranks of its process set, then run it."""
    if plan.inline is not None:  # set only where this rank found no argument error
        return plan.inline(plan.comm)
    payloads = agree(plan.comm, plan.fields, plan.error, plan.payload)
    return plan.execute(plan.comm, payloads)
