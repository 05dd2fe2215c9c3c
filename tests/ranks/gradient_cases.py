"""Gradients of collectives inside a model, against one process: the cases, shared by bindings.

Every rank r of a case holds inputs x_r (one per tensor of the collective) and upstream weights
c_r; its loss is sum(c_r * y_r), y_r being the collective's output on rank r. The job's loss is
the sum of the ranks' losses. The expected gradient of rank r's inputs is what autograd gives
in one process that holds every rank's data and computes every rank's output from them with
the framework's own ops (concatenation, stacking, sums, amax, ...), never with horovodlite. A
binding's test (rank_gradients_torch.py, rank_gradients_tensorflow.py) supplies those ops
(`Ops`), makes the tensors, and takes the gradients.
"""

import dataclasses
from typing import Callable, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import horovodlite as hvd

__all__ = [
    "Case",
    "Ops",
    "CASES",
    "cases",
    "fit",
    "inputs",
    "upstream",
    "outputs",
    "output_shapes",
    "run_collective",
    "EvenRanks",
    "random_cases_test",
]

REDUCTIONS = ("allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter")
COLLECTIVES = (*REDUCTIONS, "allgather", "grouped_allgather", "broadcast", "alltoall")
OPS = ("SUM", "AVERAGE", "MIN", "MAX", "PRODUCT")


@dataclasses.dataclass(frozen=True)
class Case:
    """One collective on a process set, with every rank's input shapes.

    `rows[k][i]` is dimension 0 of tensor k on the set's i-th rank; `trailing[k]` its other
    dimensions. For alltoall `splits[i][j]` rows go from the i-th rank to the j-th.
    """

    collective: str
    rows: tuple
    trailing: tuple
    op: str = "SUM"
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = 0  # the set's position of the broadcast's root
    splits: Optional[tuple] = None
    subset: bool = False  # on the process set of the even ranks, not the global one
    seed: int = 0

    def members(self, size: int) -> list:
        return list(range(0, size, 2)) if self.subset else list(range(size))


@dataclasses.dataclass(frozen=True)
class Ops:
    """The framework's ops that the one-process reference computes with."""

    concat: Callable  # along dimension 0
    stack: Callable  # along a new dimension 0
    reduce: dict  # op name -> the reduction of a stack along dimension 0


def inputs(case: Case, position: int) -> list:
    """Return the float64 inputs of the set's `position`-th rank, one per tensor."""
    rng = np.random.default_rng([case.seed, position])
    out = []
    for rows, trailing in zip(case.rows, case.trailing):
        shape = (rows[position], *trailing)
        if case.op in ("MIN", "MAX", "PRODUCT") and case.collective in REDUCTIONS:
            # Few distinct values: ties between ranks, and zeros in products.
            out.append(rng.integers(-1, 3, size=shape).astype(np.float64))
        else:
            out.append(rng.normal(size=shape))
    return out


def upstream(case: Case, position: int, shapes: list) -> list:
    """Return the weights c of the `position`-th rank's outputs, of the given shapes."""
    rng = np.random.default_rng([case.seed, position, 1])
    return [rng.normal(size=shape) for shape in shapes]


def _reducescatter_rows(rows: int, n: int) -> list:
    """Return each rank's rows of a reduce-scatter, as Horovod splits them."""
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    starts = np.cumsum([0, *counts])
    return [(int(starts[i]), int(starts[i + 1])) for i in range(n)]


def outputs(case: Case, xs: list, ops: Ops) -> list:
    """Return every rank's outputs from every rank's inputs `xs[i][k]`: `out[i][k]`."""
    n = len(xs)
    tensors = range(len(case.rows))
    kind = case.collective.removeprefix("grouped_")
    if kind in ("allreduce", "reducescatter"):
        full = []
        for k in tensors:
            reduced = ops.reduce[case.op](ops.stack([x[k] * case.prescale for x in xs]))
            if case.op == "AVERAGE":
                reduced = reduced / n
            full.append(reduced * case.postscale)
        if kind == "allreduce":
            return [list(full) for _ in range(n)]
        bounds = [_reducescatter_rows(case.rows[k][0], n) for k in tensors]
        return [[full[k][slice(*bounds[k][i])] for k in tensors] for i in range(n)]
    if kind == "allgather":
        return [[ops.concat([x[k] for x in xs]) for k in tensors] for _ in range(n)]
    if kind == "broadcast":
        return [list(xs[case.root]) for _ in range(n)]
    if kind == "alltoall":
        starts = [np.cumsum([0, *case.splits[i]]) for i in range(n)]
        return [
            [ops.concat([xs[i][0][starts[i][j] : starts[i][j + 1]] for i in range(n)])]
            for j in range(n)
        ]
    raise ValueError(f"unknown collective {case.collective}")


