"""A Plan: one validated collective, what the ranks must agree on, and how to run it.

Every collective is written once, as a function that returns a Plan (collectives.py). The
synchronous call agrees on the plan's fields with the other ranks and runs it at once
(`run_now`); the engine (engine.py) negotiates many plans per cycle, fuses compatible
all-reduces, and runs them on its own communicators.
"""

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .agreement import agree, describe, digest
from .state import current

__all__ = ["Plan", "run_now", "synchronous", "signature_of", "templates", "waiter"]


@dataclass(slots=True)
class Plan:
    """A collective ready to run.

    Attributes:
        fields: the metadata every rank must submit identically (see agreement.py).
        process_set_id: which process set runs it.
        comm: this rank's communicator on that process set (synchronous use).
        ranks: the global ranks of the process set, for messages.
        error: an argument error found on this rank; raised on every rank instead of running.
        payload: one integer that may differ per rank (allgather's rows), or None.
        execute: `execute(comm, payloads) -> result`, run on every member rank after agreement.
        fusion: for all-reduces, the fusion.FusionEntry that lets the engine fuse it.
        inline: `inline(comm) -> result` for a collective small enough to travel inside the
            agreement message itself (small_allreduce.py); the engine ignores it.
    """

    fields: dict
    process_set_id: int
    comm: Any
    ranks: Optional[tuple] = None
    error: Optional[Exception] = None
    payload: Optional[int] = None
    execute: Optional[Callable] = None
    fusion: Any = None
    inline: Optional[Callable] = None

    @property
    def name(self):
        return self.fields.get("name")

    @property
    def kind(self) -> str:
        return self.fields["collective"]


_TEMPLATE_LIMIT = 4096  # distinct calls; past it the memo starts afresh
_templates: tuple = (None, {})  # (the Settings they were made under, {key: template})


def templates(settings) -> dict:
    """Return the memo in which plan functions keep what they derived from repeated arguments.

    A plan function keys it by every argument it derives from (plain values only) and stores
    only what passed its checks, so a hit skips the checks and the fields; the short all-reduces
    keep their routes in it too (small_allreduce.py, keys tagged as theirs). The memo belongs to
    one Settings object: a new init(), or a test that replaces the settings, starts a new one.
    """
    global _templates
    owner, memo = _templates
    if owner is not settings or len(memo) > _TEMPLATE_LIMIT:
        memo = {}
        _templates = (settings, memo)
    return memo


def run_now(plan: Plan):
    """Agree on `plan` with the other ranks of its process set, then run it."""
    if plan.inline is not None:  # set only where this rank found no argument error
        return plan.inline(plan.comm)
    state = current()
    payloads = agree(
        plan.comm,
        plan.fields,
        plan.error,
        plan.payload,
        check=state.settings.check_metadata,
        ranks=plan.ranks,
        wait=waiter(state, plan.fields, plan.ranks),
    )
    return plan.execute(plan.comm, payloads)


def waiter(state, fields: dict, ranks) -> Callable:
    """Return `wait(request)` for the check of collective `fields` among global `ranks`."""
    return state.watch.check_waiter(lambda: (describe(fields), digest(fields)), ranks)


def synchronous(make_plan: Callable, name: str, **fixed) -> Callable:
    """Return the blocking collective `name` that runs `make_plan(...)` at once.

    The collective takes `make_plan`'s arguments (and shows its signature and docstring);
    `fixed` are keyword arguments it always passes, such as `inplace=True`.
    """

    @functools.wraps(make_plan)
    def collective(*args, **kwargs):
        return run_now(make_plan(*args, **fixed, **kwargs))

    collective.__name__ = collective.__qualname__ = name
    collective.__signature__ = signature_of(make_plan, fixed)
    return collective


def signature_of(make_plan: Callable, fixed: dict):
    """Return the signature a collective built on `make_plan` shows: its arguments less `fixed`."""
    signature = inspect.signature(make_plan)
    kept = [p for name, p in signature.parameters.items() if name not in fixed]
    return signature.replace(parameters=kept, return_annotation=inspect.Signature.empty)
