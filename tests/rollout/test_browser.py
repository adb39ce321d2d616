"""The rollout page in Debian's Chromium (Playwright): a billing lead reads the status table and
the shadow report's disagreements, is refused a promotion with a bad percentage, promotes, and
rolls the cohort back to the more permissive previous policy. Screenshot: var/screenshots/rollout_*.png"""

from __future__ import annotations

import pytest
from django.urls import reverse

from dunning.models import JobRun, RolloutStage
from subscriptions.models import Subscription
from tests.rollout.conftest import PASSWORD, grace, publish
from tests.support.browser import screenshot
from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, paid_evidence, restrict

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lead_promotes_and_rolls_back_from_the_rollout_page(live_server, new_page, lead, time_machine):
    time_machine.move_to("2026-09-01T09:00:00Z", tick=True)
    kind = publish(1, grace=grace("P10D"))
    strict = publish(2, mode="SHADOW", grace=grace("P4D"),
                     rollout={"percent": 100, "cohort": "default", "low_risk": {"min_tenure_days": 30}})
    paid_later = make_subscription()
    cycle = open_cycle(paid_later)
    fail_first_payment(cycle)
    later = restrict(cycle)
    accept(cycle, "recover", evidence=paid_evidence(cycle, now=later), now=later)
    make_subscription()
    time_machine.move_to("2026-11-03T09:00:00Z", tick=True)

    page = new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", lead.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.goto(f"{live_server.url}{reverse('admin:dunning_rolloutstage_changelist')}?gates=1")
    status = page.locator("#rollout-status").inner_text()
    assert "test-monthly@2" in status and "SHADOW" in status and "2 (monthly) — window met" in status
    assert "tenure >= 30 days" in status and "green" in status
    disagreements = page.locator("#shadow-disagreements").inner_text()
    assert paid_later.provider_subscription_id in disagreements and "the customer paid afterwards" in disagreements

    page.fill("#id_promote-policy", "test-monthly@2")
    page.select_option("#id_promote-mode", "NOTIFY_ONLY")
    page.fill("#id_promote-percent", "150")
    page.fill("#id_promote-reason", "seed 001: notifications next")
    page.fill("#id_promote-ticket", "ROLL-19")
    page.click("#promote-submit")
    assert "PERCENT_OUT_OF_RANGE" in page.locator("#promote-errors").inner_text()
    assert not RolloutStage.objects.exists()
    page.fill("#id_promote-percent", "5")
    page.click("#promote-submit")
    assert "SHADOW 100 % → NOTIFY_ONLY 5 %" in page.locator("ul.messagelist").inner_text()
    assert "NOTIFY_ONLY" in page.locator("#rollout-status").inner_text()
    assert "ROLL-19" in page.locator("#rollout-stages").inner_text()
    screenshot(page, "rollout_promoted")

    page.fill("#id_rollback-reason", "incident: v2 grace too short")
    page.fill("#id_rollback-ticket", "INC-19")
    page.click("#rollback-submit")
    message = page.locator("ul.messagelist").inner_text()
    assert "test-monthly@2 → test-monthly@1: 2 rebound, 0 refused" in message and "paused" in message
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {kind.pk} != {strict.pk}
    screenshot(page, "rollout_rolled_back")

    # Forward again, as a queued job whose progress the page shows: a typo first, refused as it is typed.
    page.fill("#id_rebind-policy", "test-monthly@9")
    page.fill("#id_rebind-reason", "incident over: v2 again")
    page.fill("#id_rebind-ticket", "INC-19")
    page.click("#rebind-submit")
    assert "UNKNOWN_POLICY" in page.locator("#rebind-errors").inner_text()
    assert not JobRun.objects.filter(job="rollout_rebind_forward").exists()
    page.fill("#id_rebind-policy", "test-monthly@2")
    page.click("#rebind-submit")
    assert "is queued" in page.locator("ul.messagelist").inner_text()
    page.reload()  # the task ran in process (tests run Celery eagerly); the page reads its JobRun
    runs = page.locator("#rebind-runs").inner_text()
    assert "OK" in runs and "test-monthly@2 (INC-19)" in runs
    assert JobRun.objects.get(job="rollout_rebind_forward").changed == 2
    assert set(Subscription.objects.values_list("policy_id", flat=True)) == {strict.pk}
    screenshot(page, "rollout_rebind_job")
