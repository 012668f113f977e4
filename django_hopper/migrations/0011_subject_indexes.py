from django.db import migrations, models

import django_hopper.migration_operations


class Migration(migrations.Migration):
    # The live index is built concurrently (no write waits for it), outside a
    # transaction; history's is declared on the partitioned parent only and
    # built per partition by the leader's HistoryIndexer.
    atomic = False

    dependencies = [
        ('django_hopper', '0010_subject_erasure'),
    ]

    operations = [
        django_hopper.migration_operations.AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('subject__isnull', False)), fields=['subject'], name='hopper_job_subject'),
        ),
        django_hopper.migration_operations.AddHistoryIndex(
            model_name='jobhistory',
            index=models.Index(condition=models.Q(('subject__isnull', False)), fields=['subject'], name='hopper_history_subject'),
        ),
    ]
