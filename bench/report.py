"""The bench's report: the table (figure, value, target, verdict, and the machine-speed probe's
reading while that figure was taken), the plots, and `python -m bench.report` which copies a
finished run's table and plots into bench/last_run/ (see bench/README.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench import agentpay_bench, agentpay_chain_bench, realistic

COLUMNS = ("figure", "value", "target", "verdict", "speed")


def judge(value: float | None, ok: bool, smoke: bool) -> str:
    if value is None:
        return "FAIL" if not smoke else "n/a"
    if smoke:
        return "n/a (smoke)"
    return "PASS" if ok else "FAIL"


def plan_summary(plans: dict[str, str]) -> tuple[str, int]:
    """Each plan's scan nodes ("first_page: Index Scan using ...") and the rows all of them removed by filter."""
    scans = []
    for name, plan in plans.items():
        nodes = re.findall(r"((?:Parallel )?(?:Seq|Index|Index Only|Bitmap Heap|Bitmap Index) Scan(?: using \S+)?)",
                           plan)
        scans.append(f"{name}: {', '.join(dict.fromkeys(nodes)) or 'no scan node'}")
    removed = sum(int(n) for plan in plans.values() for n in re.findall(r"Rows Removed by Filter: (\d+)", plan))
    return "; ".join(scans), removed


def table(results: dict[str, Any], smoke: bool) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    phase = {"name": ""}

    def row(name: str, value: str, target: str, verdict: str) -> None:
        out.append({"figure": name, "value": value, "target": target, "verdict": verdict,
                    "speed": speed_of(results.get(phase["name"]))})

    phase["name"] = "accept"
    acc = results.get("accept")
    if acc:
        for r in acc["runs"]:
            row(f"acceptance c={r['clients']}", f"{r['accepted_per_s']:.0f}/s vs pgbench {r['pgbench_tps']:.0f} tps "
                f"= {r['ratio']:.0%}", ">= 25% of pgbench", judge(r["ratio"], r["ratio"] >= 0.25, smoke))
    phase["name"] = "webhook"
    wh = results.get("webhook")
    if wh:
        row(f"webhook p99 @ {wh['offered_rate']:.0f}/s", f"{wh['p99_ms']:.1f} ms (p50 {wh['p50_ms']:.1f} ms, "
            f"{wh['achieved_per_s']:.0f}/s, {wh['errors']} err)", "p99 < 20 ms, 0 errors",
            judge(wh["p99_ms"], wh["p99_ms"] < 20 and wh["errors"] == 0, smoke))
        if wh.get("profile"):
            ms = wh["profile"]["ms_per_delivery"]
            row("  (info) one delivery's service time", f"{ms:.1f} ms in one process, no HTTP (2 workers at "
                f"{wh['offered_rate']:.0f}/s are then {wh['offered_rate'] * ms / 2000:.0%} busy before HTTP)",
                "p99 < 20 ms needs headroom", "info")
        v = wh["variant_connection_per_request"]
        row("  (info) same, DB_CONN_MAX_AGE=0", f"{v['p99_ms']:.1f} ms (p50 {v['p50_ms']:.1f} ms, "
            f"{v['achieved_per_s']:.0f}/s, {v['errors']} err)", "what persistence buys", "info")
    phase["name"] = "restore"
    rs = results.get("restore")
    if rs:
        p99 = rs["p99_s"]
        row(f"paid->FULL p99 (burst {rs['deliveries']})",
            f"{p99:.2f} s (p50 {rs['p50_s']:.2f} s, {rs['restored']}/{rs['deliveries']} restored, "
            f"{rs['throughput_per_s']:.1f}/s)" if p99 is not None else
            f"incomplete: {rs['restored']}/{rs['deliveries']} restored", "p99 < 1 s",
            judge(p99, p99 is not None and p99 < 1.0, smoke))
        if rs["throughput_per_s"]:
            # Whatever the order of work, the 99th-percentile restoration comes after 99 % of the
            # burst was processed, and its delivery was sent at the latest when the burst was.
            floor = max(0.0, 0.99 * rs["deliveries"] / rs["throughput_per_s"] - rs["burst_send_seconds"])
            per_event_ms = 1000 * rs["celery_concurrency"] / rs["throughput_per_s"]
            row("  (info) p99 floor = 0.99 x burst / rate - send time",
                f"{floor:.2f} s at {rs['throughput_per_s']:.1f} "
                f"restorations/s ({per_event_ms:.0f} ms per event per worker; profiled alone: "
                f"{rs['profile']['ms_per_event']:.0f} ms)",
                "seed's release gate: 60 s", "info")
    phase["name"] = "sweep"
    sw = results.get("sweep")
    if sw:
        small, large = sw["sizes"]
        rs_, rl = sw["runs"][str(small)], sw["runs"][str(large)]
        scans, removed = plan_summary(rl["explain"])
        row(f"EXPLAIN due-row pages ({large} rows)", f"{scans}; {removed} rows removed by filter",
            "index scans", judge(scans, "Seq Scan" not in scans and "Index" in scans, smoke))
        if sw.get("partial"):
            row(f"sweep {small} / {large}, {sw.get('workers', 1)} worker(s) (PARTIAL)",
                f"{rs_['wall_seconds']:.1f} s / {rl['done']} of {large} in {rl['wall_seconds']:.0f} s; "
                f"{rs_['per_cycle_ms']:.1f} vs {rl['per_cycle_ms']:.1f} ms/cycle (x{sw['per_cycle_ratio']:.2f}); "
                f"extrapolated ratio {sw['ratio']:.2f}" if sw["ratio"] else "no cycle finished",
                f"ratio <= {sw['ratio_target']:.1f}", "not judged (partial)")
            mb = rl["peak_rss_kb"] / 1024
            row(f"sweep worker peak RSS (first {rl['done']} of {large})", f"{mb:.0f} MB", "< 300 MB",
                "not judged (partial)")
        else:
            row(f"sweep {small} / {large}, {sw.get('workers', 1)} worker(s)",
                f"{rs_['wall_seconds']:.1f} s / {rl['wall_seconds']:.1f} s "
                f"(ratio {sw['ratio']:.2f})", f"ratio <= {sw['ratio_target']:.1f}",
                judge(sw["ratio"], sw["ratio"] <= sw["ratio_target"] and rs_["all_restricted"]
                      and rl["all_restricted"], smoke))
            mb = rl["peak_rss_kb"] / 1024
            row(f"sweep worker peak RSS ({large})", f"{mb:.0f} MB", "< 300 MB", judge(mb, mb < 300, smoke))
    for name in realistic.PHASES:
        phase["name"] = name
        if results.get(name):
            realistic.table_rows(name, results[name], row, judge, smoke)
    phase["name"] = "agentpay"
    if results.get("agentpay"):
        agentpay_bench.table_rows(results["agentpay"], row, judge, smoke)
    phase["name"] = "agentpay_chain"
    if results.get("agentpay_chain"):
        agentpay_chain_bench.table_rows(results["agentpay_chain"], row, judge, smoke)
    return out


