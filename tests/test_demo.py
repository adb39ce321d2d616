from django.core.management import call_command

from dunning.acceptance.settlement import compute_aggregate
from dunning.models import DunningCycle, ProviderReceipt, TransitionReceipt
from subscriptions.models import Subscription


def test_demo_data_set_has_the_promised_states_and_is_idempotent(db, capsys):
    call_command("load_demo")
    call_command("load_demo", "--no-password-reset")
    out = capsys.readouterr().out
    assert out.count("Admin login") == 1
    assert "sub_demo_restricted    rita@example.com       SUSPENDED" in out
    subs = {s.provider_subscription_id: s for s in Subscription.objects.all()}
    assert subs["sub_demo_healthy"].entitlement_profile == "FULL"
    assert subs["sub_demo_grace"].entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    restricted = subs["sub_demo_restricted"]
    assert restricted.entitlement_profile == "SUSPENDED"
    assert list(restricted.invoices.values_list("status", flat=True)) == ["open", "open"]
    assert set(restricted.cycles.values_list("state", flat=True)) == {"RESTRICTED"}
    assert DunningCycle.objects.filter(subscription=subs["sub_demo_conflict"], state="EVIDENCE_CONFLICT").exists()
    alipay = subs["20261101000000000001"]
    assert (alipay.provider, alipay.policy.name, alipay.entitlement_profile) == ("alipay", "alipay-monthly", "LIMITED")
    assert DunningCycle.objects.get(subscription=alipay).state == "RETRY_SCHEDULED"
    assert "20261101000000000001   li.wei@example.com     LIMITED" in out and "Alipay" in out
    annual = subs["sub_demo_annual"]
    assert annual.policy.identity == "annual-no-grace@1" and annual.entitlement_profile == "SUSPENDED"
    assert annual.cycles.get().customer_action_required
    for sub in subs.values():
        assert sub.outstanding_cycle_root == compute_aggregate(sub, None)[0]
    assert not TransitionReceipt.objects.filter(accepted=False).exists()
    assert all(r.body.get("demo") for r in ProviderReceipt.objects.all())


def test_demo_prints_role_and_customer_logins_that_work(db, capsys, client):
    import re

    call_command("load_demo")
    out = capsys.readouterr().out
    logins = dict(re.findall(r"username '(\w+)'  password '([^']+)'", out))
    assert set(logins) == {"admin", "agent", "lead", "rita"}
    assert client.login(username="rita", password=logins["rita"])
    sub = Subscription.objects.get(provider_subscription_id="sub_demo_restricted")
    page = client.get(f"/billing/{sub.pk}/")
    assert page.status_code == 200 and "Amount due" in page.content.decode()
    other = Subscription.objects.get(provider_subscription_id="sub_demo_healthy")
    assert client.get(f"/billing/{other.pk}/").status_code == 404
    client.logout()
    assert client.login(username="agent", password=logins["agent"])
    assert client.get(f"/admin/subscriptions/subscription/{sub.pk}/change/").status_code == 200
