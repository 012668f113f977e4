from django.db import migrations, models


class Migration(migrations.Migration):
    # Nullable columns without defaults and a dropped NOT NULL: catalog changes
    # on PostgreSQL, no table rewrite. The three tables are small.

    dependencies = [
        ('django_hopper', '0011_subject_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='subscription',
            name='paused_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='streamconsumer',
            name='paused_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='periodicslot',
            name='last_slot',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='periodicslot',
            name='inserted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='periodicslot',
            name='disabled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='periodicslot',
            name='enabled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
