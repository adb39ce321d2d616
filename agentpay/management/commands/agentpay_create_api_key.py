"""Create a tenant API key and print it once (only its digest is stored)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from agentpay.api.auth import tenant_api_key_create
from agentpay.models import Tenant
from agentpay.services.tenants import tenant_create


class Command(BaseCommand):
    help = "Create an API key for a tenant (tnt_… id or exact name); the key is shown once."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("tenant")
        parser.add_argument("--label", default="")
        parser.add_argument("--create-tenant", action="store_true",
                            help="create the tenant by that name if missing, with an empty wallet")
        parser.add_argument("--currency", default="", help="the new tenant's wallet currency (default: "
                                                          "AGENTPAY_DEFAULT_CURRENCY)")

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        ref = options["tenant"]
        tenant = Tenant.objects.filter(tenant_id=ref).first() or Tenant.objects.filter(name=ref).first()
        if tenant is None:
            if not options["create_tenant"]:
                raise CommandError(f"no tenant {ref!r} (use --create-tenant to create it)")
            tenant = tenant_create(name=ref, currency=options["currency"] or None)
        key, raw = tenant_api_key_create(tenant=tenant, label=options["label"])
        self.stdout.write(f"tenant {tenant.tenant_id} ({tenant.name}), key {key.key_prefix}…")
        self.stdout.write(raw)
        self.stderr.write("This is the only time the key is shown; store it now.")
