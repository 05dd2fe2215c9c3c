"""Mistakes on one rank raise on every rank, name the ranks and values, and leave no desync.

The rank at fault ("odd", the last rank) raises its own TypeError/ValueError/NotImplementedError
when its arguments are bad; every other rank raises a MismatchError that says what went wrong.
When all arguments are valid but differ, every rank raises MismatchError.
"""

import re

import numpy as np
import pytest
from oracle import WORLD, expect_error_everywhere, still_in_step

import horovodlite as hvd

needs_two = pytest.mark.skipif(WORLD.size < 2, reason="a mismatch needs two ranks")


def odd_rank() -> int:
    return hvd.size() - 1


def on_odd(odd_value, value):
    """Return `odd_value` on the odd rank and `value` on the others."""
    return odd_value if hvd.rank() == odd_rank() else value


# (label, call where the odd rank's arguments differ, the field, its repr on the odd rank and on
# the others, and what the message calls the collective)
VALID_BUT_DIFFERENT = [
    ("shape", lambda: hvd.allreduce(np.ones(on_odd((4,), (3,))), name="w"),
     "shape", "(4,)", "(3,)", "allreduce 'w'"),
    ("dtype", lambda: hvd.allreduce(np.ones(3, on_odd(np.float64, np.float32)), name="w"),
     "dtype", "'float64'", "'float32'", "allreduce 'w'"),
    ("name", lambda: hvd.allreduce(np.ones(3), name=on_odd("bias", "weight")),
     "name", "'bias'", "'weight'", "allreduce"),
    ("op", lambda: hvd.allreduce(np.ones(3), op=on_odd(hvd.Min, hvd.Sum)),
     "op", "'MIN'", "'SUM'", "allreduce (unnamed)"),
    ("prescale", lambda: hvd.allreduce(np.ones(3), prescale_factor=on_odd(2.0, 1.0)),
     "prescale_factor", "2.0", "1.0", "allreduce (unnamed)"),
    ("algorithm", lambda: hvd.allreduce(np.ones(3), algorithm=on_odd("naive", "ring")),
     "algorithm", "'naive'", "'ring'", "allreduce (unnamed)"),
    ("root", lambda: hvd.broadcast(np.ones(3), root_rank=on_odd(1, 0), name="b"),
     "root_rank", "1", "0", "broadcast 'b'"),
    ("collective", lambda: on_odd(lambda x: hvd.broadcast(x, 0), hvd.allreduce)(np.ones(3)),
     "collective", "'broadcast'", "'allreduce'", "collective"),
    ("allgather trailing dimensions", lambda: hvd.allgather(np.ones((2, on_odd(4, 3))), name="g"),
     "trailing_shape", "(4,)", "(3,)", "allgather 'g'"),
    ("allgather dtype", lambda: hvd.allgather(np.ones((2, 3), on_odd(np.int32, np.int64))),
     "dtype", "'int32'", "'int64'", "allgather (unnamed)"),
    ("reducescatter shape", lambda: hvd.reducescatter(np.ones((on_odd(5, 4), 2))),
     "shape", "(5, 2)", "(4, 2)", "reducescatter (unnamed)"),
    ("alltoall splits on one rank only",
     lambda: hvd.alltoall(np.ones(hvd.size()), splits=on_odd([1] * hvd.size(), None)),
     "splits_given", "True", "False", "alltoall (unnamed)"),
    ("broadcast_object root", lambda: hvd.broadcast_object("x", root_rank=on_odd(1, 0)),
     "root_rank", "1", "0", "broadcast_object (unnamed)"),
]  # fmt: skip


@needs_two
@pytest.mark.parametrize(
    "call, key, odd_value, value, header",
    [pytest.param(*case[1:], id=case[0]) for case in VALID_BUT_DIFFERENT],
)
def test_valid_but_different_arguments(call, key, odd_value, value, header):
    odd = odd_rank()
    text = expect_error_everywhere(call, set(), None, f"{header}: ")
    # The message lists the rarest value first, naming the field once: either order is fine.
    others = "rank 0" if odd == 1 else "ranks " + ", ".join(map(str, range(odd)))
    pattern = rf"{{}} sent ({key} )?{{}}"
    assert re.search(pattern.format(f"rank {odd}", re.escape(odd_value)), text), text
    assert re.search(pattern.format(others, re.escape(value)), text), text
    assert f"sent {key} " in text, text
    still_in_step()


