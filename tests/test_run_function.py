"""horovodlite.run(fn, args, np=...), Horovod's horovod.run: results in rank order, errors raised.

Each case runs a small script in a subprocess under a timeout, as a user's script would call it.
"""

import subprocess
import sys
import textwrap

import pytest

import horovodlite

SCRIPT = textwrap.dedent(
    """
    import sys
    import horovodlite

    def train(scale, offset=0):
        import numpy as np
        import horovodlite as hvd
        hvd.init()
        total = hvd.allreduce(np.array([scale * hvd.rank()]), op=hvd.Sum)[0]
        return hvd.rank(), hvd.size(), float(total) + offset

    def fails_on_last_rank():
        import horovodlite as hvd
        hvd.init()
        if hvd.rank() == hvd.size() - 1:
            raise ZeroDivisionError("rank failed on purpose")
        return hvd.rank()

    if __name__ == "__main__":
        np = int(sys.argv[1])
        print(horovodlite.run(train, args=(2.0,), kwargs={"offset": 1}, np=np))
        try:
            horovodlite.run(fails_on_last_rank, np=np)
        except horovodlite.HorovodLiteError as exc:
            print("raised:", exc)
    """
)


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 3])
def test_results_in_rank_order_and_a_failing_rank_raises(np, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(np)], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    total = 2.0 * np * (np - 1) / 2 + 1
    lines = result.stdout.splitlines()
    assert lines[0] == str([(r, np, total) for r in range(np)])
    assert lines[1].startswith("raised: horovodlite.run: the job exited with status")
    assert "rank failed on purpose" in result.stderr


def test_module_is_both_the_launcher_and_the_function():
    import horovodlite.run

    assert callable(horovodlite.run) and callable(horovodlite.run.main)
    version = subprocess.run(
        [sys.executable, "-m", "horovodlite.run", "--version"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert version.stdout.strip() == f"horovodlite {horovodlite.__version__}"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"use_gloo": True}, "horovodlite runs on MPI only"),
        ({"min_np": 2}, "min_np= is given, but elastic runs are not supported"),
        ({"ssh_port": 22}, "ssh_port= is given, but it is not supported"),
    ],
)
def test_unsupported_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        horovodlite.run(print, np=2, **kwargs)
