from subscriptions.providers.labels import dashboard_url, id_tail, provider_label, provider_summary, provider_terms


def test_labels_and_unknown_names_as_they_are():
    assert provider_label("stripe") == "Stripe"
    assert provider_label("alipay") == "Alipay"
    assert provider_label("paddle") == "paddle"
    assert provider_terms("paddle").label == "paddle"
    assert provider_summary("alipay", "2021000000000001") == {
        "name": "alipay", "label": "Alipay", "account": "2021000000000001"}


def test_only_stripe_has_dashboard_links():
    assert dashboard_url("stripe", "invoice", "in_1") == "https://dashboard.stripe.com/invoices/in_1"
    assert dashboard_url("stripe", "subscription", "sub_1") == "https://dashboard.stripe.com/subscriptions/sub_1"
    assert dashboard_url("alipay", "subscription", "20215603000000000001") == ""
    assert dashboard_url("paddle", "invoice", "x") == ""
    assert dashboard_url("stripe", "invoice", "") == ""


def test_agreement_tail():
    assert id_tail("20215603000000001234") == "\u20261234"
    assert id_tail("12") == "12"
