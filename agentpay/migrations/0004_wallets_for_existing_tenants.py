"""Every tenant has a wallet from its set-up on (services.tenants.tenant_create); tenants made
before that get an empty one in the default currency now, so none is surprised by its first call."""

from django.conf import settings
from django.db import migrations


def wallets_for_tenants(apps, schema_editor):
    Tenant = apps.get_model("agentpay", "Tenant")
    LedgerAccount = apps.get_model("agentpay", "LedgerAccount")
    with_wallet = LedgerAccount.objects.filter(kind="wallet").values("tenant_id")
    LedgerAccount.objects.bulk_create(
        [LedgerAccount(kind="wallet", tenant=t, currency=settings.AGENTPAY_DEFAULT_CURRENCY)
         for t in Tenant.objects.exclude(pk__in=with_wallet)], ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [("agentpay", "0003_wallet_frozen_route_fences")]
    operations = [migrations.RunPython(wallets_for_tenants, migrations.RunPython.noop)]
