"""Installs schema queue_pg (revision head of queue_pg's own migrations) on Django's database,
and declares the read-only admin models over it. Works on a database where ``queue-pg migrate``
already installed it (nothing to do); reversing it drops the schema."""

from django.db import migrations, models

from queue_pg.contrib.django.migrate import install, uninstall


class Migration(migrations.Migration):
    initial = True
    # migrate() runs its own transaction on the connection, which must be idle
    atomic = False

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(install, uninstall),
        migrations.CreateModel(
            name="DeadLetter",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("enqueued_at", models.DateTimeField()),
                ("visible_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField(null=True)),
                ("receive_count", models.IntegerField()),
                ("lease_expiries", models.IntegerField()),
                ("first_received_at", models.DateTimeField(null=True)),
                ("last_received_at", models.DateTimeField(null=True)),
                ("body", models.JSONField()),
                ("attributes", models.JSONField(null=True)),
            ],
            options={
                "verbose_name": "dead letter",
                "db_table": 'queue_pg"."messages',
                "ordering": ("-id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("id", models.IntegerField(primary_key=True, serialize=False)),
                ("name", models.TextField(unique=True)),
                ("visibility_timeout", models.FloatField()),
                ("message_ttl", models.FloatField(null=True)),
                ("delay", models.FloatField()),
                ("max_message_size", models.IntegerField()),
                ("receive_wait", models.FloatField()),
                ("max_lease", models.FloatField()),
                ("dead_letter_queue", models.TextField(null=True)),
                ("max_receive_count", models.IntegerField(null=True)),
                ("in_flight_limit", models.IntegerField(null=True)),
                ("history", models.BooleanField()),
                ("history_retention", models.FloatField()),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "db_table": 'queue_pg"."queues',
                "ordering": ("name",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="QueueStats",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("visible", models.BigIntegerField()),
                ("in_flight", models.BigIntegerField()),
                ("delayed", models.BigIntegerField()),
                (
                    "dead_lettered",
                    models.BigIntegerField(help_text="messages dead-lettered from this queue"),
                ),
                ("oldest_visible_age", models.FloatField(help_text="seconds", null=True)),
                ("stale_receipts", models.BigIntegerField()),
                ("lease_expiries", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "db_table": 'queue_pg"."queue_stats',
                "ordering": ("queue",),
                "managed": False,
            },
        ),
    ]
