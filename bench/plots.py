"""One picture of a bench run (``var/bench/results.png``, beside the JSON): the latency distributions and the
sweep's progress are easier to judge drawn than as three percentiles.

Panels, each with its target drawn in:
- acceptance throughput beside pgbench at the same client count;
- webhook latency from each delivery's due time (cumulative, log scale);
- paid → FULL latency over the burst (cumulative);
- grace sweep: cycles done against time for both sizes, scaled to the small size, so a linear
  sweep shows two coinciding lines; the worker's RSS on a second axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _cdf(ax: Any, values: list[float], *, label: str) -> None:
    ordered = sorted(values)
    n = len(ordered)
    ax.plot(ordered, [(i + 1) / n for i in range(n)], label=label)


def _mark(ax: Any, x: float | None, text: str, style: str) -> None:
    if x is not None:
        ax.axvline(x, linestyle=style, linewidth=1, color="grey")
        ax.annotate(text, (x, 0.02), rotation=90, fontsize=7, color="dimgrey", xytext=(3, 0),
                    textcoords="offset points")


def draw(results: dict[str, Any], path: Path) -> Path | None:
    """Draw what the run measured; panels of phases that did not run are left out."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [name for name in ("accept", "webhook", "restore", "sweep") if results.get(name)]
    if not panels:
        return None
    drawers = {"accept": _accept, "webhook": _webhook, "restore": _restore, "sweep": _sweep}
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7, 5 * len(panels)), 4.5), squeeze=False)
    for ax, name in zip(axes[0], panels, strict=True):
        drawers[name](ax, results[name])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left" if name == "sweep" else "best")
    title = results.get("command", "python -m bench")
    fig.suptitle(f"{title}  ({results.get('started_at', '')}, {results.get('cpus')} CPUs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _accept(ax: Any, acc: dict[str, Any]) -> None:
    runs = acc["runs"]
    xs = range(len(runs))
    ax.bar([x - 0.2 for x in xs], [r["pgbench_tps"] for r in runs], width=0.4, label="pgbench tpcb-like")
    ax.bar([x + 0.2 for x in xs], [r["accepted_per_s"] for r in runs], width=0.4, label="acceptances")
    ax.plot([x + 0.2 for x in xs], [0.25 * r["pgbench_tps"] for r in runs], "k_", markersize=18,
            label="target: 25 % of pgbench")
    for x, r in zip(xs, runs, strict=True):
        ax.annotate(f"{r['ratio']:.0%}", (x + 0.2, r["accepted_per_s"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{r['clients']} client(s)" for r in runs])
    ax.set_ylabel("transactions / s")
    ax.set_title("acceptance throughput", fontsize=10)


def _webhook(ax: Any, wh: dict[str, Any]) -> None:
    for run, label in ((wh, "DB_CONN_MAX_AGE=60"), (wh.get("variant_connection_per_request"), "DB_CONN_MAX_AGE=0")):
        if run and run.get("latencies_ms"):
            _cdf(ax, run["latencies_ms"], label=f"{label}: p99 {run['p99_ms']:.1f} ms")
    _mark(ax, 20.0, "target p99 20 ms", "--")
    ax.axhline(0.99, linewidth=0.5, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("ms from due time")
    ax.set_ylabel("fraction of deliveries")
    ax.set_title(f"webhook latency at {wh['offered_rate']:.0f}/s", fontsize=10)


def _restore(ax: Any, rs: dict[str, Any]) -> None:
    if rs.get("latencies_s"):
        _cdf(ax, rs["latencies_s"], label=f"{rs['restored']}/{rs['deliveries']} restored, "
                                          f"{rs['throughput_per_s']:.1f}/s")
    _mark(ax, 1.0, "target p99 1 s", "--")
    _mark(ax, rs.get("p99_s"), "p99", ":")
    ax.axhline(0.99, linewidth=0.5, color="grey")
    ax.set_xlabel("s from delivery to the FULL snapshot")
    ax.set_ylabel("fraction of subscriptions")
    ax.set_title(f"paid → FULL, burst of {rs['deliveries']}", fontsize=10)


def _sweep(ax: Any, sw: dict[str, Any]) -> None:
    small, large = sw["sizes"]
    rss_ax = ax.twinx()
    for size in (small, large):
        run = sw["runs"][str(size)]
        trace = run.get("trace") or []
        if not trace:
            continue
        scale = small / size
        label = f"{size}: {run['per_cycle_ms']:.1f} ms/cycle" + (" (PARTIAL)" if run.get("partial") else "")
        (line,) = ax.plot([t[0] * scale for t in trace], [t[1] * scale for t in trace], label=label)
        rss_ax.plot([t[0] * scale for t in trace], [t[2] for t in trace], linestyle=":", linewidth=1,
                    color=line.get_color())
    rss_ax.axhline(300, linestyle="--", linewidth=1, color="grey")
    rss_ax.set_ylabel("worker peak RSS so far, MB (dotted; target < 300)")
    rss_ax.set_ylim(bottom=0)
    ax.set_xlabel(f"seconds, scaled to {small} cycles")
    ax.set_ylabel(f"cycles restricted, scaled to {small}")
    ratio = f"ratio {sw['ratio']:.2f}" if sw.get("ratio") else ""
    if sw.get("partial"):
        ratio += " (extrapolated)"
    ax.set_title(f"grace sweep {small} / {large}: {ratio} (target ≤ {sw['ratio_target']:.1f})", fontsize=10)
