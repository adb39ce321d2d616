"""The weekly sample review on PostgreSQL: picking (at least 20, random but reproducible per week,
only subscriptions with a failed payment that week, idempotent), verdicts, and the trend figures."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from dunning.actions.sample_review import (
    IsoWeek,
    SampleReviewRefused,
    current_verdict,
    failed_in_week,
    pick_from,
    sample_review_pick,
    sample_verdict_record,
)
from dunning.clock import trusted_now
from dunning.jobs.framework import job_run
from dunning.models.duties import SampleReview, SampleReviewItem, SampleVerdict
from dunning.reads.review import subscription_verdict
from dunning.reads.sample_trend import trend_figures, trend_svg
from dunning.reads.verdicts import HOLD, READY
from tests.support.builders import fail_first_payment, make_subscription, open_cycle

pytestmark = pytest.mark.django_db


def failed_subscriptions(n: int) -> list[int]:
    pks = []
    for _ in range(n):
        sub = make_subscription()
        fail_first_payment(open_cycle(sub))
        pks.append(sub.pk)
    return pks


@pytest.fixture
def population(policy) -> dict[str, list[int]]:
    failed = failed_subscriptions(25)
    quiet = [make_subscription().pk for _ in range(3)]  # no failed payment: never picked
    paid_cycle = make_subscription()
    open_cycle(paid_cycle)  # a cycle without a failure: never picked
    return {"failed": failed, "quiet": [*quiet, paid_cycle.pk]}


def this_week() -> IsoWeek:
    return IsoWeek.of(trusted_now())


def test_iso_weeks():
    week = IsoWeek.named("2026-W01")
    assert (week.start.isoformat(), week.end.isoformat()) == ("2025-12-29T00:00:00+00:00", "2026-01-05T00:00:00+00:00")
    assert IsoWeek.of(week.end - timedelta(microseconds=1)).name == "2026-W01"
    assert IsoWeek.of(week.end).name == "2026-W02" and week.previous().name == "2025-W52"
    with pytest.raises(ValueError, match="ISO week"):
        IsoWeek.named("2026-13")


def test_only_subscriptions_with_a_failed_payment_that_week_are_the_population(population):
    assert failed_in_week(this_week()) == sorted(population["failed"])
    assert failed_in_week(this_week().previous()) == []


def test_picks_twenty_at_random_reproducibly_per_week(population):
    review, picked = sample_review_pick(week=this_week())
    assert picked and review.population == 25 and review.requested_size == 20
    items = list(review.items.order_by("position"))
    chosen = [i.subscription_id for i in items]
    assert len(chosen) == 20 == len(set(chosen))
    assert set(chosen) <= set(population["failed"])
    # The same week and population always give the same picks; another week's seed others.
    assert pick_from(sorted(population["failed"]), week=this_week(), size=20) == chosen
    assert pick_from(sorted(population["failed"]), week=this_week().previous(), size=20) != chosen
    assert chosen != sorted(chosen)[:20]  # random, not the first twenty


def test_a_rerun_returns_the_stored_sample(population):
    first, picked = sample_review_pick(week=this_week())
    failed_subscriptions(2)  # more failures arrive later in the week: the sample stands
    again, picked_again = sample_review_pick(week=this_week())
    assert picked and not picked_again and again.pk == first.pk
    assert (SampleReview.objects.count(), SampleReviewItem.objects.count()) == (1, 20)


def test_fewer_failures_than_the_sample_size_are_all_picked(policy):
    failed = failed_subscriptions(4)
    review, _ = sample_review_pick(week=this_week())
    assert sorted(review.items.values_list("subscription_id", flat=True)) == sorted(failed)


def test_the_size_is_a_setting(population, settings):
    settings.DUNNING_SAMPLE_REVIEW_SIZE = 7
    review, _ = sample_review_pick(week=this_week())
    assert review.items.count() == 7 and review.requested_size == 7


def test_items_freeze_state_evidence_and_the_automatic_verdict(population):
    review, _ = sample_review_pick(week=this_week())
    item = review.items.select_related("subscription").first()
    assert item.state_snapshot["entitlement_profile"] == "READ_EXPORT_NO_NEW_JOBS"
    assert [c["state"] for c in item.state_snapshot["cycles"]] == ["GRACE_ACTIVE"]
    assert [a["state"] for a in item.evidence_snapshot["attempts"]] == ["FAILED"]
    assert item.automatic_verdict in (READY, HOLD)

    assert item.automatic_verdict == subscription_verdict(item.subscription).status


def test_the_job_picks_last_iso_week_once(population):
    week = this_week()
    with time_machine.travel(trusted_now() + timedelta(days=7), tick=True):
        run = job_run("sample_review")
        assert run.changed == 1 and week.name in run.detail
        again = job_run("sample_review")
        assert again.changed == 0 and "already picked" in again.detail
    assert SampleReview.objects.get().week == week.name


# --------------------------------------------------------------------------- verdicts


@pytest.fixture
def item(population):
    review, _ = sample_review_pick(week=this_week())
    return review.items.order_by("position").first()


def test_a_verdict_is_recorded_and_a_change_is_a_new_row(item, lead, lead2):
    first = sample_verdict_record(item_pk=item.pk, user=lead, verdict="CORRECT")
    assert sample_verdict_record(item_pk=item.pk, user=lead, verdict="CORRECT").pk == first.pk  # same: no new row
    changed = sample_verdict_record(item_pk=item.pk, user=lead2, verdict="INCORRECT",
                                    note="paid event on the 2nd, still restricted")
    assert changed.replaces_id == first.pk
    rows = list(SampleVerdict.objects.filter(item=item).order_by("pk").values_list("verdict", "reviewer__username"))
    assert rows == [("CORRECT", "lead"), ("INCORRECT", "lead2")]

    assert current_verdict(item).pk == changed.pk


@pytest.mark.parametrize(("verdict", "note", "code"), [("MAYBE", "", "UNKNOWN_VERDICT"),
                                                       ("INCORRECT", " ", "NOTE_REQUIRED"),
                                                       ("UNSURE", "", "NOTE_REQUIRED")])
def test_bad_verdicts_are_refused_and_change_nothing(item, lead, verdict, note, code):
    with pytest.raises(SampleReviewRefused) as refused:
        sample_verdict_record(item_pk=item.pk, user=lead, verdict=verdict, note=note)
    assert refused.value.code == code
    assert SampleVerdict.objects.count() == 0


def test_only_a_billing_lead_records_a_verdict(item, agent, lead):
    with pytest.raises(SampleReviewRefused) as refused:
        sample_verdict_record(item_pk=item.pk, user=agent, verdict="CORRECT")
    assert refused.value.code == "NOT_A_REVIEWER"
    with pytest.raises(SampleReviewRefused) as refused:
        sample_verdict_record(item_pk=999_999, user=lead, verdict="CORRECT")
    assert refused.value.code == "NO_SUCH_ITEM"
    assert SampleVerdict.objects.count() == 0


# --------------------------------------------------------------------------- trend


def stored_review(week: IsoWeek, automatic: list[str]) -> list[SampleReviewItem]:
    """A week's sample with chosen automatic verdicts (as the pick would have stored them)."""
    review = SampleReview.objects.create(week=week.name, week_start=week.start, week_end=week.end,
                                         picked_at=week.end, seed="test", requested_size=20,
                                         population=len(automatic) + 3)
    return [SampleReviewItem.objects.create(review=review, subscription=make_subscription(), position=n,
                                            state_snapshot={}, evidence_snapshot={}, automatic_verdict=verdict)
            for n, verdict in enumerate(automatic, start=1)]


