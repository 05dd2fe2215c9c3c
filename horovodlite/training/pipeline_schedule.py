"""Pipeline parallelism without the framework: schedules, stage balance, layout, argument checks.

A schedule is, for one stage, the ordered list of its operations in one training step:
`Op("F", m)` runs micro-batch m forward, `Op("B", m)` runs it backward. Both schedules run the
forwards in micro-batch order and the backwards in micro-batch order, so the messages between
two stages always travel in the order the receiver expects them (MPI keeps the order of messages
with the same source and tag): no tags per micro-batch are needed.

- GPipe (Huang et al., 2019): every forward, then every backward. A stage holds the activations
  of all `chunks` micro-batches at the peak.
- 1F1B (PipeDream-Flush, Narayanan et al., 2021): stage s runs `stages - s - 1` forwards to fill
  the pipeline, then alternates one forward and one backward, then drains the backwards. The
  same bubble as GPipe, but a stage never holds more than `stages - s` micro-batches.

Both leave each stage idle for (stages - 1) of the (chunks + stages - 1) time slots of a step
when every stage takes the same time per micro-batch: `bubble_fraction()`.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "SCHEDULES",
    "Op",
    "Layout",
    "balance_by_size",
    "bubble_fraction",
    "check_balance",
    "check_batch_table",
    "check_stages",
    "gpipe",
    "layout",
    "max_in_flight",
    "one_f_one_b",
    "schedule",
    "stage_bounds",
]


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a stage: `kind` "F" (forward) or "B" (backward) of micro-batch `micro`."""

    kind: str
    micro: int


def gpipe(stages: int, chunks: int, stage: int) -> list:
    """Return GPipe's operations for `stage`: all forwards, then all backwards."""
    _check_position(stages, chunks, stage)
    return [Op("F", m) for m in range(chunks)] + [Op("B", m) for m in range(chunks)]


def one_f_one_b(stages: int, chunks: int, stage: int) -> list:
    """Return 1F1B's operations for `stage`: fill, then one forward one backward, then drain."""
    _check_position(stages, chunks, stage)
    warmup = min(stages - stage - 1, chunks)
    ops = [Op("F", m) for m in range(warmup)]
    for m in range(chunks - warmup):
        ops += [Op("F", warmup + m), Op("B", m)]
    ops += [Op("B", m) for m in range(chunks - warmup, chunks)]
    return ops


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule(name: str, stages: int, chunks: int, stage: int) -> list:
    """Return the operations of `stage` in the schedule `name` ("gpipe" or "1f1b")."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name](stages, chunks, stage)


def _check_position(stages: int, chunks: int, stage: int) -> None:
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive int, got {chunks!r}")
    if not 0 <= stage < stages:
        raise ValueError(f"stage must lie in 0..{stages - 1}, got {stage}")


def max_in_flight(ops: list) -> int:
    """Return the most micro-batches that have run forward but not yet backward, at any time."""
    held = peak = 0
    for op in ops:
        held += 1 if op.kind == "F" else -1
        peak = max(peak, held)
    return peak


def bubble_fraction(stages: int, chunks: int) -> float:
    """Return the idle fraction of a step in theory: (stages - 1) / (chunks + stages - 1)."""
    return (stages - 1) / (chunks + stages - 1)


def check_stages(stages, size: int, layers: int) -> int:
    """Return the number of stages (None: `size`); raise if it cannot split the job or model.

    Raises:
        ValueError: stages is not a positive int, does not divide `size`, or exceeds `layers`.
    """
    if stages is None:
        stages = size
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive int, got {stages!r}")
    if size % stages:
        raise ValueError(
            f"stages={stages} does not divide the {size} ranks: choose stages among "
            f"{[d for d in range(1, size + 1) if size % d == 0]} (size / stages pipeline "
            "replicas are formed)"
        )
    if layers < stages:
        raise ValueError(
            f"the model has {layers} layers, fewer than stages={stages}: every stage needs at "
            "least one layer (use fewer stages or split the model into more layers)"
        )
    return stages


def check_balance(balance, layers: int, stages: int) -> list:
    """Return `balance` as a list; raise unless it gives each of `stages` stages >= 1 layer.

    Raises:
        TypeError: balance is not a sequence of ints.
        ValueError: wrong length, a count below 1, or counts that do not add up to `layers`.
    """
    try:
        counts = list(balance)
    except TypeError:
        raise TypeError(
            f"balance must be a list of layer counts, one per stage, got {type(balance).__name__}"
        ) from None
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        raise TypeError(f"balance must hold ints (layers per stage), got {counts!r}")
    if len(counts) != stages:
        raise ValueError(f"balance needs one layer count per stage: {stages} counts, got {counts}")
    if min(counts) < 1:
        raise ValueError(f"every stage needs at least one layer, got balance={counts}")
    if sum(counts) != layers:
        raise ValueError(
            f"balance={counts} adds up to {sum(counts)} layers, but the model has {layers}"
        )
    return counts


def balance_by_size(sizes: list, stages: int) -> list:
    """Return layers per stage so that the largest stage's total of `sizes` is smallest.

    `sizes` are the layers' costs (parameter counts, say), in order; stages take contiguous runs
    of at least one layer. Ties go to the earliest split that reaches the optimum, and a layer
    without parameters counts as 1 so that runs of them spread too.
    """
    costs = [max(int(s), 1) for s in sizes]
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} stages")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: the smallest largest stage when the first i layers form k stages.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    counts, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def stage_bounds(balance: list) -> list:
    """Return (first, stop) layer indices of each stage."""
    bounds, start = [], 0
    for count in balance:
        bounds.append((start, start + count))
        start += count
    return bounds


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a rank sits: its stage and replica, and the global ranks of its two process sets."""

    stage: int
    replica: int
    pipeline_ranks: tuple  # this rank's pipeline, stage 0 first
    data_parallel_ranks: tuple  # the ranks holding this rank's stage, one per replica
    all_pipelines: tuple  # every pipeline's ranks, replica 0 first
    all_data_parallel: tuple  # every stage's data-parallel ranks, stage 0 first