NUMPY = Ops(
    concat=lambda arrays: np.concatenate(arrays, 0),
    stack=lambda arrays: np.stack(arrays, 0),
    reduce={
        "SUM": lambda s: s.sum(0),
        "AVERAGE": lambda s: s.sum(0),
        "MIN": lambda s: s.min(0),
        "MAX": lambda s: s.max(0),
        "PRODUCT": lambda s: s.prod(0),
    },
)


def output_shapes(case: Case, n: int) -> list:
    """Return the shapes of every rank's outputs, `shapes[i][k]`, for a set of `n` ranks."""
    everyone = [inputs(case, i) for i in range(n)]
    return [[y.shape for y in ys] for ys in outputs(case, everyone, NUMPY)]


# Hand-picked cases: every collective, op and scale, uneven rows, a rank with no rows, ties.
CASES = [
    *(
        Case("allreduce", ((3,) * 4,), ((2,),), op=op, prescale=0.5, postscale=3.0, seed=i)
        for i, op in enumerate(OPS)
    ),
    Case("allreduce", ((2,) * 4,), ((3,),), op="AVERAGE", subset=True, seed=7),
    Case("grouped_allreduce", ((2,) * 4, (3,) * 4), ((2,), ()), op="AVERAGE", prescale=2.0),
    Case("grouped_allreduce", ((2,) * 4, (1,) * 4), ((2,), (3,)), op="MAX", postscale=-1.0),
    Case("allgather", ((1, 3, 0, 2),), ((2,),), seed=1),
    Case("allgather", ((2, 1, 3, 1),), ((),), subset=True, seed=2),
    Case("grouped_allgather", ((1, 2, 0, 1), (0, 1, 1, 2)), ((2,), (3, 1)), seed=3),
    Case("broadcast", ((3,) * 4,), ((2,),), root=0, seed=4),
    Case("broadcast", ((2,) * 4,), ((),), root=1, seed=5),
    Case("broadcast", ((2,) * 4,), ((1,),), root=1, subset=True, seed=6),
    *(
        Case("reducescatter", ((5,) * 4,), ((2,),), op=op, prescale=0.5, postscale=3.0, seed=i)
        for i, op in enumerate(OPS)
    ),
    Case("reducescatter", ((3,) * 4,), ((2,),), op="SUM", subset=True, seed=8),
    Case("grouped_reducescatter", ((5,) * 4, (2,) * 4), ((2,), ()), op="AVERAGE", seed=9),
    Case("alltoall", ((3, 2, 4, 0),), ((2,),), splits=((1, 0, 2, 0), (0, 2, 0, 0),
         (1, 1, 1, 1), (0, 0, 0, 0)), seed=10),  # fmt: skip
]


def fit(case: Case, size: int) -> Optional[Case]:
    """Return `case` cut to the first ranks of a job of `size`, or None where it needs more."""
    n = len(case.members(size))
    if case.collective == "broadcast" and case.root >= n:
        return None
    rows = tuple(r[:n] for r in case.rows)
    splits = None
    if case.splits is not None:
        splits = tuple(tuple(s[:n]) for s in case.splits[:n])
        rows = (tuple(sum(s) for s in splits),)
    return dataclasses.replace(case, rows=rows, splits=splits)


