from django.db import migrations, models


class Migration(migrations.Migration):
    # A new, empty table: no lock on any live table.

    dependencies = [
        ('django_hopper', '0008_pass_leases'),
    ]

    operations = [
        migrations.CreateModel(
            name='SchemaFloor',
            fields=[
                ('code_version', models.IntegerField(primary_key=True, serialize=False)),
                ('declared_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'db_table': 'hopper_schema_floor',
            },
        ),
    ]
