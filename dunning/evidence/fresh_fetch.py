"""A fresh provider fetch of a cycle's invoice, stored as a receipt before anything cites it."""

from __future__ import annotations

from dunning.acceptance.inputs import Evidence
from dunning.clock import trusted_now
from dunning.evidence.next_edge import invoice_update
from dunning.evidence.receipts import receipt_record
from dunning.models import DunningCycle, ProviderReceipt
from subscriptions.providers.base import PaymentProvider, ProviderInvoice
from subscriptions.providers.registry import get_provider


def invoice_fetch_fresh(cycle: DunningCycle, provider: PaymentProvider | None = None
                        ) -> tuple[ProviderInvoice, ProviderReceipt]:
    """Fetch the cycle's invoice now. Raises ProviderError when the provider does not answer."""
    provider = provider or get_provider(cycle.invoice.provider)
    inv = provider.fetch_invoice(cycle.invoice.provider_invoice_id)
    receipt = receipt_record(object_type="invoice", body=inv.raw, invoice=cycle.invoice, account=inv.account,
                             fetched_at=trusted_now())
    return inv, receipt


def receipt_evidence(inv: ProviderInvoice, receipt: ProviderReceipt) -> Evidence:
    return Evidence(receipt=receipt, invoice=invoice_update(inv))
