"""Seed 003's duties in Debian's Chromium against the live server: a billing lead works the
compensation queue (takes a case, is refused a bounded restore without an end date, re-fetches
the invoice and re-applies the provider's truth), and records a verdict in the weekly sample
review, then reads the trend page's chart.

Screenshots land in var/screenshots/duties_*.png (git-ignored).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from dunning.actions.alerts import alert_raise
from dunning.actions.sample_review import IsoWeek, sample_review_pick, sample_verdict_record
from dunning.clock import trusted_now
from dunning.jobs.framework import job_run
from dunning.models import AlertKind, ReconciliationReport
from dunning.models.duties import CompensationCase, SampleVerdict
from tests.console.test_browser import admin_login
from tests.duties.test_sample_review import failed_subscriptions, stored_review
from tests.support.browser import screenshot
from tests.support.builders import make_subscription

pytestmark = pytest.mark.django_db(transaction=True)


def test_lead_takes_and_resolves_a_case_from_the_queue(live_server, new_page, lead, grace_scene, provider_says):
    invoice = grace_scene.cycle.invoice
    alert = alert_raise(kind=AlertKind.PAID_NOT_RESTORED, dedupe_key=f"paid_not_restored:{invoice.provider_invoice_id}",
                        detail=f"Invoice {invoice.provider_invoice_id} was paid (first evidence 61 s ago) but access "
                               f"is not restored: its cycle is GRACE_ACTIVE.",
                        figures={}, now=trusted_now(), subscription=grace_scene.sub, invoice=invoice)
    other = make_subscription(email="bob@example.com")
    now = trusted_now()
    report = ReconciliationReport.objects.create(
        run_for=now, window_start=now - timedelta(days=1), window_end=now, created_at=now, totals={},
        discrepancies=[{"kind": "ENTITLEMENT_MISMATCH", "subscription": other.pk, "stored_profile": "FULL",
                        "recomputed_profile": "SUSPENDED", "detail": f"Subscription {other.provider_subscription_id} "
                                                                     "holds FULL, but its cycles call for SUSPENDED."}])
    job_run("compensation_intake")
    case = CompensationCase.objects.get(source_alert=alert)
    page = new_page()
    admin_login(page, live_server, lead)

    page.goto(f"{live_server.url}{reverse('admin:dunning_compensationcase_changelist')}")
    listing = page.locator("#result_list").inner_text()
    assert listing.count("open — nobody owns it") == 2
    assert "Paid but not entitled" in listing and "Entitled but not paid" in listing
    assert grace_scene.sub.provider_subscription_id in listing and other.provider_subscription_id in listing
    assert alert.dedupe_key in listing and f"reconciliation {report.pk} (ENTITLEMENT_MISMATCH)" in listing
    screenshot(page, "duties_compensation_queue")

    page.click(f"#result_list a:text-is('#{case.pk}')")
    assert "Open — nobody owns it" in page.locator("#case-state").inner_text()
    assert "PAYMENT_FAILED" in page.locator("#case-evidence").inner_text() or \
        "record_failure" in page.locator("#case-evidence").inner_text()
    assert page.locator("#resolve-form").count() == 0  # only the owner resolves
    page.click("#take-submit")
    assert "You own this case now" in page.locator("ul.messagelist").inner_text()
    assert "owner lead" in page.locator("#case-state").inner_text()

    page.check("input[name=resolution][value=GRANT_EXCEPTION]")
    page.fill("#resolve-form textarea[name=reason]", "Customer paid by bank transfer")
    page.fill("#resolve-form input[name=ticket]", "SUP-2024")
    page.click("#resolve-submit")
    assert "Refused (EXPIRY_REQUIRED)" in page.locator("#ops-errors").inner_text()
    screenshot(page, "duties_compensation_refused")
    assert CompensationCase.objects.get(pk=case.pk).state == "OWNED"

    provider_says("paid")
    page.goto(f"{live_server.url}{reverse('admin:dunning_compensationcase_change', args=[case.pk])}")
    page.check("input[name=resolution][value=REFETCH_AND_REAPPLY]")
    page.fill("#resolve-form textarea[name=reason]", "Provider shows the invoice paid; our webhook was lost")
    page.fill("#resolve-form input[name=ticket]", "SUP-2024")
    screenshot(page, "duties_compensation_case")
    page.click("#resolve-submit")
    assert "Resolved (Re-fetch the invoice" in page.locator("ul.messagelist").inner_text()
    assert "FULL" in page.locator("#case-profile").inner_text()
    assert "SUP-2024" in page.locator("#case-resolution").inner_text()
    assert "Resolved" in page.locator("#case-trail").inner_text()
    screenshot(page, "duties_compensation_resolved")
    case.refresh_from_db()
    assert (case.state, case.resolution, case.resolved_by_id) == ("RESOLVED", "REFETCH_AND_REAPPLY", lead.pk)
    grace_scene = grace_scene.fresh()
    assert (grace_scene.cycle.state, grace_scene.sub.entitlement_profile) == ("RECOVERED", "FULL")


def test_lead_records_a_verdict_and_reads_the_trend(live_server, new_page, lead, policy):
    this_week = IsoWeek.of(trusted_now())
    weeks_ago = [this_week.previous().previous().previous(), this_week.previous().previous(), this_week.previous()]
    for week, verdicts in zip(weeks_ago, (("CORRECT",) * 14 + ("INCORRECT",) * 4 + ("UNSURE",) * 2,
                                          ("CORRECT",) * 17 + ("INCORRECT",) * 2,
                                          ("CORRECT",) * 12 + ("INCORRECT",) * 1), strict=True):
        items = stored_review(week, ["RECOVERY_REVIEW_READY"] * 16 + ["HOLD"] * 4)
        for item, verdict in zip(items, verdicts, strict=False):
            sample_verdict_record(item_pk=item.pk, user=lead, verdict=verdict, note="looked")
    failed_subscriptions(21)
    review, _ = sample_review_pick(week=this_week)
    item = review.items.order_by("position").first()
    page = new_page()
    admin_login(page, live_server, lead)

    page.goto(f"{live_server.url}{reverse('admin:dunning_samplereview_change', args=[review.pk])}")
    table = page.locator("#review-items").inner_text()
    assert table.count("not reviewed") == 20 and "20 of 21 subscriptions" in page.locator("#review-panel").inner_text()
    screenshot(page, "duties_sample_week")
    page.click(f"#review-items a:text-is('{item.subscription.provider_subscription_id}')")
    assert "GRACE_ACTIVE" in page.locator("#item-state").inner_text()
    assert "FAILED" in page.locator("#item-evidence").inner_text()
    assert item.automatic_verdict in page.locator("#automatic-verdict").inner_text()
    page.check("input[name=verdict][value=INCORRECT]")
    page.click("#verdict-submit")
    assert "Refused (NOTE_REQUIRED)" in page.locator("#ops-errors").inner_text()
    assert not SampleVerdict.objects.filter(item=item).exists()
    page.check("input[name=verdict][value=INCORRECT]")  # the refused form, shown again with the error
    page.fill("textarea[name=note]", "The failure was a provider outage; grace should not have started")
    page.click("#ops-submit")
    assert "Recorded: Incorrect" in page.locator("ul.messagelist").inner_text()
    assert "provider outage" in page.locator("#current-verdict").inner_text()
    screenshot(page, "duties_sample_item")
    assert SampleVerdict.objects.filter(item=item).get().verdict == "INCORRECT"

    page.goto(f"{live_server.url}{reverse('admin:dunning_samplereview_changelist')}")
    page.click("#trend-link")
    page.wait_for_selector("#trend-chart svg")  # click returns once the navigation starts, not when the page is in
    assert page.locator("#trend-chart svg").count() == 1
    assert page.locator("#trend-chart rect.bar-correct").count() == 3
    assert page.locator("#trend-chart rect.bar-unreviewed").count() == 3  # the oldest week is fully reviewed
    assert page.locator("#trend-chart circle.disagreement-point").count() == 4
    rows = page.locator("#trend-table tbody tr")
    assert rows.count() == 4 and this_week.name in rows.nth(3).inner_text()
    screenshot(page, "duties_sample_trend")
