"""The parameter servers' framework-free rules: the shard layout, the consistency clocks and the
checkpoints' files and resume choice."""

import numpy as np
import pytest

from horovodlite.training.ps.checkpoint import ServerCheckpoints, checkpoint_root, choose_resume
from horovodlite.training.ps.clocks import Clocks
from horovodlite.training.ps.layout import Piece, owner_of_rows, plan_shards
from horovodlite.training.ps.startup import check_same_parameters, check_settings, roles


def test_big_tensors_are_split_by_rows_and_small_ones_packed_whole():
    shapes = [(300, 300), (300,), (10, 4), (7,), ()]
    shards = plan_shards(shapes, [False] * 5, servers=2, split_elements=1000)
    assert [p for p in shards[0] if p.index == 0] == [Piece(0, 0, 150, False)]
    assert [p for p in shards[1] if p.index == 0] == [Piece(0, 150, 300, False)]
    whole = sorted(p.index for shard in shards for p in shard if p.index > 0)
    assert whole == [1, 2, 3, 4]  # each small tensor on exactly one server
    load = [sum(np.prod(shapes[p.index][1:], dtype=int) * (p.stop - p.start) for p in s)
            for s in shards]  # fmt: skip
    assert abs(load[0] - load[1]) <= 300  # packed by size: within the largest small tensor


def test_embeddings_are_split_by_rows_over_every_server_even_when_small():
    shards = plan_shards([(5, 2), (3, 3)], [True, False], servers=3)
    assert [s[0] for s in shards] == [Piece(0, 0, 1, True), Piece(0, 1, 3, True),
                                      Piece(0, 3, 5, True)]  # fmt: skip
    assert owner_of_rows([0, 1, 3, 5], np.array([4, 0, 2, 1])).tolist() == [2, 0, 1, 1]


def test_one_server_holds_everything_whole():
    shards = plan_shards([(100000, 2), (3,)], [False, False], servers=1)
    assert shards == [[Piece(0, 0, 100000, False), Piece(1, 0, 3, False)]]


def test_bounded_staleness_holds_a_worker_at_most_s_steps_ahead():
    clocks = Clocks([0, 1], staleness=1)
    clocks.join(0), clocks.join(1)
    clocks.pushed(0)
    assert clocks.may_answer(0)  # 1 ahead
    clocks.pushed(0)
    assert not clocks.may_answer(0)  # 2 ahead of worker 1
    clocks.died(1)
    assert clocks.may_answer(0)  # the dead do not hold anyone back


def test_synchronous_waits_for_every_worker_and_asynchronous_for_none():
    sync = Clocks([0, 1], staleness=0)
    sync.pushed(0)
    assert not sync.step_complete(0) and not sync.may_answer(0) and sync.may_answer(1)
    sync.pushed(1)
    assert sync.step_complete(0) and sync.may_answer(0)
    free = Clocks([0, 1], staleness=None)
    for _ in range(5):
        free.pushed(0)
    assert free.may_answer(0)


def test_a_late_worker_joins_at_the_slowest_clock():
    clocks = Clocks([0, 1, 2], staleness=1)
    clocks.join(0), clocks.join(1)
    for _ in range(4):
        clocks.pushed(0), clocks.pushed(1)
    assert clocks.may_answer(0)  # worker 2 has not pulled: not waited for
    clocks.join(2)
    assert clocks.clock[2] == 4 and clocks.may_answer(2)


def test_settings_and_roles():
    assert roles(4, 2) == ([2, 3], [0, 1])
    with pytest.raises(ValueError, match="leaves 0 workers"):
        check_settings(3, 3, None)
    with pytest.raises(TypeError, match="servers must be an int"):
        check_settings(3, 1.0, None)
    with pytest.raises(ValueError, match="staleness"):
        check_settings(3, 1, -2)
    with pytest.raises(ValueError, match=r"'w' differs between ranks at start \(ranks \[2\]"):
        check_same_parameters([["a", "b"], ["a", "b"], ["a", "c"]], ["v", "w"])


def test_checkpoints_are_written_whole_kept_two_deep_and_refused_for_another_layout(tmp_path):
    layout = (2, [(0, 0, 5, False)])
    files = ServerCheckpoints(str(tmp_path), 1, every=4, layout=layout)
    assert files.due(8) and not files.due(6)
    for version in (4, 8, 12):
        files.write(version, {0: version, 1: version - 1}, b"state %d" % version)
    assert files.intact() == {12: {0: 12, 1: 11}, 8: {0: 8, 1: 7}}  # the last two
    assert files.read(8)["state"] == b"state 8"
    path = files.store.path(12)
    with open(path, "r+b") as f:  # cut short, as by a crash mid-write on a careless disk
        f.truncate(20)
    assert list(files.intact()) == [8]
    files.drop_newer(8)
    assert files.store.numbers() == [8]
    other = ServerCheckpoints(str(tmp_path), 1, every=4, layout=(3, [(0, 0, 5, False)]))
    with pytest.raises(ValueError, match="another model or server count"):
        other.intact()


def test_the_job_resumes_from_the_newest_checkpoint_every_server_holds():
    assert choose_resume([{8: {0: 8}, 4: {0: 4}}, {12: {0: 12}, 8: {0: 8}}]) == (8, {0: 8})
    assert choose_resume([{8: {0: 8}}, {}]) == (None, {})  # a server without one: afresh
    assert choose_resume([{8: {0: 8}}, {12: {0: 12}}]) == (None, {})
    assert choose_resume([]) == (None, {})


def test_the_checkpoint_folder_is_given_or_the_elastic_jobs():
    assert checkpoint_root(None, None, "/e", None) is None
    assert checkpoint_root(5, "/mine", "/e", "job") == "/mine"
    assert checkpoint_root(5, None, "/e", "job") == "/e/job"
    with pytest.raises(ValueError, match="pass checkpoint_dir=, or run under horovodlite-run"):
        checkpoint_root(5, None, "/e", None)
    with pytest.raises(ValueError, match="at least 1"):
        checkpoint_root(0, "/mine", "/e", None)
    with pytest.raises(TypeError, match="checkpoint_every must be None or an int"):
        checkpoint_root(2.5, "/mine", "/e", None)


def test_resumed_clocks_start_at_each_workers_steps_or_all_at_the_version_when_synchronous():
    free = Clocks([0, 1], staleness=2)
    free.resume({0: 7, 1: 5}, 12)
    assert free.clock == {0: 7, 1: 5}
    sync = Clocks([0, 1], staleness=0)
    sync.resume({0: 6, 1: 4}, 6)  # worker 1 died after 4 steps; synchronous steps are shared
    assert sync.clock == {0: 6, 1: 6} and not sync.step_complete(6)
