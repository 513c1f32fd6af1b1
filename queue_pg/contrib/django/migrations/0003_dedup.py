"""Upgrades schema queue_pg to its head (revision 0009 adds deduplication and redrive tasks) and
adds the two dedup settings to the read-only Queue model."""

from django.db import migrations, models

from queue_pg.contrib.django.migrate import install


class Migration(migrations.Migration):
    atomic = False  # as 0001: migrate() runs its own transaction on the idle connection

    dependencies = [("queue_pg", "0002_fifo_fair")]

    operations = [
        migrations.RunPython(install, migrations.RunPython.noop),
        migrations.AddField(
            model_name="queue", name="content_dedup", field=models.BooleanField(default=False),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="queue", name="dedup_window", field=models.FloatField(default=300),
            preserve_default=False,
        ),
    ]
