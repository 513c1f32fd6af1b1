"""The queue settings fifo and fair (queue_pg revision 0008); the table is queue_pg's own."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("queue_pg", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="queue", name=name, field=models.BooleanField(default=False),
            preserve_default=False,
        )
        for name in ("fifo", "fair")
    ]
