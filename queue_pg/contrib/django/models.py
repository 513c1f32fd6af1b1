"""Read-only views of queue_pg's tables for the admin (``managed = False``: Django never
creates or alters them; our SQL files own them). ``db_table`` names the schema by quoting."""

from __future__ import annotations

from typing import Any

from django.db import models


class Queue(models.Model):
    """A row of ``queue_pg.queues``: a queue's settings."""

    id = models.IntegerField(primary_key=True)
    name = models.TextField(unique=True)
    visibility_timeout = models.FloatField()
    message_ttl = models.FloatField(null=True)
    delay = models.FloatField()
    max_message_size = models.IntegerField()
    receive_wait = models.FloatField()
    max_lease = models.FloatField()
    dead_letter_queue = models.TextField(null=True)
    max_receive_count = models.IntegerField(null=True)
    in_flight_limit = models.IntegerField(null=True)
    history = models.BooleanField()
    history_retention = models.FloatField()
    fifo = models.BooleanField()
    fair = models.BooleanField()
    content_dedup = models.BooleanField()
    dedup_window = models.FloatField()
    lease_durability = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = 'queue_pg"."queues'
        ordering = ("name",)

    def __str__(self) -> str:
        return str(self.name)


class QueueStats(models.Model):
    """A row of the view ``queue_pg.queue_stats``: one queue's counts, computed when read."""

    queue = models.TextField(primary_key=True)
    visible = models.BigIntegerField()
    in_flight = models.BigIntegerField()
    delayed = models.BigIntegerField()
    dead_lettered = models.BigIntegerField(help_text="messages dead-lettered from this queue")
    oldest_visible_age = models.FloatField(null=True, help_text="seconds")
    stale_receipts = models.BigIntegerField()
    lease_expiries = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = 'queue_pg"."queue_stats'
        ordering = ("queue",)
        verbose_name = "queue"
        verbose_name_plural = "queues"

    def __str__(self) -> str:
        return str(self.queue)


class DeadLetterManager(models.Manager["DeadLetter"]):
    def get_queryset(self) -> models.QuerySet[DeadLetter]:
        return super().get_queryset().filter(source_queue__isnull=False)


class DeadLetter(models.Model):
    """A message of ``queue_pg.messages`` that was dead-lettered (it has a source queue)."""

    id = models.BigIntegerField(primary_key=True)
    queue = models.ForeignKey(
        Queue, models.DO_NOTHING, db_column="queue_id", db_constraint=False, related_name="+",
        verbose_name="dead-letter queue",
    )
    source_queue = models.ForeignKey(
        Queue, models.DO_NOTHING, db_column="source_queue_id", db_constraint=False,
        related_name="+", null=True, verbose_name="from queue",
    )
    enqueued_at = models.DateTimeField()
    visible_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True)
    receive_count = models.IntegerField()
    lease_expiries = models.IntegerField()
    first_received_at = models.DateTimeField(null=True)
    last_received_at = models.DateTimeField(null=True)
    body = models.JSONField()
    attributes = models.JSONField(null=True)

    objects = DeadLetterManager()

    class Meta:
        managed = False
        db_table = 'queue_pg"."messages'
        ordering = ("-id",)
        verbose_name = "dead letter"

    def __str__(self) -> str:
        return f"message {self.id}"

    def attribute(self, key: str) -> Any:
        return (self.attributes or {}).get(key)
