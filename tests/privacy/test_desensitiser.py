"""dunning.privacy: each kind of field is hashed or masked, deterministically and under the key;
what the product decides on is untouched."""

from __future__ import annotations

import copy
import json
import time

import pytest

from dunning.privacy import REDACTED, desensitise, desensitise_body, keyed_hash, mask_text

EMAIL = "Jane.Doe@Example.com"


def charge() -> dict:
    """A Stripe charge as the API returns it, PII included."""
    return {
        "id": "ch_3Pabc", "object": "charge", "amount": 4900, "amount_captured": 4900, "amount_refunded": 0,
        "currency": "usd", "status": "succeeded", "paid": True, "created": 1764750000, "customer": "cus_Q1",
        "invoice": "in_1Qxyz", "payment_intent": "pi_3Pabc", "payment_method": "pm_1Q", "livemode": False,
        "receipt_email": EMAIL, "description": "Renewal for jane.doe@example.com",
        "billing_details": {"email": EMAIL, "name": "Jane Doe", "phone": "+1 415 555 0100",
                            "address": {"line1": "1 Main St", "line2": None, "city": "Springfield",
                                        "postal_code": "62704", "state": "IL", "country": "US"}},
        "shipping": {"name": "Jane Doe", "phone": "+1 415 555 0100", "carrier": "UPS", "tracking_number": "1Z999",
                     "address": {"line1": "2 Side Rd", "city": "Springfield", "country": "US"}},
        "payment_method_details": {"type": "card", "card": {
            "brand": "visa", "last4": "4242", "fingerprint": "Xt5EWLLDS7FJjR1c", "exp_month": 12, "exp_year": 2030,
            "country": "US", "funding": "credit", "checks": {"cvc_check": "pass"}}},
        "outcome": {"network_status": "approved_by_network", "type": "authorized", "seller_message": "ok"},
        "metadata": {"note": "card 4242 4242 4242 4242 on file"},
    }


def invoice() -> dict:
    return {"id": "in_1Qxyz", "object": "invoice", "status": "open", "amount_due": 4900, "amount_paid": 0,
            "currency": "usd", "customer": "cus_Q1", "subscription": "sub_Q1", "attempt_count": 1,
            "next_payment_attempt": 1764836400, "customer_email": EMAIL, "customer_name": "Jane Doe",
            "customer_phone": "+44 20 7946 0958", "customer_address": {"line1": "1 Main St", "country": "GB"},
            "customer_shipping": {"name": "Jane Doe", "address": {"city": "London", "country": "GB"}},
            "lines": {"object": "list", "data": [{"id": "il_1", "object": "line_item", "amount": 4900,
                                                  "price": {"id": "price_monthly_pro", "object": "price",
                                                            "product": {"id": "prod_1", "object": "product",
                                                                        "name": "Pro"}}}]}}


def test_emails_and_fingerprints_are_keyed_hashes_equal_for_equal_values():
    masked = desensitise(charge())
    email_hash = masked["receipt_email"]
    assert email_hash.startswith("hmac:") and len(email_hash) == len("hmac:") + 20
    assert masked["billing_details"]["email"] == email_hash, "one mailbox, one hash, whatever the field"
    assert keyed_hash("jane.doe@example.com", "email") == email_hash, "an email's case does not matter"
    fingerprint = masked["payment_method_details"]["card"]["fingerprint"]
    assert fingerprint.startswith("hmac:") and fingerprint != keyed_hash("Xt5EWLLDS7FJjR1c", "email")
    assert desensitise(invoice())["customer_email"] == email_hash


def test_names_phones_addresses_and_card_digits_are_masked():
    masked = desensitise(charge())
    details = masked["billing_details"]
    assert details["name"] == "J*** D***" and details["phone"] == REDACTED
    assert details["address"] == {"line1": REDACTED, "line2": None, "city": REDACTED, "postal_code": REDACTED,
                                  "state": REDACTED, "country": "US"}, "null stays null; the country stays"
    assert masked["shipping"]["name"] == "J*** D***" and masked["shipping"]["tracking_number"] == REDACTED
    assert masked["shipping"]["address"]["line1"] == REDACTED and masked["shipping"]["carrier"] == "UPS"
    card = masked["payment_method_details"]["card"]
    assert card["last4"] == "**** 4242"
    assert card["exp_month"] == card["exp_year"] == REDACTED
    assert (card["brand"], card["country"], card["funding"]) == ("visa", "US", "credit")
    inv = desensitise(invoice())
    assert (inv["customer_name"], inv["customer_phone"]) == ("J*** D***", REDACTED)
    assert inv["customer_address"] == {"line1": REDACTED, "country": "GB"}
    assert inv["customer_shipping"]["name"] == "J*** D***"


