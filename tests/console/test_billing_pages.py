"""Customer billing pages (SPEC §12): plain words, own subscriptions only, CSRF on every POST."""

from __future__ import annotations

import re
from datetime import timedelta

from django.test import Client
from django.urls import reverse

from dunning.actions.support import cycle_grant_exception
from dunning.clock import trusted_now
from dunning.states import CycleState
from entitlements.profiles import PROFILES
from tests.console.conftest import PASSWORD
from tests.support.builders import reload

INTERNAL = [*CycleState.values, *PROFILES, "RETRY_AUTHORITY", "ATTEMPT_", "generation", "cycle"]


def page(sub) -> str:
    return reverse("billing-subscription", args=[sub.pk])


def assert_plain(text: str) -> None:
    visible = re.sub(r"<[^>]+>", " ", text)
    for code in INTERNAL:
        assert code not in visible, f"internal code {code!r} on the customer page"


def test_grace_page_in_plain_words(client, customer_a, grace_scene):
    client.force_login(customer_a)
    response = client.get(page(grace_scene.sub))
    text = response.content.decode()
    assert response.status_code == 200
    assert '<meta name="viewport"' in text
    ends = reload(grace_scene.cycle).grace_expires_at
    assert f"Read and export only until {ends.day} {ends:%B}; after that suspended" in text
    assert "$49.00" in text and "Contact support" in text
    # The provider owns retries under this policy: the customer pays now, a local retry is not offered.
    assert "Pay $49.00 now" in text and "Retry payment now" not in text
    assert_plain(text)


def test_exception_shows_full_access_until_its_date(client, customer_a, grace_scene, agent):
    expires = trusted_now() + timedelta(days=6)
    assert cycle_grant_exception(cycle_pk=grace_scene.cycle.pk, user=agent, expires_at=expires, reason="r",
                                 ticket="T")
    client.force_login(customer_a)
    text = client.get(page(grace_scene.sub)).content.decode()
    assert f"Full access until {expires.day} {expires:%B}; after that read and export only" in text
    assert_plain(text)


def test_retry_now_is_refused_with_the_plain_explanation(client, customer_a, grace_scene):
    client.force_login(customer_a)
    url = reverse("billing-retry-now", args=[grace_scene.sub.pk, grace_scene.cycle.pk])
    text = client.post(url, follow=True).content.decode()
    assert "retried automatically by our payment provider" in text  # this policy's provider owns retries
    assert_plain(text)
    assert reload(grace_scene.cycle).state == "GRACE_ACTIVE"


def test_a_customer_gets_404_for_anyone_elses_subscription(client, customer_a, customer_b, grace_scene,
                                                           conflict_scene):
    client.force_login(customer_a)
    assert client.get(page(grace_scene.sub)).status_code == 200
    assert client.get(page(conflict_scene.sub)).status_code == 404
    other = reverse("billing-retry-now", args=[conflict_scene.sub.pk, conflict_scene.cycle.pk])
    assert client.post(other).status_code == 404
    mixed = reverse("billing-retry-now", args=[grace_scene.sub.pk, conflict_scene.cycle.pk])
    assert client.post(mixed).status_code == 404


def test_anonymous_visitors_are_sent_to_the_login(client, grace_scene):
    response = client.get(page(grace_scene.sub))
    assert response.status_code == 302 and response["Location"].startswith(reverse("billing-login"))


def test_every_post_needs_the_csrf_token(customer_a, grace_scene, agent):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(customer_a)
    retry = reverse("billing-retry-now", args=[grace_scene.sub.pk, grace_scene.cycle.pk])
    assert strict.post(retry).status_code == 403
    assert strict.post(reverse("billing-logout")).status_code == 403
    login = Client(enforce_csrf_checks=True)
    assert login.post(reverse("billing-login"), {"username": "customer-a", "password": PASSWORD}).status_code == 403
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(agent)
    grant = reverse("admin:subscriptions_subscription_console_cycle",
                    args=[grace_scene.sub.pk, "grant_exception", grace_scene.cycle.pk])
    expires = (trusted_now() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    assert staff.post(grant, {"expires_at": expires, "profile": "FULL", "reason": "r", "ticket": "T"}
                      ).status_code == 403
    assert reload(grace_scene.cycle).state == "GRACE_ACTIVE"
