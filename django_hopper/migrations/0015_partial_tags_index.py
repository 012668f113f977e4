from django.db import migrations

import django_hopper.migration_operations

# The tags GIN indexes cover only tagged jobs. Most jobs have no tags, and a
# claim or finalize changes `state` (which partial indexes filter on), so its
# update is never HOT and writes an entry into every index of the row: with a
# full GIN that is a GIN insert per claim, per finalize and per history row,
# for an empty array. The tag filters repeat the predicate, so they use it.
TAGGED = "USING gin (tags) WHERE tags <> '[]'::jsonb"
EVERY = "USING gin (tags)"


class Migration(migrations.Migration):
    # History first: its new index is declared on the partitioned parent only
    # (a catalog change; the leader's HistoryIndexer builds it per partition)
    # and its old one dropped, each under a brief lock that makes writes to
    # history wait (a partitioned index can be neither built nor dropped
    # concurrently). Then the live index is built, and the old one dropped,
    # concurrently (no write waits for either), outside a transaction.
    atomic = False

    dependencies = [
        ('django_hopper', '0014_claimed_ahead'),
    ]

    operations = [
        django_hopper.migration_operations.IndexSQL(
            feature='supports_json_indexes',
            name='hopper_history_tags',
            table='hopper_job_history',
            definition=TAGGED,
            history=True,
        ),
        django_hopper.migration_operations.IndexSQL(
            feature='supports_json_indexes',
            name='hopper_history_tags_gin',
            table='hopper_job_history',
            definition=EVERY,
            drop=True,
            history=True,
        ),
        django_hopper.migration_operations.IndexSQL(
            feature='supports_json_indexes',
            name='hopper_job_tags',
            table='hopper_job',
            definition=TAGGED,
        ),
        django_hopper.migration_operations.IndexSQL(
            feature='supports_json_indexes',
            name='hopper_job_tags_gin',
            table='hopper_job',
            definition=EVERY,
            drop=True,
        ),
    ]
