"""A point-to-point wait never hangs: a peer that leaves, or never sends, ends it with an error
that names the peer (tests/jobs/point_to_point_peer.py, each case its own MPI job)."""

import re

import pytest
from test_engine_jobs import job
from test_exit_jobs import BOUND

pytestmark = pytest.mark.mpi


def _survivors_raised(out: str, survivors: list, pattern: str) -> None:
    for rank in survivors:
        found = re.search(rf"rank {rank} raised after ([0-9.]+) s: (.*)", out)
        assert found and float(found.group(1)) < BOUND, out
        assert re.search(pattern, found.group(2)), out
        assert re.search(r"a message from rank 1 \(tag 5\)", found.group(2)), out
    assert "was not stopped" not in out and "was not torn down" not in out, out


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("how, left", [("exit0", "exited"), ("shutdown", "called hvd.shutdown")])
def test_a_peer_that_leaves_ends_the_wait_naming_it(np, how, left):
    result = job(np, "point_to_point_peer.py", how, module_runner=False)
    assert result.returncode != 0, result.stdout
    _survivors_raised(result.stdout, [r for r in range(np) if r != 1], f"rank 1 {left}")


def test_a_peer_that_never_sends_times_out_and_tears_the_job_down():
    result = job(3, "point_to_point_peer.py", "stuck", env={"HOROVODLITE_COLLECTIVE_TIMEOUT": "2"})
    assert result.returncode != 0, result.stdout
    _survivors_raised(result.stdout, [0, 2], "timed out after 2 s .*HOROVODLITE_COLLECTIVE_TIMEOUT")
