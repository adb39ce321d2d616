"""System accounts are sharded (wallet-ledger-spec §3.1): one (kind, currency) is up to
AGENTPAY_SYSTEM_ACCOUNT_SHARDS rows, so every hold and capture no longer updates one revenue row.
Existing accounts are shard 0; a wallet's shard is always 0."""

from django.db import migrations, models
from django.db.models import Q


class Migration(migrations.Migration):
    dependencies = [("agentpay", "0008_tenant_webhooks")]

    operations = [
        migrations.AddField(model_name="ledgeraccount", name="shard",
                            field=models.PositiveSmallIntegerField(default=0)),
        migrations.RemoveConstraint(model_name="ledgeraccount", name="one_system_account_per_kind_currency"),
        migrations.AddConstraint(
            model_name="ledgeraccount",
            constraint=models.UniqueConstraint(fields=["kind", "currency", "shard"], condition=~Q(kind="wallet"),
                                               name="one_system_account_per_kind_currency_shard")),
        migrations.AddConstraint(
            model_name="ledgeraccount",
            constraint=models.CheckConstraint(condition=~Q(kind="wallet") | Q(shard=0), name="wallet_shard_zero")),
    ]
