"""join() for the synchronous collectives: a rank out of data answers the others' collectives.

A rank in join() takes part in every check the other ranks make, on every process set it
belongs to, sending the digest JOINED (agreement.py). Where the others agree on an all-reduce,
it contributes zeros; at a barrier it arrives; any other collective raises on the ranks that
called it, and the joined rank goes on waiting. When a check shows every member joined, that
process set is done; when the global set is, join() returns the last rank to join, the same on
every rank. (The engine answers the asynchronous collectives meanwhile: engine.py.)
"""

from .agreement import JOINED, joined_fields, post_joined
from .fusion import fused_by_kind, zeros_entry

__all__ = ["join_collectives"]


def join_collectives(state) -> None:
    """Answer the synchronous collectives of the other ranks until all have joined."""
    member_sets = [entry for entry in state.process_sets.registered() if entry.comm is not None]
    posted = {i: post_joined(entry.comm) for i, entry in enumerate(member_sets)}
    while posted:
        order = list(posted)
        requests = [posted[i][0] for i in order]
        about = lambda: ("join()", JOINED)  # noqa: E731
        which = order[state.watch.wait_any(requests, about, range(state.comm.size))]
        _, records = posted.pop(which)
        if all(digest == JOINED for digest in records.digests.tolist()):
            continue  # every member has joined: nobody can start a collective on this set
        comm = member_sets[which].comm
        fields = joined_fields(comm)
        if fields is not None:
            _answer(comm, fields)
        posted[which] = post_joined(comm)


def _answer(comm, fields: dict) -> None:
    """Take a joined rank's part in the collective `fields` that the others run."""
    kind = fields["collective"]
    if kind == "barrier":
        comm.Barrier()
    elif kind == "allreduce":
        fused_by_kind(comm, [zeros_entry(fields)])
    else:  # grouped_allreduce: its members' fields, in order
        fused_by_kind(comm, [zeros_entry(dict(m)) for m in fields["members"]])
