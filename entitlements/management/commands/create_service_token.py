"""`manage.py create_service_token NAME [--scope entitlements:read] [--provider-account acct_…]
[--cohort NAME]`: prints the token once. Only its SHA-256 digest is stored."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from entitlements.api.auth import SCOPE_ENTITLEMENTS_READ, TOKEN_SCOPES
from entitlements.api.tokens import TokenError, service_token_create


class Command(BaseCommand):
    help = "Create a service token for a runtime service and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--scope", action="append", dest="scopes", choices=TOKEN_SCOPES,
                            help=f"repeatable; default {SCOPE_ENTITLEMENTS_READ}")
        parser.add_argument("--provider-account", default="", help="restrict to one provider account")
        parser.add_argument("--cohort", default="", help="restrict to one cohort")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            token, raw = service_token_create(
                name=options["name"], scopes=options["scopes"] or [SCOPE_ENTITLEMENTS_READ],
                provider_account=options["provider_account"], cohort=options["cohort"],
            )
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
        self.stderr.write(f"Created {token.name} with scopes {', '.join(token.scopes)}. "
                          "Store the token now: it is not shown again.")