@st.composite
def cases(draw) -> Case:
    """Draw a case for a job of hvd.size() ranks: collective, op, scales, shapes, splits, set."""
    size = hvd.size()
    subset = size > 1 and draw(st.booleans())
    n = len(range(0, size, 2)) if subset else size
    collective = draw(st.sampled_from(COLLECTIVES))
    count = 2 if collective.startswith("grouped_") else 1
    trailing = tuple(
        tuple(draw(st.lists(st.integers(0, 3), max_size=2))) for _ in range(count)
    )
    op, prescale, postscale = "SUM", 1.0, 1.0
    if collective in REDUCTIONS:
        op = draw(st.sampled_from(OPS))
        prescale = draw(st.sampled_from([1.0, 0.5, -2.0]))
        postscale = draw(st.sampled_from([1.0, 3.0, 0.25]))
    splits = None
    if collective == "alltoall":
        splits = tuple(tuple(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
                       for _ in range(n))  # fmt: skip
        rows = (tuple(sum(s) for s in splits),)
    elif collective in ("allgather", "grouped_allgather"):
        rows = tuple(tuple(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
                     for _ in range(count))  # fmt: skip
    else:
        rows = tuple((draw(st.integers(0 if "reducescatter" in collective else 1, 7)),) * n
                     for _ in range(count))  # fmt: skip
    return Case(
        collective,
        rows,
        trailing,
        op=op,
        prescale=prescale,
        postscale=postscale,
        root=draw(st.integers(0, n - 1)),
        splits=splits,
        subset=subset,
        seed=draw(st.integers(0, 2**16)),
    )


def run_collective(hvd, case: Case, xs: list, process_set) -> list:
    """Run the case's collective through the binding `hvd` on this rank's tensors `xs`; return
    its outputs. (The bindings share Horovod's signatures for these.)"""
    kind, members = case.collective, case.members(hvd.size())
    scale = {"prescale_factor": case.prescale, "postscale_factor": case.postscale}
    op = hvd.ReduceOp[case.op]
    if kind == "allreduce":
        return [hvd.allreduce(xs[0], op=op, process_set=process_set, **scale)]
    if kind == "grouped_allreduce":
        return hvd.grouped_allreduce(xs, op=op, process_set=process_set, **scale)
    if kind == "reducescatter":
        return [hvd.reducescatter(xs[0], op=op, process_set=process_set, **scale)]
    if kind == "grouped_reducescatter":
        return hvd.grouped_reducescatter(xs, op=op, process_set=process_set, **scale)
    if kind == "allgather":
        return [hvd.allgather(xs[0], process_set=process_set)]
    if kind == "grouped_allgather":
        return hvd.grouped_allgather(xs, process_set=process_set)
    if kind == "broadcast":
        return [hvd.broadcast(xs[0], members[case.root], process_set=process_set)]
    me = members.index(hvd.rank())
    return [hvd.alltoall(xs[0], list(case.splits[me]), process_set=process_set)[0]]


class EvenRanks:
    """The process set of the even ranks, registered for a module's cases with `subset`."""

    def __init__(self, hvd):
        self.hvd, self.process_set = hvd, None

    def __enter__(self):
        if self.hvd.size() > 1:
            self.process_set = self.hvd.add_process_set(list(range(0, self.hvd.size(), 2)))
        return self

    def __exit__(self, *exc):
        if self.process_set is not None:
            self.hvd.remove_process_set(self.process_set)

    def module_fixture(self):
        """Return a module-scoped autouse fixture that registers the set for the module's tests
        (assign it to a module-level name for pytest to find)."""

        @pytest.fixture(scope="module", autouse=True)
        def even_ranks():
            with self:
                yield

        return even_ranks

    def of(self, case: Case):
        """Return the process set `case` runs on."""
        if not case.subset or self.process_set is None:
            return self.hvd.global_process_set
        return self.process_set


def random_cases_test(run_case: Callable, tolerance: float, max_examples: int) -> Callable:
    """Return a test of the hypothesis property: `run_case(case)` (every rank's largest
    difference from one process) stays within `tolerance` for drawn cases.

    Rank 0 runs hypothesis and broadcasts each drawn case; the other ranks run the cases it
    sends until it sends None, so every rank runs the same examples, shrinking included.
    """

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases())
    def check(case):
        hvd.broadcast_object(case, root_rank=0, name="gradients.case")
        errors = run_case(case)
        assert max(errors) <= tolerance, f"{case}: differences by rank {errors}"

    def test():
        if hvd.rank() == 0:
            try:
                check()
            finally:
                hvd.broadcast_object(None, root_rank=0, name="gradients.case")
            return
        while True:
            case = hvd.broadcast_object(None, root_rank=0, name="gradients.case")
            if case is None:
                break
            run_case(case)

    return test
