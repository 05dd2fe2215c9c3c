"""The torch binding's out-of-place all-reduce of a CPU tensor at one rank over Gloo (stop 56):
horovodlite's own Python, warm, with no transfer (one rank moves nothing). Best of 5 blocks of
20000 calls, at 1 KiB and 64 KiB.

    python one_rank.py                       # this tree
    PYTHONPATH=/tmp/old python one_rank.py   # another (run from outside the repository)
"""

import os
import timeit

os.environ["HOROVODLITE_TRANSPORT"] = "gloo"

import horovodlite.torch as hvd  # noqa: E402
import torch  # noqa: E402

import horovodlite  # noqa: E402


def main() -> None:
    hvd.init()
    where = os.path.dirname(os.path.dirname(horovodlite.__file__))
    for count in (256, 16384):
        tensor = torch.ones(count)
        for _ in range(1000):
            hvd.allreduce(tensor, op=hvd.Sum)
        call = lambda t=tensor: hvd.allreduce(t, op=hvd.Sum)  # noqa: E731
        blocks = timeit.repeat(call, number=20000, repeat=5)
        print(f"ONE_RANK {where} {count * 4} bytes: {min(blocks) / 20000 * 1e6:.2f} µs a call")


if __name__ == "__main__":
    main()
