"""PNG plots of a result set: bus bandwidth and time against message size, one line per contender.

matplotlib is imported here only, so the benchmark runs without it (`--no-plot`).
"""

from .method import BUS_FACTORS, format_size

__all__ = ["plot_collective", "plot_all"]

# One fixed colour and marker per contender, the same in every figure.
_STYLE = {
    "ring": ("tab:blue", "o"),
    "naive": ("tab:red", "v"),
    "mpi": ("tab:green", "s"),
    "auto": ("tab:purple", "D"),
    "auto-nocheck": ("tab:pink", "d"),
    "mpi-native": ("black", "x"),
    "gloo": ("tab:orange", "^"),
    "horovodlite": ("tab:purple", "D"),  # --device cuda
    "horovodlite-mpi": ("tab:green", "s"),
    "torch-nccl": ("black", "x"),
}


def _size_axis(ax, sizes: list) -> None:
    ax.set_xscale("log", base=2)
    ticks = [s for i, s in enumerate(sizes) if i % max(1, len(sizes) // 8) == 0]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(s).replace(" ", "") for s in ticks], rotation=45)
    ax.set_xlabel("message size")
    ax.grid(True, which="major", alpha=0.3)


def plot_collective(runs: list, collective: str, path: str) -> bool:
    """Plot `collective` for every run that measured it (one row of two panels per run).

    Returns whether a figure was written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [run for run in runs if any(r["collective"] == collective for r in run["rows"])]
    if not runs:
        return False
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 4.2 * len(runs)), squeeze=False)
    for (bw_ax, time_ax), run in zip(axes, runs):
        rows = [r for r in run["rows"] if r["collective"] == collective]
        sizes = sorted({r["bytes"] for r in rows})
        for name in dict.fromkeys(r["contender"] for r in rows):
            mine = sorted((r for r in rows if r["contender"] == name), key=lambda r: r["bytes"])
            colour, marker = _STYLE.get(name, (None, "."))
            x = [r["bytes"] for r in mine]
            style = {"color": colour, "marker": marker, "markersize": 4, "label": name}
            bw_ax.plot(x, [r["busbw_GBps"] for r in mine], **style)
            time_ax.plot(x, [r["time_us"] for r in mine], **style)
            # The spread of the timed blocks: how steady the machine was.
            low, high = [r["time_us_min"] for r in mine], [r["time_us_max"] for r in mine]
            time_ax.fill_between(x, low, high, color=colour, alpha=0.12, linewidth=0)
            bad = [r for r in mine if not r["correct"]]
            if bad:
                time_ax.scatter(
                    [r["bytes"] for r in bad],
                    [r["time_us"] for r in bad],
                    s=80,
                    facecolors="none",
                    edgecolors="red",
                )
        rate = run["facts"].get("link_rate_bits")
        if rate:
            ideal = rate / 8 / 1e9
            bw_ax.axhline(
                ideal, color="grey", linestyle="--", label=f"link rate {rate / 1e9:g} Gbit/s"
            )
            factor = BUS_FACTORS[collective](run["facts"]["ranks"])
            time_ax.plot(
                sizes,
                [s * factor / (ideal * 1e9) * 1e6 for s in sizes],
                color="grey",
                linestyle="--",
                label="bandwidth bound at link rate",
            )
        bw_ax.set_ylabel("bus bandwidth (GB/s)")
        bw_ax.set_title(f"{collective}: {run['setting']}", fontsize=10)
        time_ax.set_ylabel("time per call (µs)")
        time_ax.set_yscale("log")
        time_ax.set_title(f"{collective}: {run['setting']}", fontsize=10)
        for ax in (bw_ax, time_ax):
            _size_axis(ax, sizes)
        bw_ax.legend(fontsize=8, loc="upper left")
        time_ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_all(runs: list, prefix: str) -> list:
    """Write `<prefix>_<collective>.png` for every collective measured; return the paths."""
    collectives = dict.fromkeys(r["collective"] for run in runs for r in run["rows"])
    paths = []
    for collective in collectives:
        path = f"{prefix}_{collective}.png"
        if plot_collective(runs, collective, path):
            paths.append(path)
    return paths
