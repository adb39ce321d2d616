"""The weekly sample review over time: figures per week and the chart the admin's trend page draws.

Per week: how many picked items the reviewers found CORRECT, INCORRECT, UNSURE, or have not
reviewed yet (current verdicts only), and how often the automatic review verdict disagreed with
the reviewer. The automatic verdict READY says the stored state is what the evidence calls for;
HOLD says it found something that contradicts it. So READY against a reviewer's INCORRECT, or HOLD
against CORRECT, is a disagreement; the rate is over the items with a CORRECT or INCORRECT
verdict (UNSURE and unreviewed ones decide nothing), None for a week without any.

The chart is inline SVG rendered here, server-side: stacked bars per week and the disagreement
rate as a line on its own 0–100 % axis. No JavaScript, no plotting library.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count
from django.utils.html import escape

from dunning.models.duties import ReviewerVerdict, SampleReview, SampleVerdict
from dunning.reads.verdicts import HOLD, READY

V = ReviewerVerdict
SERIES = (("correct", "Correct", "#2e7d32"), ("incorrect", "Incorrect", "#c62828"),
          ("unsure", "Unsure", "#f9a825"), ("unreviewed", "Not reviewed", "#b0bec5"))
RATE_COLOUR = "#1a237e"


@dataclass(frozen=True)
class WeekFigures:
    week: str
    review_pk: int
    picked: int
    population: int
    correct: int
    incorrect: int
    unsure: int
    unreviewed: int
    disagreements: int
    decided: int

    @property
    def disagreement_rate(self) -> float | None:
        return self.disagreements / self.decided if self.decided else None


def _disagrees(automatic: str, verdict: str) -> bool:
    return (automatic == READY and verdict == V.INCORRECT) or (automatic == HOLD and verdict == V.CORRECT)


def trend_figures(limit: int = 26) -> list[WeekFigures]:
    """The newest `limit` weeks, oldest first (three queries)."""
    reviews = list(SampleReview.objects.order_by("-week")[:limit])[::-1]
    current = (SampleVerdict.objects.filter(item__review__in=reviews, replaced_by__isnull=True)
               .values_list("item__review_id", "item__automatic_verdict", "verdict"))
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for review_pk, automatic, verdict in current:
        counts[review_pk][verdict] += 1
        if verdict in (V.CORRECT, V.INCORRECT):
            counts[review_pk]["decided"] += 1
            counts[review_pk]["disagreements"] += _disagrees(automatic, verdict)
    picked = _picked(reviews)
    out = []
    for review in reviews:
        c = counts[review.pk]
        total = picked.get(review.pk, 0)
        reviewed = c[V.CORRECT] + c[V.INCORRECT] + c[V.UNSURE]
        out.append(WeekFigures(week=review.week, review_pk=review.pk, picked=total, population=review.population,
                               correct=c[V.CORRECT], incorrect=c[V.INCORRECT], unsure=c[V.UNSURE],
                               unreviewed=total - reviewed, disagreements=c["disagreements"], decided=c["decided"]))
    return out


def _picked(reviews: list[SampleReview]) -> dict[int, int]:
    rows = (SampleReview.objects.filter(pk__in=[r.pk for r in reviews]).annotate(n=Count("items"))
            .values_list("pk", "n"))
    return dict(rows)


def trend_svg(weeks: list[WeekFigures], *, width: int = 760, height: int = 320) -> str:
    """The chart as an <svg> element (safe to mark safe: every text is escaped here)."""
    left, right, top, bottom = 48, 56, 36, 56
    plot_w, plot_h = width - left - right, height - top - bottom
    tallest = max([w.picked for w in weeks] + [1])
    slot = plot_w / max(len(weeks), 1)
    bar_w = max(min(slot * 0.6, 48), 4)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="sample-trend" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             '<title>Weekly sample review: verdicts per week and the automatic verdict\'s disagreement rate</title>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>']
    for i in range(5):  # gridlines: counts on the left, rate on the right
        y = top + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{round(tallest * i / 4)}</text>')
        parts.append(f'<text x="{left + plot_w + 6}" y="{y + 4:.1f}" fill="{RATE_COLOUR}">{25 * i}%</text>')
    points = []
    for index, week in enumerate(weeks):
        x = left + slot * index + (slot - bar_w) / 2
        y = top + plot_h
        for key, label, colour in SERIES:
            value = getattr(week, key)
            if not value:
                continue
            h = plot_h * value / tallest
            y -= h
            parts.append(f'<rect class="bar-{key}" data-week="{escape(week.week)}" data-value="{value}" x="{x:.1f}" '
                         f'y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{colour}">'
                         f'<title>{escape(week.week)}: {value} {label.lower()}</title></rect>')
        centre = x + bar_w / 2
        parts.append(f'<text x="{centre:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{escape(week.week)}</text>')
        rate = week.disagreement_rate
        if rate is not None:
            points.append((centre, top + plot_h - plot_h * rate, week, rate))
    if len(points) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)
        parts.append(f'<polyline class="disagreement-line" points="{path}" fill="none" stroke="{RATE_COLOUR}" '
                     'stroke-width="2"/>')
    for x, y, week, rate in points:
        parts.append(f'<circle class="disagreement-point" data-week="{escape(week.week)}" data-rate="{rate:.3f}" '
                     f'cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{RATE_COLOUR}"><title>{escape(week.week)}: automatic '
                     f'verdict disagreed on {week.disagreements} of {week.decided} ({rate:.0%})</title></circle>')
    legend_x = left
    for _key, label, colour in (*SERIES, ("rate", "Disagreement rate (right axis)", RATE_COLOUR)):
        parts.append(f'<rect x="{legend_x}" y="12" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{legend_x + 16}" y="22">{label}</text>')
        legend_x += 16 + 7 * len(label) + 14
    if not weeks:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle">No sample '
                     'reviews yet.</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">ISO week</text></svg>')
    return "".join(parts)
