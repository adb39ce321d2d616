"""Races on separate PostgreSQL sessions: detectors opening the same case, reviewers recording
verdicts on the same item at once."""

from __future__ import annotations

import pytest

from dunning.actions.compensation import compensation_open
from dunning.actions.sample_review import IsoWeek, sample_verdict_record
from dunning.clock import trusted_now
from dunning.models.duties import CompensationCase, CompensationKind, SampleVerdict
from tests.duties.test_sample_review import stored_review
from tests.support.threads import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def test_four_workers_opening_the_same_mismatch_leave_one_case(grace_scene):
    def open_it():  # noqa: ANN202
        return compensation_open(kind=CompensationKind.PAID_NOT_ENTITLED, subscription=grace_scene.sub,
                                 invoice=grace_scene.cycle.invoice, detail="race", now=trusted_now())[1]

    opened = run_together([open_it] * 4)
    assert sorted(opened) == [False, False, False, True]
    case = CompensationCase.objects.get()
    assert case.sightings == 4
    assert sorted(case.actions.values_list("action", flat=True)) == ["OPEN", "SEEN_AGAIN", "SEEN_AGAIN", "SEEN_AGAIN"]


def test_two_reviewers_at_once_leave_one_chain_of_verdicts(lead, lead2, policy):
    [item] = stored_review(IsoWeek.of(trusted_now()), ["HOLD"])
    results = run_together([
        lambda: sample_verdict_record(item_pk=item.pk, user=lead, verdict="CORRECT"),
        lambda: sample_verdict_record(item_pk=item.pk, user=lead2, verdict="INCORRECT", note="still restricted"),
    ])
    rows = list(SampleVerdict.objects.filter(item=item).order_by("recorded_at", "pk"))
    assert len(rows) == 2 and {r.pk for r in results} == {r.pk for r in rows}
    first, second = sorted(rows, key=lambda r: (r.replaces_id is not None, r.pk))
    assert first.replaces_id is None and second.replaces_id == first.pk  # no overwrite, no fork
