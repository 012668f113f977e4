from django.db import migrations, models


class Migration(migrations.Migration):
    # Nullable columns without a default and a new table: catalog changes, no
    # table rewrite, so code of the previous release keeps running beside them.

    dependencies = [
        ('django_hopper', '0009_schema_floor'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='subject',
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name='jobhistory',
            name='subject',
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='erased_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='jobhistory',
            name='erased_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='Erasure',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('subject_digest', models.CharField(max_length=64)),
                ('erased_at', models.DateTimeField()),
                ('jobs', models.IntegerField(default=0)),
                ('running', models.IntegerField(default=0)),
                ('steps', models.IntegerField(default=0)),
                ('logs', models.IntegerField(default=0)),
                ('results', models.IntegerField(default=0)),
            ],
            options={
                'db_table': 'hopper_erasure',
                'indexes': [models.Index(fields=['subject_digest'], name='hopper_erasure_subject')],
            },
        ),
    ]
