"""The provider-hosted invoice page (``hosted_invoice_url``, ``/i/<account>/<invoice>``): the
simulator's stand-in for Stripe's page where a customer saves a new card or pays the invoice.

``GET`` shows the amount due and the card on file; ``POST …/card`` saves a new card as the
default for invoices (``update_payment_method``: ``payment_method.attached``,
``setup_intent.succeeded``, ``customer.updated``); ``POST …/pay`` pays the invoice with a new
card (``customer_pays``). Plain HTML forms, no authentication: loopback only.
"""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, quote

from tests.verification.fake_stripe.api import Request, Response
from tests.verification.fake_stripe.core import SimulatorCore
from tests.verification.fake_stripe.errors import SimError

PAGE = re.compile(r"^/i/(?P<account>[^/]+)/(?P<invoice>[^/]+)(?:/(?P<action>card|pay))?/?$")
SYMBOLS = {"usd": "$", "eur": "€", "gbp": "£"}


def _money(amount: int, currency: str) -> str:
    symbol = SYMBOLS.get(currency.lower())
    value = f"{amount / 100:,.2f}"
    return f"{symbol}{value}" if symbol else f"{value} {currency.upper()}"


class HostedPages:
    def __init__(self, sim: SimulatorCore) -> None:
        self.sim = sim

    def handle(self, req: Request) -> Response:
        match = PAGE.match(req.path)
        if match is None or match["account"] != self.sim.account:
            return self._page(404, "Page not found", "<p>There is no invoice at this address.</p>")
        invoice_id, action, method = match["invoice"], match["action"], req.method.upper()
        inv = self.sim.get(invoice_id)
        if inv is None or inv.get("object") != "invoice":
            return self._page(404, "Invoice not found", "<p>There is no invoice at this address.</p>")
        if action is None and method == "GET":
            return self._invoice_page(inv, note=(parse_qs(req.query).get("note") or [""])[0])
        if action is not None and method == "POST":
            return self._act(inv, action)
        return self._page(405, "Not allowed", "<p>This page does not accept that request.</p>")

    def _act(self, inv: dict, action: str) -> Response:
        """Do it, then send the browser back to the page (a reload does not do it twice)."""
        try:
            if action == "card":
                self.sim.update_payment_method(inv["customer"], "ok")
                note = "Your new card is saved. It will be used for this invoice and the next ones."
            else:
                result = self.sim.customer_pays(inv["id"], update_card=True)
                note = "Payment received. Thank you." if result.ok else "The payment did not go through."
        except SimError as exc:
            note = exc.message
        location = f"/i/{self.sim.account}/{inv['id']}?note={quote(note)}"
        return Response(303, b"", {"Location": location, "Content-Type": "text/html; charset=utf-8"})

    def _invoice_page(self, inv: dict, note: str = "") -> Response:
        customer = self.sim.get(inv["customer"]) or {}
        due = 0 if inv["status"] in ("paid", "void") else inv["amount_due"] - inv["amount_paid"]
        base = f"/i/{self.sim.account}/{inv['id']}"
        card = "a card that was declined" if customer.get("card", "ok") != "ok" else "a working card"
        body = [f'<p class="amount" id="amount-due">{html.escape(_money(due, inv["currency"]))}</p>',
                f'<p>Invoice {html.escape(inv.get("number") or inv["id"])} · {html.escape(inv["status"])}</p>']
        if note:
            body.append(f'<p class="note" id="hosted-note">{html.escape(note)}</p>')
        if inv["status"] in ("open", "uncollectible"):
            body.append(f"<p>On file: {card}.</p>")
            body.append(f'<form method="post" action="{base}/card"><button id="save-card" type="submit">'
                        "Save a new card</button></form>")
            amount = html.escape(_money(due, inv["currency"]))
            body.append(f'<form method="post" action="{base}/pay"><button id="pay-invoice" class="secondary" '
                        f'type="submit">Pay {amount} with a new card</button></form>')
        return self._page(200, "Simulated provider — invoice", "\n".join(body))

    def _page(self, status: int, title: str, body: str) -> Response:
        text = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
                '<meta name="viewport" content="width=device-width, initial-scale=1"><style>'
                "body{font-family:system-ui,sans-serif;background:#f2f4f8;margin:0;color:#1a1f36}"
                "main{max-width:26em;margin:2em auto;background:#fff;padding:1.5em;border-radius:10px;"
                "box-shadow:0 2px 8px rgba(0,0,0,.1)}.amount{font-size:2em;font-weight:700;margin:.2em 0}"
                "button{font:inherit;padding:.6em 1em;border:0;border-radius:6px;background:#635bff;color:#fff;"
                "margin:.3em 0;cursor:pointer}button.secondary{background:#e3e8ee;color:#1a1f36}"
                ".note{background:#e6f4ea;padding:.6em;border-radius:6px}.sim{color:#697386;font-size:.85em}"
                f"</style></head><body><main><h1>{html.escape(title)}</h1>{body}"
                '<p class="sim">Stripe simulator: a test page, no real card is used.</p></main></body></html>')
        return Response(status, text.encode("utf-8"), {"Content-Type": "text/html; charset=utf-8"})
