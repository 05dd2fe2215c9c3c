"""Results as text tables, CSV and JSON.

A result set is a list of runs; each run is one setting (a rank count on shared memory, or a
simulated cluster) with its `facts` and measured `rows` (see sweep.py).
"""

import csv
import json
import math

from .method import format_size

__all__ = [
    "CSV_COLUMNS",
    "RATIOS",
    "crossover",
    "format_expectations",
    "format_tables",
    "read_json",
    "write_csv",
    "write_json",
]

CSV_COLUMNS = [
    "setting",
    "hosts",
    "ranks",
    "link_rate_Gbps",
    "metadata_check",
    "collective",
    "contender",
    "transport",
    "bytes",
    "count",
    "iterations",
    "warmup",
    "repeats",
    "time_us",
    "time_us_min",
    "time_us_max",
    "algbw_GBps",
    "busbw_GBps",
    "correct",
]

# Ratios of median times shown beside the tables when both contenders ran: what the targets in
# docs/benchmarks.md are stated in.
RATIOS = [
    ("auto", "mpi-native"),
    ("auto-nocheck", "mpi-native"),
    ("ring", "mpi-native"),
    ("ring", "gloo"),
    ("naive", "ring"),
    ("horovodlite", "torch-nccl"),  # --device cuda
    ("horovodlite-mpi", "torch-nccl"),
]


def _flat_rows(runs: list):
    for run in runs:
        facts = run["facts"]
        rate = facts.get("link_rate_bits")
        for row in run["rows"]:
            yield {
                "setting": run["setting"],
                "hosts": facts.get("hosts"),
                "ranks": facts.get("ranks"),
                "link_rate_Gbps": rate / 1e9 if rate else "",
                "metadata_check": "off" if row["contender"] == "auto-nocheck" else "on",
                **row,
            }