def test_trend_figures_count_current_verdicts_and_disagreements(policy, lead):
    older, newer = this_week().previous(), this_week()
    old = stored_review(older, [READY, READY, HOLD, HOLD, READY])
    new = stored_review(newer, [READY, HOLD, READY, READY])
    for item, verdict in zip(old, ("CORRECT", "INCORRECT", "CORRECT", "INCORRECT", "UNSURE"), strict=True):
        sample_verdict_record(item_pk=item.pk, user=lead, verdict=verdict, note="seen")
    sample_verdict_record(item_pk=new[0].pk, user=lead, verdict="UNSURE", note="first look")
    sample_verdict_record(item_pk=new[0].pk, user=lead, verdict="CORRECT")  # changed: only the new one counts
    weeks = trend_figures()
    assert [w.week for w in weeks] == [older.name, newer.name]  # oldest first
    first, second = weeks
    assert (first.picked, first.correct, first.incorrect, first.unsure, first.unreviewed) == (5, 2, 2, 1, 0)
    # READY+INCORRECT (item 2) and HOLD+CORRECT (item 3) disagree; of the 4 judged correct or incorrect.
    assert (first.disagreements, first.decided, first.disagreement_rate) == (2, 4, 0.5)
    assert (second.picked, second.correct, second.incorrect, second.unsure, second.unreviewed) == (4, 1, 0, 0, 3)
    assert (second.disagreements, second.decided, second.disagreement_rate) == (0, 1, 0.0)
    assert trend_figures(limit=1)[0].week == newer.name


def test_the_chart_draws_each_series_per_week(population, lead):
    review, _ = sample_review_pick(week=this_week())
    items = list(review.items.order_by("position"))
    sample_verdict_record(item_pk=items[0].pk, user=lead, verdict="CORRECT")
    sample_verdict_record(item_pk=items[1].pk, user=lead, verdict="INCORRECT", note="wrong")
    svg = trend_svg(trend_figures())
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert f'class="bar-correct" data-week="{review.week}" data-value="1"' in svg
    assert f'class="bar-incorrect" data-week="{review.week}" data-value="1"' in svg
    assert f'class="bar-unreviewed" data-week="{review.week}" data-value="18"' in svg
    assert 'class="bar-unsure"' not in svg
    assert f'class="disagreement-point" data-week="{review.week}"' in svg
    assert "No sample reviews yet" in trend_svg([])
