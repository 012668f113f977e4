from django.db import migrations, models


class Migration(migrations.Migration):
    # Nullable columns without a default: a catalog change, no table rewrite (on
    # PostgreSQL the partitioned history's partitions inherit them).

    dependencies = [
        ('django_hopper', '0007_client_completed'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='admission_misses',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='lease_began_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='jobhistory',
            name='admission_misses',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='jobhistory',
            name='lease_began_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
