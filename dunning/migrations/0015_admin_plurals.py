"""The admin says "incident switches" and "notification deliveries", not "switchs" and "deliverys"."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('dunning', '0014_merge_operations'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='historicalincidentswitch',
            options={'get_latest_by': ('history_date', 'history_id'), 'ordering': ('-history_date', '-history_id'), 'verbose_name': 'historical incident switch', 'verbose_name_plural': 'historical incident switches'},
        ),
        migrations.AlterModelOptions(
            name='incidentswitch',
            options={'verbose_name_plural': 'incident switches'},
        ),
        migrations.AlterModelOptions(
            name='notificationdelivery',
            options={'verbose_name_plural': 'notification deliveries'},
        ),
    ]
