"""`manage.py usage_mark_invoiced in_… RECORD_ID [RECORD_ID …]`: the provider invoiced these usage
records. Once, all or nothing (subscriptions.usage.usage_mark_invoiced); a repeat for the same
invoice changes nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from subscriptions.usage import UsageRefused, usage_mark_invoiced


class Command(BaseCommand):
    help = "Mark usage records as billed by a provider invoice (once; all or nothing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("provider_invoice_id", help="the provider's invoice id (in_…)")
        parser.add_argument("record_ids", nargs="+", type=int, metavar="RECORD_ID", help="usage record ids")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            marked = usage_mark_invoiced(record_pks=options["record_ids"],
                                         provider_invoice_id=options["provider_invoice_id"])
        except UsageRefused as refused:
            raise CommandError(f"{refused.code}: {refused.detail}; nothing was changed") from None
        self.stdout.write(f"Marked {marked} usage record(s) invoiced on {options['provider_invoice_id'].strip()}; "
                          f"{len(set(options['record_ids'])) - marked} already were.")
