from datetime import UTC, datetime
from pathlib import Path

import pytest

from config.celery import app as celery_app
from dunning.policy.publishing import policy_publish
from tests.support.builders import make_policy
from tests.verification.fake_stripe import StripeSimulator

# The page tests' browser fixtures (`browser`, `new_page`), the on-chain tests' local chain
# (`chain_node`, `chain`: anvil, issue 18) and the Alipay simulator (`alipay_sim`, `alipay_keys`,
# `alipay_notify_receiver`: issue 20), defined once for every folder.
pytest_plugins = ["tests.support.browser", "tests.support.chain", "tests.support.alipay"]


LONG_FIRST = ("tests/simulation/test_ci_seeds.py::",)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The simulation seeds (about a minute each) go first, so two workers share them out instead
    of one finishing them alone at the end. They are plain database tests, the group pytest-django
    already put first, so its order (transactional tests after the others) still holds."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


@pytest.fixture(autouse=True)
def celery_in_process():
    """Tasks run in the test's process unless a test starts a real worker itself."""
    previous = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = previous


@pytest.fixture(autouse=True)
def application_clock(settings):
    """Tests move the application's time with time-machine, which cannot move PostgreSQL's clock,
    so every policy reads the application clock here; tests/acceptance/test_trusted_clock.py checks the
    DATABASE clock itself with this override removed."""
    settings.DUNNING_CLOCK_OVERRIDE = "APPLICATION"


@pytest.fixture(autouse=True)
def provider_on_loopback_only(settings):
    """No test may reach a real provider: without the simulator fixture (which points the SDK at
    itself) every provider call goes to a closed loopback port and fails at once."""
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"
    settings.ALIPAY_GATEWAY_URL = "http://127.0.0.1:9/gateway.do"


@pytest.fixture
def policy(db):
    return make_policy()


@pytest.fixture
def staff(db, django_user_model):
    return django_user_model.objects.create_user("agent", password="x", is_staff=True)


SHIPPED_POLICIES = ("standard-monthly", "annual-no-grace", "local-retry-monthly", "default-catch-all")


@pytest.fixture
def shipped_policies(db):
    # Published well before any clock a test moves to, so a test's own newer release stays the
    # newest whatever today's date is (the selection orders by published_at).
    shipped_at = datetime(2026, 1, 1, tzinfo=UTC)
    return {name: policy_publish(text=(Path("dunning/policy/shipped") / f"{name}.yaml").read_text(), now=shipped_at)[0]
            for name in SHIPPED_POLICIES}


@pytest.fixture(params=["current"])
def api_shape(request):
    return request.param


@pytest.fixture
def sim(settings, shipped_policies, client, django_capture_on_commit_callbacks, api_shape):
    """The Stripe-compatible simulator on loopback; the app's adapter talks to it with the real SDK,
    and its webhooks are posted to the app's webhook view, processed in process. Parametrize
    `api_shape` with "legacy" to run a test with both sides pinned before 2025-03-31."""
    version = "2024-06-20" if api_shape == "legacy" else "2026-10-28.endive"

    def post_to_app(body: bytes, headers: dict[str, str]) -> int:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post("/webhooks/stripe/", data=body, content_type="application/json",
                                   HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
        return response.status_code

    simulator = StripeSimulator(account="acct_demo", webhook_secrets=["whsec_local"], sink=post_to_app,
                                auto_deliver=False, webhook_api_version=version)
    settings.STRIPE_API_BASE = simulator.start()
    settings.STRIPE_WEBHOOK_SECRETS = ["whsec_local"]
    settings.STRIPE_ACCOUNT = "acct_demo"
    settings.STRIPE_TIMEOUT_SECONDS = 1.5
    settings.STRIPE_API_VERSION = "2024-06-20" if api_shape == "legacy" else ""
    yield simulator
    simulator.stop()
