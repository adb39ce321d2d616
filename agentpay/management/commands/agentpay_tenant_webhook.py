"""Set (or disable) a tenant's callback URL; a new endpoint's signing secret is shown once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from agentpay.models import Tenant
from agentpay.services.webhooks import WebhookRefused, tenant_webhook_configure, tenant_webhook_disable


class Command(BaseCommand):
    help = "Set a tenant's webhook URL (tnt_… id or exact name); a new or rotated secret is shown once."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("tenant")
        parser.add_argument("url", nargs="?", default="")
        parser.add_argument("--rotate-secret", action="store_true")
        parser.add_argument("--disable", action="store_true", help="stop sending callbacks to this tenant")

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        ref = options["tenant"]
        tenant = Tenant.objects.filter(tenant_id=ref).first() or Tenant.objects.filter(name=ref).first()
        if tenant is None:
            raise CommandError(f"no tenant {ref!r}")
        if options["disable"]:
            tenant_webhook_disable(tenant=tenant)
            self.stdout.write(f"callbacks to {tenant.tenant_id} disabled")
            return
        if not options["url"]:
            raise CommandError("give the callback URL (or --disable)")
        try:
            endpoint, secret = tenant_webhook_configure(tenant=tenant, url=options["url"],
                                                        rotate_secret=options["rotate_secret"])
        except WebhookRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"tenant {tenant.tenant_id} ({tenant.name}) → {endpoint.url}")
        if secret:
            self.stdout.write(secret)
            self.stderr.write("This is the only time the signing secret is shown; store it now.")
