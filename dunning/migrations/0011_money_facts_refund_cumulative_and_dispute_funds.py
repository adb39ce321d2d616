"""Money facts add up (issue 15, item 6): a refund fact holds the increment refunded and the
charge's cumulative refunded total as its evidence (`cumulative_amount`); dispute funds
withdrawn and reinstated are facts of their own.

Existing REFUNDED rows stay as written (facts are append-only): their `cumulative_amount` is
null and their `amount` is the cumulative total the receipt showed, which is how the
acceptance service and the reconciliation read a refund fact without `cumulative_amount`."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dunning', '0010_event_reprocessing_and_alert_handling'),
    ]

    operations = [
        migrations.AddField(
            model_name='monetaryfact',
            name='cumulative_amount',
            field=models.BigIntegerField(blank=True, help_text="REFUNDED: the charge's cumulative refunded total on the receipt this increment was derived from.", null=True),
        ),
        migrations.AlterField(
            model_name='monetaryfact',
            name='kind',
            field=models.CharField(choices=[('PAYMENT_FAILED', 'Payment Failed'), ('PAYMENT_SUCCEEDED', 'Payment Succeeded'), ('INVOICE_VOIDED', 'Invoice Voided'), ('MARKED_UNCOLLECTIBLE', 'Marked Uncollectible'), ('REFUNDED', 'Refunded'), ('DISPUTE_OPENED', 'Dispute Opened'), ('DISPUTE_WON', 'Dispute Won'), ('DISPUTE_LOST', 'Dispute Lost'), ('DISPUTE_FUNDS_WITHDRAWN', 'Dispute Funds Withdrawn'), ('DISPUTE_FUNDS_REINSTATED', 'Dispute Funds Reinstated')], max_length=32),
        ),
    ]
