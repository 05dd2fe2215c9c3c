"""The messages between workers and servers, on the job's own duplicate communicator.

Every message is one Python object (messages.py: pickle protocol 5, numpy arrays sent out of
band, without copying them into the pickle). Worker to server:

- PULL `step`: send me the dense parameters for my step `step` (answered when the consistency
  rule allows: clocks.py).
- ROWS `{index: rows}`: send me these rows of these embeddings now.
- PUSH `(version, dense, sparse)`: the gradients of my step, computed on the parameters of
  update `version` of this server; `dense` is a list of arrays (one per dense piece), `sparse`
  `{index: (rows, values)}`.
- DONE: I have finished; answer with FINAL once every worker has.
- BYE: I have your FINAL; you may leave (a server that left before its FINAL was read would
  look, to a worker still waiting for another server's, like a server that died).

Server to worker: PARAMS `(version, dense)`, ROW_VALUES `{index: values}`, FINAL `(version,
dense, sparse, stats, dead workers)`.
"""

import numpy as np

__all__ = ["PULL", "ROWS", "PUSH", "DONE", "BYE", "PARAMS", "ROW_VALUES", "FINAL", "payload_bytes"]

PULL, ROWS, PUSH, DONE, BYE = 11, 12, 13, 14, 15
PARAMS, ROW_VALUES, FINAL = 21, 22, 23


def payload_bytes(obj) -> int:
    """Return the bytes of every numpy array inside `obj` (lists, tuples, dicts)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0
