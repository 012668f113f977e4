from django.db import migrations, models


class Migration(migrations.Migration):
    # A nullable column without a default: a catalog change, no table rewrite (on
    # PostgreSQL the partitioned history's partitions inherit it). Code built for
    # schema 14 marks the jobs it claims ahead of its free slots; the rescue of
    # that code counts such a job as an admission miss, not a charged attempt.

    dependencies = [
        ('django_hopper', '0013_resumable_run_proxies'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='claimed_ahead_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='jobhistory',
            name='claimed_ahead_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
