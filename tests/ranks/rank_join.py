"""join() beside synchronous collectives: a joined rank answers them, and nothing hangs.

Run on every rank at once (tests/test_ranks.py); rank 0 runs out of data first.
"""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from oracle import assert_reduced, rank_values, reduce_expected, still_in_step

import horovodlite as hvd

hvd.init()

NOT_SUPPORTED = "rank 0 has joined: {} is not supported with join"


def test_sync_collectives_beside_a_joined_rank():
    n, me = hvd.size(), hvd.rank()
    if me == 0:
        last = hvd.join()
    else:
        # Rank 0 contributes zeros to every all-reduce, inline, short, general and ring sized.
        for shape, algorithm in [((3,), None), ((300,), None), ((2, 5), "ring"), ((70000,), None)]:
            x = rank_values(shape, np.float64, me, seed=3)
            everyone = [rank_values(shape, np.float64, k, 3) if k else np.zeros(shape)
                        for k in range(n)]  # fmt: skip
            out = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{shape}", algorithm=algorithm)
            assert_reduced(out, reduce_expected(everyone, hvd.Sum))
            avg = hvd.allreduce(x, name=f"avg.{shape}")  # Average still divides by every rank
            np.testing.assert_allclose(avg, reduce_expected(everyone, hvd.Sum) / n)
        y = np.full(4, float(me))
        assert hvd.allreduce_(y, op=hvd.Sum, name="inplace") is y
        np.testing.assert_array_equal(y, np.full(4, n * (n - 1) / 2))
        group = hvd.grouped_allreduce([np.ones(2), np.ones(3, np.int32)], op=hvd.Sum)
        assert group[0].tolist() == [n - 1] * 2 and group[1].tolist() == [n - 1] * 3
        hvd.barrier()  # the joined rank arrives
        # Collectives that need the joined rank's data raise on the ranks that called them.
        for kind, call in [
            ("allgather", lambda: hvd.allgather(np.ones(2))),
            ("broadcast", lambda: hvd.broadcast(np.ones(2), root_rank=1)),
            ("alltoall", lambda: hvd.alltoall(np.ones(n))),
            ("reducescatter", lambda: hvd.reducescatter(np.ones(n))),
            ("broadcast_object", lambda: hvd.broadcast_object("x", root_rank=1)),
        ]:
            with pytest.raises(hvd.HorovodLiteError, match=NOT_SUPPORTED.format(kind)):
                call()
        # The asynchronous ones too, through the engine.
        handle = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="async.sum")
        np.testing.assert_array_equal(hvd.synchronize(handle), np.full(2, n - 1.0))
        last = hvd.join()
    # The same rank everywhere; with more than one rank, one that joined after rank 0.
    assert hvd.allgather_object(last) == [last] * n
    assert last == 0 if n == 1 else last > 0
    still_in_step()


def test_unnamed_requests_stay_in_step_after_a_join():
    # The others' unnamed requests take automatic names ("allreduce.noname.N") that rank 0
    # never took while it was joined; it counts those it answered, so after the join every
    # rank's next unnamed request has the same name.
    n, me = hvd.size(), hvd.rank()
    if me == 0:
        hvd.join()
    else:
        handles = [hvd.allreduce_async(np.full(2, float(me)), op=hvd.Sum) for _ in range(3)]
        for handle in handles:
            np.testing.assert_array_equal(hvd.synchronize(handle), np.full(2, n * (n - 1) / 2))
        hvd.join()
    handle = hvd.allreduce_async(np.full(2, float(me)), op=hvd.Sum)
    np.testing.assert_array_equal(hvd.synchronize(handle), np.full(2, n * (n - 1) / 2))
    still_in_step()


def test_a_mismatch_among_active_ranks_is_still_a_mismatch():
    n, me = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs two active ranks beside the joined one")
    if me == 0:
        hvd.join()
    else:
        with pytest.raises(hvd.MismatchError, match="shape"):
            hvd.allreduce(np.ones(3 if me == 1 else 4), name="w")
        hvd.join()
    still_in_step()


def test_join_beside_process_sets():
    n, me = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs two ranks")
    pair = hvd.add_process_set([0, 1])
    try:
        if me == 0:
            hvd.join()
        else:
            if me == 1:  # rank 0 answers on the process set as well
                out = hvd.allreduce(np.full(3, 5.0), op=hvd.Sum, process_set=pair, name="pair")
                np.testing.assert_array_equal(out, np.full(3, 5.0))
            hvd.join()
    finally:
        hvd.remove_process_set(pair)
    still_in_step()


def test_every_rank_joins_at_once():
    last = hvd.join()
    assert hvd.allgather_object(last) == [last] * hvd.size()
    still_in_step()


# ---------------------------------------------------------------------------------------------
# Which rank join() returns: the last to join, by the order every rank agrees on.


def _spin(stop: threading.Event) -> None:
    """Busy Python: contends with the engine thread for the GIL and for the cores."""
    while not stop.is_set():
        sum(range(1000))


@pytest.mark.parametrize("load", ["quiet", "busy_thread", "busy_process", "sleepy"])
@pytest.mark.parametrize("seen_by", ["allreduce", "broadcast"])
def test_join_returns_the_rank_that_joined_last_in_every_round(seen_by, load):
    # Each round the ranks join one after another, in an order that rotates: rank order[k]
    # joins only after a collective showed it that order[k - 1] had joined (an all-reduce that
    # got its zeros, or a broadcast that raised because it had joined). The first sleeps before
    # it joins, so the others already wait in that collective and join the moment it ends: the
    # timing in which join() used to return the rank that joined first (issue #37).
    n, me = hvd.size(), hvd.rank()
    stop = threading.Event()
    busy = threading.Thread(target=_spin, args=(stop,), daemon=True)
    if load == "busy_thread":
        busy.start()
    spinner = None
    if load == "busy_process" and me == 0:  # takes a core from the ranks, not the GIL
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rng = np.random.default_rng([11, me])
    try:
        for round_ in range(10):
            order = [(round_ + k) % n for k in range(n)]
            place = order.index(me)
            if place == 0:
                time.sleep(rng.uniform(0.01, 0.1) if load == "sleepy" else 0.05)
            for k in range(place):  # see order[k] join, then go on
                name = f"order.{seen_by}.{load}.{round_}.{k}"
                x, active = np.full(3, float(me + 1)), order[k + 1 :]
                if seen_by == "allreduce":
                    out = hvd.allreduce(x, op=hvd.Sum, name=name)
                    np.testing.assert_array_equal(out, np.full(3, sum(r + 1 for r in active)))
                else:
                    with pytest.raises(hvd.HorovodLiteError, match="joined: broadcast"):
                        hvd.broadcast(x, root_rank=active[-1], name=name)
            last = hvd.join()
            assert last == order[-1], f"round {round_}: join() returned {last}, order {order}"
    finally:
        stop.set()
        if busy.is_alive():
            busy.join()
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    assert hvd.allgather_object(last) == [order[-1]] * n
    still_in_step()
