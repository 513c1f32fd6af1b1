"""Upgrades schema queue_pg to its head (revision 0022 adds the lease_durability setting and the
history's sampling) and adds lease_durability to the read-only Queue model."""

from django.db import migrations, models

from queue_pg.contrib.django.migrate import install


class Migration(migrations.Migration):
    atomic = False  # as 0001: migrate() runs its own transaction on the idle connection

    dependencies = [("queue_pg", "0003_dedup")]

    operations = [
        migrations.RunPython(install, migrations.RunPython.noop),
        migrations.AddField(
            model_name="queue", name="lease_durability",
            field=models.TextField(default="durable"), preserve_default=False,
        ),
    ]
