from django.db import migrations, models


class Migration(migrations.Migration):
    # A nullable column without a default: a catalog change, no table rewrite.

    dependencies = [
        ('django_hopper', '0006_keyed_claim_window'),
    ]

    operations = [
        migrations.AddField(
            model_name='client',
            name='completed',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
