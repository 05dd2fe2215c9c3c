"""Point-to-point channels (horovodlite.training.point_to_point) on every rank.

Every dtype travels as raw bytes, around a ring of the ranks, against the values the sender
made; messages with one source and tag arrive in order; a channel on a process set numbers its
members as the set does; the control collectives fill what every member reads alike; and a
bad buffer raises on its own rank before anything is sent. (A peer that exits while another
waits: tests/test_point_to_point_jobs.py.)
"""

import numpy as np
import pytest
from oracle import DTYPES, WORLD, dtype_id, rank_values, still_in_step

import horovodlite as hvd
from horovodlite.training.point_to_point import Channel


@pytest.fixture(scope="module")
def channel():
    channel = Channel()
    yield channel
    channel.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(5, 3), (0,), ()], ids=["matrix", "empty", "scalar"])
def test_every_dtype_goes_around_a_ring(channel, dtype, shape):
    n, r = channel.size, channel.rank
    left, right = (r - 1) % n, (r + 1) % n
    mine = rank_values(shape, dtype, r)
    out = np.empty(shape, dtype)
    receive = channel.irecv(out, left, tag=7)
    send = channel.isend(mine, right, tag=7)
    channel.wait([receive, send])
    assert receive.test() and send.test()
    np.testing.assert_array_equal(out, rank_values(shape, dtype, left))
    assert out.dtype == np.dtype(dtype)


def test_messages_of_one_source_and_tag_arrive_in_order(channel):
    n, r = channel.size, channel.rank
    left, right = (r - 1) % n, (r + 1) % n
    sends = [channel.isend(np.full(4, 10 * r + i, np.int32), right, tag=3) for i in range(5)]
    received = [channel.recv(np.empty(4, np.int32), left, tag=3) for _ in range(5)]
    for transfer in sends:
        transfer.wait("a send")
    assert [int(a[0]) for a in received] == [10 * left + i for i in range(5)]


def test_bytes_and_bytearrays_travel(channel):
    n, r = channel.size, channel.rank
    left, right = (r - 1) % n, (r + 1) % n
    text = f"from rank {r}".encode()
    send = channel.isend(text, right, tag=4)
    out = bytearray(64)  # larger than the message: a receive takes up to its size
    channel.recv(out, left, tag=4, what="a greeting")
    send.wait()
    assert bytes(out).rstrip(b"\0") == f"from rank {left}".encode()


def test_blocking_send_to_self(channel):
    r = channel.rank
    out = np.empty(3)
    receive = channel.irecv(out, r, tag=9)
    channel.send(np.arange(3.0) + r, r, tag=9)
    receive.wait()
    np.testing.assert_array_equal(out, np.arange(3.0) + r)


def test_control_collectives_fill_every_members_copy(channel):
    n, r = channel.size, channel.rank
    table = np.empty((n, 2), np.int64)
    channel.iallgather(np.array([r, r * r], np.int64), table).wait()
    assert table.tolist() == [[k, k * k] for k in range(n)]
    value = np.array([3.5 if r == n - 1 else 0.0])
    channel.ibcast(value, root=n - 1).wait()
    assert value[0] == 3.5


@pytest.mark.skipif(WORLD.size < 3, reason="needs 3 ranks")
def test_a_channel_on_a_process_set_numbers_its_members_as_the_set():
    members = [WORLD.size - 1, 0]  # the set sorts them: [0, size - 1]
    process_set = hvd.add_process_set(members)
    try:
        if not process_set.included():
            with pytest.raises(ValueError, match="not in process set"):
                Channel(process_set)
            return
        channel = Channel(process_set)
        assert channel.ranks == [0, WORLD.size - 1] and channel.size == 2
        assert channel.rank == process_set.rank()
        other = 1 - channel.rank
        out = np.empty(1, np.int64)
        receive = channel.irecv(out, other)
        channel.send(np.array([hvd.rank()], np.int64), other)
        receive.wait()
        assert out[0] == channel.ranks[other]
        assert f"rank {channel.ranks[other]}" in receive.what
        channel.close()
    finally:
        hvd.remove_process_set(process_set)


def test_a_bad_buffer_raises_on_its_rank_before_any_message(channel):
    r = channel.rank
    with pytest.raises(TypeError, match="host buffer"):
        channel.isend([1, 2, 3], r)
    with pytest.raises(ValueError, match="contiguous"):
        channel.isend(np.zeros((4, 4))[:, 1], r)
    read_only = np.zeros(3)
    read_only.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        channel.irecv(read_only, r)
    with pytest.raises(TypeError, match="writable"):
        channel.irecv(b"abc", r)
    still_in_step()


def test_a_channel_knows_its_init_and_the_timeout(channel):
    assert channel.current
    assert channel.timeout > 0