def test_free_text_emails_and_card_numbers_are_masked():
    masked = desensitise(charge())
    assert masked["description"] == "Renewal for j***@example.com"
    assert masked["metadata"]["note"] == "card **** 4242 on file"
    assert mask_text("ref 4242424242424241 is no card (Luhn)") == "ref 4242424242424241 is no card (Luhn)"
    assert mask_text("in_1234567890123456 stays") == "in_1234567890123456 stays", "ids are not card numbers"


def test_what_the_product_decides_on_is_untouched():
    raw, masked = charge(), desensitise(charge())
    for key in ("id", "object", "amount", "amount_captured", "amount_refunded", "currency", "status", "paid",
                "created", "customer", "invoice", "payment_intent", "payment_method", "livemode", "outcome"):
        assert masked[key] == raw[key], key
    inv, masked_inv = invoice(), desensitise(invoice())
    for key in ("id", "status", "amount_due", "amount_paid", "currency", "customer", "subscription",
                "attempt_count", "next_payment_attempt", "lines"):
        assert masked_inv[key] == inv[key], key
    assert masked_inv["lines"]["data"][0]["price"]["product"]["name"] == "Pro", "a product's name is no one's"


def test_a_customer_object_and_its_expanded_children():
    customer = {"id": "cus_Q1", "object": "customer", "email": EMAIL, "name": "Jane Doe", "phone": "+1 555",
                "address": {"line1": "x", "country": "DE"}, "invoice_settings": {"default_payment_method": "pm_1"},
                "subscriptions": {"object": "list", "data": [{"id": "sub_1", "object": "subscription",
                                  "plan": {"object": "plan", "name": "Pro monthly"}}]}}
    masked = desensitise(customer)
    assert masked["name"] == "J*** D***" and masked["email"].startswith("hmac:")
    assert masked["invoice_settings"] == customer["invoice_settings"]
    assert masked["subscriptions"]["data"][0]["plan"]["name"] == "Pro monthly"


def test_deterministic_idempotent_and_the_input_is_not_changed():
    raw = charge()
    before = copy.deepcopy(raw)
    once = desensitise(raw)
    assert raw == before, "the caller's document is not modified"
    assert desensitise(charge()) == once, "the same input gives the same output"
    assert desensitise(once) == once, "masking a masked document changes nothing"
    body = json.dumps(charge()).encode()
    assert desensitise_body(body) == desensitise_body(body) == desensitise_body(desensitise_body(body))


def test_the_hash_is_keyed(settings):
    first = desensitise(charge())
    settings.PRIVACY_HASH_KEY = "another key"
    second = desensitise(charge())
    assert first["receipt_email"] != second["receipt_email"]
    assert (first["payment_method_details"]["card"]["fingerprint"]
            != second["payment_method_details"]["card"]["fingerprint"])
    assert first["billing_details"]["name"] == second["billing_details"]["name"], "masks need no key"


def test_no_key_refuses_instead_of_storing_unkeyed_hashes(settings):
    settings.PRIVACY_HASH_KEY = ""
    with pytest.raises(RuntimeError, match="PRIVACY_HASH_KEY"):
        desensitise(charge())


def test_bodies_without_pii_are_kept_byte_for_byte():
    body = b'{"id": "evt_1",  "type": "invoice.paid", "data": {"object": {"id": "in_1"}}}'
    assert desensitise_body(body) == body


@pytest.mark.parametrize("body", [
    b'{"id": "evt_cut", "data": {"object": {"customer_email": "jane@example.com", "customer_name": "Jane Doe", "la',
    b'not json at all: write to jane@example.com, card 4242-4242-4242-4242',
    b'[' * 300 + b'{"email": "jane@example.com"}' + b']' * 300,
    b'\xff\xfe{"email": "jane@example.com"}',
])
def test_bodies_that_do_not_parse_are_masked_textually(body):
    stored = desensitise_body(body)
    assert b"jane@example.com" not in stored and b"Jane Doe" not in stored and b"4242-4242-4242-4242" not in stored
    assert desensitise_body(stored) == stored


def test_a_hostile_body_of_one_long_token_is_masked_in_linear_time():

    body = b'{"email": "' + b"a" * 400_000 + b"@" + b"b" * 100_000 + b'", "x": '  # unsigned, cut, not JSON
    started = time.monotonic()
    stored = desensitise_body(body)
    assert time.monotonic() - started < 5, "no quadratic regex on a long token"
    assert stored.startswith(b'{"email": "hmac:')
    text = ("a" * 400_000 + "@!").encode()  # every start of the run reaches the @ and fails there
    started = time.monotonic()
    desensitise_body(text)
    assert time.monotonic() - started < 5
