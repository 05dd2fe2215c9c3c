"""Fusion buckets: a cycle's agreed requests, in their agreed order, grouped into batches to run.

All-reduces that can share one fusion buffer and one collective (the same process set and
fusion key: dtype, op, scaling, algorithm, device; fusion.FusionEntry.key) go into one bucket,
up to the fusion threshold in bytes; one that would pass it closes the bucket and opens the next.
An array larger than the threshold runs alone, and so does every request when the threshold is
0 or the collective is not a fusable all-reduce. The batches come in the order their first
request was agreed, and each keeps the agreed order inside it, the same on every rank.

This module owns that grouping; fusion.py moves each batch's data.
"""

__all__ = ["into_batches"]


def into_batches(requests: list, threshold: int) -> list:
    """Return `requests` grouped into batches (lists) to run in order, buckets <= `threshold`."""
    batches, open_buckets = [], {}
    # Requests mostly come in runs of one kind: a run looks its bucket up once. Fusion keys are
    # interned (fusion.fusion_key), so the same kind is the same key object.
    key = bucket = None  # (process set, fusion key) of the request before, and its bucket
    for request in requests:
        fusion = request.fusion
        if fusion is None or threshold <= 0:
            batches.append([request])
            continue
        if key is None or fusion.key is not key[1] or request.key[0] != key[0]:
            key = (request.key[0], fusion.key)
            bucket = open_buckets.get(key)  # [bytes, requests]
        nbytes = fusion.array.nbytes
        if bucket is None or bucket[0] + nbytes > threshold:
            bucket = open_buckets[key] = [0, []]
            batches.append(bucket[1])
        bucket[0] += nbytes
        bucket[1].append(request)
    return batches