def layout(rank: int, size: int, stages: int) -> Layout:
    """Return `rank`'s place when `size` ranks form size / stages pipelines of `stages` stages.

    Pipelines are runs of consecutive ranks (replica p holds ranks p*stages .. p*stages +
    stages - 1): activations cross between neighbours many times a step, and consecutive ranks
    usually share a host; the once-a-step gradient all-reduce crosses replicas.
    """
    replicas = size // stages
    pipelines = tuple(tuple(range(p * stages, (p + 1) * stages)) for p in range(replicas))
    data_parallel = tuple(tuple(range(s, size, stages)) for s in range(stages))
    stage, replica = rank % stages, rank // stages
    return Layout(stage, replica, pipelines[replica], data_parallel[stage], pipelines,
                  data_parallel)  # fmt: skip


def check_batch_table(rows: list, chunks: int) -> tuple:
    """Check what each stage of a pipeline passed to one step; return (micro-batch size, None).

    `rows[s]` is (inputs rows, targets rows) of stage s: -1 where it passed None, -2 for the
    targets of a step without targets (eval), -3 where what it passed is not a tensor or a tuple
    of tensors with equal rows. Every rank of the pipeline calls this with the same
    gathered rows, so every rank finds the same error: it returns (0, ValueError) then.
    """
    stages = len(rows)
    for stage, pair in enumerate(rows):
        for what, value in zip(("inputs", "targets"), pair):
            if value == -3:
                return 0, TypeError(
                    f"stage {stage} passed {what} that are not a tensor or a tuple of tensors "
                    "with the same number of rows"
                )
    if rows[0][0] < 0:
        return 0, ValueError("the first stage must pass the inputs (got None)")
    if rows[-1][1] == -1:
        return 0, ValueError("the last stage must pass the targets to train_step (got None)")
    batch = rows[0][0]
    for stage, pair in enumerate(rows):
        for what, value in zip(("inputs", "targets"), pair):
            if value >= 0 and value != batch:
                return 0, ValueError(
                    f"stage {stage} passed {what} of {value} rows, but stage 0 passed inputs of "
                    f"{batch} rows: every rank of a pipeline must pass the same batch"
                    + (" (or None)" if stages > 1 else "")
                )
    if batch == 0 or batch % chunks:
        return 0, ValueError(
            f"a batch of {batch} rows does not split into chunks={chunks} equal micro-batches: "
            f"use a batch size divisible by {chunks}"
        )
    return batch // chunks, None
