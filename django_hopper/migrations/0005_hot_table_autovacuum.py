"""Vacuum the hot live tables far more often than PostgreSQL's defaults.

The live job table churns at the job rate: every job is inserted, updated
(claimed) and deleted (finalized), and each leaves a dead index entry that the
claim walks past until a vacuum removes it. The default thresholds (20% of the
table) are meant for tables that grow; a queue table stays small and is
rewritten constantly, so a fixed threshold is what keeps pickup latency flat.
"""

from django.db import migrations

import django_hopper.migration_operations

HOT = ("hopper_job", "hopper_queue", "hopper_client", "hopper_batch_progress")


class Migration(migrations.Migration):
    dependencies = [("django_hopper", "0004_steps_pubsub_streams")]

    operations = [
        django_hopper.migration_operations.RunSQLIf(
            feature="supports_storage_parameters",
            sql=[
                f"ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0.0, "
                "autovacuum_vacuum_threshold = 2000, autovacuum_analyze_scale_factor = 0.0, "
                "autovacuum_analyze_threshold = 5000, autovacuum_vacuum_cost_delay = 0)"
                for table in HOT
            ],
            reverse_sql=[
                f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, "
                "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, "
                "autovacuum_analyze_threshold, autovacuum_vacuum_cost_delay)"
                for table in HOT
            ],
        ),
    ]