def write_csv(runs: list, path: str) -> None:
    """Write one CSV line per measurement, with the setting's columns."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in _flat_rows(runs):
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})


def write_json(runs: list, path: str) -> None:
    """Write the runs, their facts and rows, as JSON."""
    with open(path, "w") as f:
        json.dump({"runs": runs}, f, indent=1)
        f.write("\n")


def read_json(path: str) -> list:
    """Return the runs stored by write_json()."""
    with open(path) as f:
        return json.load(f)["runs"]


def _number(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if value >= 0.01 else f"{value:.2g}"


def _grid(title: str, header: list, lines: list) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines)]

    def fmt(cells):
        return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([title, fmt(header), rule, *map(fmt, lines)])


def format_tables(run: dict) -> str:
    """Return the run's tables: per collective, time (µs) with ratios, and bus bandwidth (GB/s).

    A value marked `!` failed the correctness check.
    """
    out = []
    collectives = list(dict.fromkeys(row["collective"] for row in run["rows"]))
    for collective in collectives:
        rows = [row for row in run["rows"] if row["collective"] == collective]
        names = list(dict.fromkeys(row["contender"] for row in rows))
        by = {(row["bytes"], row["contender"]): row for row in rows}
        sizes = sorted({row["bytes"] for row in rows})
        ratios = [(a, b) for a, b in RATIOS if a in names and b in names]

        def cell(size, name, key, by=by):
            row = by.get((size, name))
            if row is None:
                return "-"
            return _number(row[key]) + ("" if row["correct"] else "!")

        time_lines, bw_lines = [], []
        for size in sizes:
            line = [format_size(size)] + [cell(size, name, "time_us") for name in names]
            for a, b in ratios:
                ra, rb = by.get((size, a)), by.get((size, b))
                line.append(f"{ra['time_us'] / rb['time_us']:.2f}" if ra and rb else "-")
            time_lines.append(line)
            bw_lines.append([format_size(size), *(cell(size, n, "busbw_GBps") for n in names)])
        first = rows[0]
        what = (
            f"{collective}, {run['setting']}: median of {first['repeats']} timed blocks, "
            f"slowest rank"
        )
        out.append(
            _grid(
                f"{what}; time per call (µs) and time ratios",
                ["size", *names, *(f"{a}/{b}" for a, b in ratios)],
                time_lines,
            )
        )
        out.append(_grid(f"{what}; bus bandwidth (GB/s)", ["size", *names], bw_lines))
        moved = {row["contender"]: row["transport"] for row in rows if row.get("transport")}
        if moved:
            out.append("transport: " + ", ".join(f"{n} over {t}" for n, t in moved.items()))
    if any(not row["correct"] for row in run["rows"]):
        out.append("! the result was wrong at this size: the time is not a valid measurement")
    return "\n\n".join(out)


def _lookup(run: dict, collective: str) -> dict:
    return {(r["bytes"], r["contender"]): r for r in run["rows"] if r["collective"] == collective}


def crossover(run: dict, small: str = "mpi", large: str = "ring"):
    """Return the smallest all-reduce size from which `large` is faster at every larger size.

    Returns None when `large` never wins (or either contender is missing).
    """
    by = _lookup(run, "allreduce")
    sizes = sorted({size for size, name in by if name == small} & {s for s, n in by if n == large})
    found = None
    for size in reversed(sizes):
        if by[(size, large)]["time_us"] < by[(size, small)]["time_us"]:
            found = size
        else:
            break
    return found


def format_expectations(run: dict) -> str:
    """Return the run's figures for the targets in docs/benchmarks.md, one per line."""
    by, lines = _lookup(run, "allreduce"), []
    sizes = sorted({size for size, _ in by})

    def ratio(a, b, size, key="time_us"):
        ra, rb = by.get((size, a)), by.get((size, b))
        return ra[key] / rb[key] if ra and rb else None

    large = [s for s in sizes if s >= 4 << 20]
    for peer in ("mpi-native", "gloo"):
        values = [ratio("ring", peer, s, "busbw_GBps") for s in large]
        values = [v for v in values if v is not None]
        if values:
            lines.append(
                f"ring / {peer} bus bandwidth, all-reduce >= 4 MiB: min {min(values):.2f}"
                f", max {max(values):.2f} (target >= 1)"
            )
    rate = run["facts"].get("link_rate_bits")
    if rate and large and all((s, "ring") in by for s in large):
        share = [by[(s, "ring")]["busbw_GBps"] * 8e9 / rate for s in large]
        lines.append(
            f"ring bus bandwidth / link rate, >= 4 MiB: min {min(share):.0%}, "
            f"max {max(share):.0%} (target >= 90%)"
        )
        naive = [ratio("naive", "ring", s) for s in large]
        if all(v is not None for v in naive):
            n = run["facts"]["ranks"]
            lines.append(
                f"naive / ring time, >= 4 MiB: {min(naive):.2f} to {max(naive):.2f} "
                f"(bandwidth cost model: n = {n}: the root moves 2(n-1)N, a ring rank 2(n-1)N/n)"
            )
    for size, target in ((1024, 2.0), (64 * 1024, 1.3)):
        for name in ("auto", "auto-nocheck"):
            value = ratio(name, "mpi-native", size)
            if value is not None:
                lines.append(
                    f"{name} / mpi-native time at {format_size(size)}: {value:.2f} "
                    f"(target <= {target:g} for auto)"
                )
        if (size, "auto") in by and (size, "auto-nocheck") in by:
            cost = by[(size, "auto")]["time_us"] - by[(size, "auto-nocheck")]["time_us"]
            lines.append(f"metadata check cost at {format_size(size)}: {cost:.1f} µs per call")
    cross = crossover(run)
    if (sizes and (sizes[0], "mpi") in by) and (sizes[0], "ring") in by:
        where = format_size(cross) if cross else "never, up to " + format_size(sizes[-1])
        lines.append(f"ring faster than mpi from: {where}")
    return "\n".join(lines)
