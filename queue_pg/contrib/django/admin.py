"""Admin pages: queues with their stats, and dead letters with why they died. Read-only: the
queue's own operations (redrive, purge) belong to ``queue-pg`` and ``queue_pg.Client``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from queue_pg.contrib.django.models import DeadLetter, QueueStats


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(QueueStats)
class QueueStatsAdmin(_ReadOnly):
    list_display = ("queue", "visible", "in_flight", "delayed", "dead_lettered_link",
                    "oldest_visible_age", "stale_receipts", "lease_expiries")
    search_fields = ("queue",)

    @admin.display(description="dead lettered", ordering="dead_lettered")
    def dead_lettered_link(self, obj: QueueStats) -> Any:
        if not obj.dead_lettered:
            return obj.dead_lettered
        url = reverse("admin:queue_pg_deadletter_changelist")
        return format_html('<a href="{}?source_queue__name={}">{}</a>', url, obj.queue,
                           obj.dead_lettered)


@admin.register(DeadLetter)
class DeadLetterAdmin(_ReadOnly):
    list_display = ("id", "queue", "source_queue", "task", "reason", "receive_count",
                    "enqueued_at", "last_received_at")
    list_filter = ("queue__name", "source_queue__name")
    list_select_related = ("queue", "source_queue")
    search_fields = ("=id",)

    @admin.display(description="type")
    def task(self, obj: DeadLetter) -> Any:
        return obj.attribute("type")

    @admin.display(description="reason")
    def reason(self, obj: DeadLetter) -> Any:
        reason = obj.attribute("dead_letter_reason")
        if reason is None:
            error = obj.attribute("error")
            if isinstance(error, dict):
                reason = f"{error.get('type')}: {error.get('message')}"
        return reason
