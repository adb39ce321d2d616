"""The realistic-provider pictures (issue 21), beside results.json:

- `sweep_real.png`: cycles done against seconds, with the rate-limit floor (the provider reads
  the sweep needed, at the limit) and 1.15 × the floor drawn as lines from the origin: a sweep
  at the limit runs along the floor line, the target is to finish left of the 1.15 line. The
  worker's peak RSS so far is dotted on the right axis.
- `latency_cdfs.png`: cumulative latency of webhook ingest (ms, from due time), paid → FULL under
  the sustained rate (s, from due time) and over the burst (s, from send), each with its target;
  on the burst the target is a drain rate, drawn as the time the last restoration would come at
  90 % of the limit.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from bench.figures import cdf_points, floor_line


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mark(ax: Any, x: float | None, text: str, style: str = "--") -> None:
    if x is not None:
        ax.axvline(x, linestyle=style, linewidth=1, color="grey")
        ax.annotate(text, (x, 0.02), rotation=90, fontsize=7, color="dimgrey", xytext=(3, 0),
                    textcoords="offset points")


def draw_realistic(results: dict[str, Any], folder: Path) -> list[Path]:
    try:
        plt = _pyplot()
    except ImportError:
        return []
    made = []
    title = "\n".join(textwrap.wrap(f"{results.get('command', 'python -m bench')}  ({results.get('started_at', '')}, "
                                    f"{results.get('cpus')} CPUs)", 130))
    if results.get("sweep_real"):
        fig, ax = plt.subplots(figsize=(8, 5))
        sweep_progress(ax, results["sweep_real"])
        fig.suptitle(title, fontsize=8)
        fig.tight_layout()
        made.append(folder / "sweep_real.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    panels = [(name, draw) for name, draw in (("webhook", _webhook), ("paid_sustained", _sustained),
                                             ("burst_real", _burst)) if results.get(name)]
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 1, 4.5), squeeze=False)
        for ax, (name, draw) in zip(axes[0], panels, strict=True):
            draw(ax, results[name])
            ax.axhline(0.99, linewidth=0.5, color="grey")
            ax.set_ylabel("fraction")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="lower right")
        fig.suptitle(title, fontsize=8)
        fig.tight_layout()
        made.append(folder / "latency_cdfs.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def sweep_progress(ax: Any, r: dict[str, Any]) -> None:
    # From the job's start: the workers' Django setup before it is not the sweep's.
    offset = r.get("job_start_offset") or 0.0
    trace = [(t - offset, done, rss) for t, done, rss in r.get("trace") or [] if t >= offset]
    trace.insert(0, (0.0, 0, trace[0][2] if trace else 0))
    size, floor = r["size"], r["floor_seconds"]
    ratio = f"{r['ratio']:.2f} x the floor" if r.get("ratio") else "no ratio"
    ax.plot([t[0] for t in trace], [t[1] for t in trace], marker=".", markersize=3,
            label=f"cycles restricted: {r['wall_seconds']:.0f} s = {ratio}")
    ax.plot(*floor_line(size, floor), color="black", linewidth=1,
            label=f"rate-limit floor: {r['provider_reads']} reads at {r['rate_limit']:g}/s = {floor:.0f} s")
    ax.plot(*floor_line(size, floor, r["ratio_target"]), color="black", linestyle="--", linewidth=1,
            label=f"target: {r['ratio_target']:g} x floor = {floor * r['ratio_target']:.0f} s")
    rss_ax = ax.twinx()
    rss_ax.plot([t[0] for t in trace], [t[2] for t in trace], linestyle=":", linewidth=1, color="tab:red")
    rss_ax.axhline(300, linestyle=":", linewidth=1, color="tab:red")
    rss_ax.set_ylabel("worker peak RSS so far, MB (red dotted; target < 300)")
    rss_ax.set_ylim(bottom=0, top=max(320, *(t[2] * 1.1 for t in trace)) if trace else 320)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the grace_expiry job started")
    ax.set_ylabel("cycles restricted")
    ax.set_title(f"grace sweep against the provider: {size} cycles, {r['workers']} worker(s) x {r['io_threads']} "
                 f"I/O threads, {r['latency_ms']:g} ± {r['latency_spread_ms']:g} ms, {r['rate_limit']:g}/s",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if values:
        ax.plot(*cdf_points(values), label=label)


def _webhook(ax: Any, wh: dict[str, Any]) -> None:
    _cdf(ax, wh.get("latencies_ms") or [], f"p99 {wh['p99_ms']:.1f} ms, {wh['achieved_per_s']:.0f}/s")
    _mark(ax, 20.0, "target p99 20 ms")
    ax.set_xscale("log")
    ax.set_xlabel("ms from due time")
    ax.set_title(f"webhook ingest at {wh['offered_rate']:.0f}/s", fontsize=9)


def _sustained(ax: Any, r: dict[str, Any]) -> None:
    p99 = f"p99 {r['p99_s']:.2f} s" if r.get("p99_s") is not None else "incomplete"
    _cdf(ax, r.get("latencies_s") or [], f"{p99}, {r['restored']}/{r['deliveries']} restored")
    _mark(ax, r["p99_target_s"], f"target p99 {r['p99_target_s']:g} s")
    ax.set_xlabel("s from due time to the FULL snapshot")
    ax.set_title(f"paid → FULL at {r['rate']:g}/s for {r['seconds']:g} s (celery {r['celery_pool']} "
                 f"x {r['celery_concurrency']})", fontsize=9)


def _burst(ax: Any, r: dict[str, Any]) -> None:
    frac = f"{r['fraction_of_limit']:.0%} of the limit" if r.get("fraction_of_limit") else "no drain rate"
    _cdf(ax, r.get("latencies_s") or [], f"drain {r['drain_per_s'] or 0:.1f}/s = {frac}")
    # The last restoration of a burst drained at exactly the target rate (time from the first send).
    _mark(ax, r["deliveries"] / (r["target"] * r["rate_limit"]),
          f"last one at {r['target']:.0%} of {r['rate_limit']:g}/s")
    ax.set_xlabel("s from send to the FULL snapshot")
    ax.set_title(f"paid → FULL, burst of {r['deliveries']} (celery {r['celery_pool']} x {r['celery_concurrency']})",
                 fontsize=9)