# (label, call with bad arguments on the odd rank, the odd rank's error, its message)
BAD_ON_ONE_RANK = [
    (
        "alltoall splits that do not add up",
        lambda: hvd.alltoall(
            np.ones((hvd.size(), 2)), splits=on_odd([9] + [0] * (hvd.size() - 1), None)
        ),
        ValueError,
        "add up to 9, but dimension 0 has",
    ),
    (
        "negative splits",
        lambda: hvd.alltoall(
            np.ones(hvd.size()), splits=on_odd([-1, hvd.size() + 1] + [0] * (hvd.size() - 2), None)
        ),
        ValueError,
        "must be non-negative",
    ),
    (
        "root out of range",
        lambda: hvd.broadcast(np.ones(3), root_rank=on_odd(hvd.size(), 0)),
        ValueError,
        "is not a rank of this process set",
    ),
    (
        "root not an int",
        lambda: hvd.broadcast(np.ones(3), root_rank=on_odd("0", 0)),
        TypeError,
        "root_rank must be an int",
    ),
    (
        "Adasum of integers",
        lambda: hvd.allreduce(np.ones(3, np.int32), op=on_odd(hvd.Adasum, hvd.Sum)),
        TypeError,
        "Adasum combines floating-point vectors",
    ),
    (
        "unknown op",
        lambda: hvd.allreduce(np.ones(3), op=on_odd("median", "sum")),
        ValueError,
        "unknown reduce op 'median'",
    ),
    (
        "unknown algorithm",
        lambda: hvd.allreduce(np.ones(3), algorithm=on_odd("tree", None)),
        ValueError,
        "unknown algorithm 'tree'",
    ),
    (
        "unsupported dtype",
        lambda: hvd.allreduce(np.ones(3, on_odd(np.complex64, np.float32)), name="c"),
        TypeError,
        "dtype complex64 is not supported",
    ),
    (
        "object array",
        lambda: hvd.broadcast(on_odd(np.array([None]), np.ones(1)), root_rank=0),
        TypeError,
        "dtype object is not supported",
    ),
    (
        "not an array",
        lambda: hvd.allgather(on_odd([[1.0], [1.0, 2.0]], np.ones(3)), name="o"),
        TypeError,
        "expected an array",
    ),
    (
        "Average of bool",
        lambda: hvd.allreduce(np.ones(3, bool), op=on_odd(hvd.Average, hvd.Max)),
        TypeError,
        "Average of bool arrays is undefined",
    ),
    (
        "0-d allgather",
        lambda: hvd.allgather(on_odd(np.float64(1.0), np.ones(1))),
        ValueError,
        "0-d array",
    ),
    (
        "read-only in-place input",
        lambda: hvd.allreduce_(on_odd(np.broadcast_to(np.ones(1), (3,)), np.ones(3))),
        ValueError,
        "read-only",
    ),
]


@needs_two
@pytest.mark.parametrize(
    "call, error, message", [pytest.param(*case[1:], id=case[0]) for case in BAD_ON_ONE_RANK]
)
def test_bad_arguments_on_one_rank(call, error, message):
    odd = odd_rank()
    # The others learn which rank failed and why, in the same words the odd rank raised.
    text = expect_error_everywhere(
        call, {odd}, error, f"rank {odd} failed before sending: {error.__name__}", message
    )
    if hvd.rank() == odd:
        assert message in text
    still_in_step()


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: hvd.allreduce(np.ones(2, np.int64), op=hvd.Adasum), TypeError, "or op=Sum"),
        (lambda: hvd.allreduce(np.ones(2, bool)), TypeError, "use Sum (or) or Min (and)"),
        (lambda: hvd.allreduce(np.ones(2, bool), op=hvd.Sum, prescale_factor=2), TypeError,
         "cannot be scaled"),
        (lambda: hvd.reducescatter(np.ones(4), op=hvd.Adasum), NotImplementedError, "Adasum"),
        (lambda: hvd.broadcast(np.ones(2), root_rank=-1), ValueError, "root_rank -1"),
        (lambda: hvd.broadcast_object(1, root_rank=99), ValueError, "root_rank 99"),
        (lambda: hvd.alltoall(np.ones(2 * WORLD.size + 1)), ValueError, "pass splits=")
        if WORLD.size > 1 else (lambda: hvd.alltoall(np.float64(1)), ValueError, "0-d"),
        (lambda: hvd.alltoall(np.ones(2), splits=[1.5] * WORLD.size), ValueError, "integers"),
        (lambda: hvd.alltoall(np.ones(2), splits=[2] * (WORLD.size + 1)), ValueError,
         "one per rank"),
        (lambda: hvd.allreduce(np.ones(2), process_set=[0]), TypeError, "must be a ProcessSet"),
        (lambda: hvd.allreduce(np.ones(2), op=2.5), ValueError, "unknown reduce op"),
    ],
)  # fmt: skip
def test_bad_arguments_on_every_rank(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)
    still_in_step()


@pytest.mark.skipif(WORLD.size < 3, reason="needs three ranks for three values")
def test_message_lists_every_value_and_its_ranks():
    n, r = hvd.size(), hvd.rank()
    # Ranks 0 and 1 agree; each later rank sends its own shape.
    shape = (max(r, 1) + 1,)
    text = expect_error_everywhere(lambda: hvd.allreduce(np.ones(shape)), set(), None)
    groups = [("ranks 0, 1", (2,))] + [(f"rank {k}", (k + 1,)) for k in range(2, n)]
    for ranks, value in groups:
        assert f"{ranks} sent" in text and repr(value) in text, text
    assert text.endswith("in the same order, with matching arguments)")
    still_in_step()


@needs_two
def test_error_then_many_collectives_stay_in_step():
    r = hvd.rank()
    for i in range(5):
        with pytest.raises(hvd.HorovodLiteError):
            hvd.allreduce(np.ones(on_odd(i + 2, 1)), name=f"loop.{i}")
        out = hvd.broadcast(np.array([i * 10 + r]), root_rank=i % hvd.size())
        assert out.tolist() == [i * 10 + i % hvd.size()]
    still_in_step()
