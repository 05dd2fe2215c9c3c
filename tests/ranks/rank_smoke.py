import numpy as np

import horovodlite as hvd


def test_allreduce_sum_matches_formula():
    n = hvd.size()
    out = hvd.allreduce(np.full(5, hvd.rank(), dtype=np.float64), op=hvd.Sum)
    np.testing.assert_array_equal(out, np.full(5, n * (n - 1) / 2))
