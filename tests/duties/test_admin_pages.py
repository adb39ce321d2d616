"""The duties' admin pages with Django's test client: who sees them, and that a refused post
through them changes nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from dunning.actions.sample_review import IsoWeek, sample_verdict_record
from dunning.clock import trusted_now
from dunning.models.duties import CompensationAction, CompensationCase, SampleVerdict
from tests.duties.conftest import PASSWORD, open_case
from tests.duties.test_sample_review import stored_review

pytestmark = pytest.mark.django_db


def logged_in(client, user):  # noqa: ANN001, ANN201
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_a_support_agent_sees_neither_the_queue_nor_the_reviews(client, agent, grace_scene):
    logged_in(client, agent)
    for name in ("dunning_compensationcase_changelist", "dunning_samplereview_changelist",
                 "dunning_samplereview_trend"):
        assert client.get(reverse(f"admin:{name}")).status_code == 403


def test_a_refused_post_changes_nothing(client, agent, lead, grace_scene):
    case = open_case(grace_scene)
    logged_in(client, agent)
    response = client.post(reverse("admin:dunning_compensationcase_take", args=[case.pk]))
    assert response.status_code == 302
    case.refresh_from_db()
    assert (case.state, case.owner_id, CompensationAction.objects.filter(case=case).count()) == ("OPEN", None, 1)

    logged_in(client, lead)
    response = client.post(reverse("admin:dunning_compensationcase_resolve", args=[case.pk]),
                           {"resolution": "EXPLAINED", "reason": "test", "ticket": "SUP-1"})
    assert response.status_code == 200 and b"Refused (NOT_THE_OWNER)" in response.content
    response = client.post(reverse("admin:dunning_compensationcase_resolve", args=[case.pk]),
                           {"resolution": "EXPLAINED", "reason": "", "ticket": ""})
    assert response.status_code == 200 and b"This field is required" in response.content
    assert CompensationCase.objects.get(pk=case.pk).state == "OPEN"


def test_the_lead_reads_the_queue_the_case_and_the_trend(client, lead, grace_scene, policy):
    case = open_case(grace_scene)
    items = stored_review(IsoWeek.of(trusted_now()), ["RECOVERY_REVIEW_READY", "HOLD"])
    sample_verdict_record(item_pk=items[0].pk, user=lead, verdict="CORRECT")
    logged_in(client, lead)
    listing = client.get(reverse("admin:dunning_compensationcase_changelist")).content.decode()
    assert grace_scene.sub.provider_subscription_id in listing and "open — nobody owns it" in listing
    page = client.get(reverse("admin:dunning_compensationcase_change", args=[case.pk])).content.decode()
    assert 'id="take-form"' in page and 'id="resolve-form"' not in page and 'id="case-evidence"' in page
    trend = client.get(reverse("admin:dunning_samplereview_trend")).content.decode()
    assert "<svg" in trend and 'class="bar-correct"' in trend and 'class="bar-unreviewed"' in trend
    item_page = client.get(reverse("admin:dunning_samplereviewitem_change", args=[items[1].pk])).content.decode()
    assert 'id="verdict-form"' in item_page and "HOLD" in item_page
    response = client.post(reverse("admin:dunning_samplereviewitem_verdict", args=[items[1].pk]),
                           {"verdict": "UNSURE", "note": ""})
    assert b"Refused (NOTE_REQUIRED)" in response.content
    assert not SampleVerdict.objects.filter(item=items[1]).exists()