def speed_of(result: dict[str, Any] | None) -> str:
    """The machine-speed probe's readings while a phase ran (10^7-loop seconds; lower is faster)."""
    loops = (result or {}).get("machine_loop_s") or []
    if not loops:
        return "-"
    low, high = min(loops), max(loops)
    return f"{low:.2f} s" if round(low, 2) == round(high, 2) else f"{low:.2f}-{high:.2f} s"


def print_table(rows: list[dict[str, str]]) -> None:
    widths = {k: max(len(k), *(len(r.get(k, "")) for r in rows)) for k in COLUMNS}
    line = "  ".join(k.upper().ljust(widths[k]) for k in widths)
    print("\n" + line + "\n" + "-" * len(line))
    for r in rows:
        print("  ".join(r.get(k, "").ljust(widths[k]) for k in widths))


def plot(results: dict[str, Any], path: Path) -> str:
    """The pictures are a convenience: a plotting failure must not fail a finished run."""
    from bench.plots import draw
    from bench.plots_real import draw_realistic

    drawn = []
    for what, draw_one in (("results", lambda: draw(results, path)),
                           ("realistic", lambda: draw_realistic(results, path.parent))):
        try:
            made = draw_one()
        except Exception as exc:  # noqa: BLE001
            drawn.append(f"{what} not drawn: {exc!r}")
            continue
        if isinstance(made, list):
            drawn.extend(str(p) for p in made)
        elif made:
            drawn.append(str(made))
    return ", ".join(drawn) or "not drawn (matplotlib missing, or no phase ran)"



# ---- bench/last_run/ ------------------------------------------------------------------------------

LAST_RUN = Path(__file__).resolve().parent / "last_run"
BEGIN, END = "<!-- bench.report: table begins -->", "<!-- bench.report: table ends -->"
PICTURES = ("results.png", "sweep_real.png", "latency_cdfs.png")


def markdown_table(results: dict[str, Any]) -> str:
    rows = results.get("table") or []
    lines = [f"Run `{results.get('command', 'python -m bench')}`, started {results.get('started_at', '?')}, "
             f"{results.get('cpus')} CPUs, load average {_load(results.get('loadavg_start'))} at the start. "
             "The speed column is the machine-speed probe while that figure was taken (seconds for a "
             "10^7-iteration Python loop; lower is faster).", "",
             "| figure | value | target | verdict | speed |", "|---|---|---|---|---|"]
    for r in rows:
        cells = (r.get(k, "").replace("|", "\\|") for k in COLUMNS)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _load(values: Any) -> str:
    return ", ".join(f"{v:.1f}" for v in values) if values else "?"


def fill_readme(readme: str, block: str) -> str:
    """The README with the text between the markers replaced by `block` (markers appended if absent)."""
    if BEGIN in readme and END in readme:
        before, rest = readme.split(BEGIN, 1)
        return before + BEGIN + "\n" + block + END + rest.split(END, 1)[1]
    return readme.rstrip("\n") + "\n\n" + BEGIN + "\n" + block + END + "\n"


def publish(results_path: Path, folder: Path = LAST_RUN) -> list[Path]:
    """Copy a finished run's plots and profiles beside its table into `folder` (bench/last_run/)."""
    import json
    import shutil

    results = json.loads(results_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    sources = [results_path.with_suffix(".png"), *(results_path.parent / name for name in PICTURES[1:])]
    sources += sorted(results_path.parent.glob("*_profile.txt"))
    for source in sources:
        if source.exists():
            target = folder / ("phases.png" if source == sources[0] else source.name)
            shutil.copyfile(source, target)
            copied.append(target)
    (folder / "table.md").write_text(markdown_table(results))
    readme = folder / "README.md"
    readme.write_text(fill_readme(readme.read_text() if readme.exists() else "", markdown_table(results)))
    return [*copied, folder / "table.md", readme]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.report",
                                description="Copy a finished run's table, plots and profiles into bench/last_run/.")
    p.add_argument("results", nargs="?", default=str(Path(__file__).resolve().parent.parent / "var" / "bench" /
                                                      "results.json"))
    p.add_argument("--to", default=str(LAST_RUN))
    args = p.parse_args(argv)
    for path in publish(Path(args.results), Path(args.to)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
