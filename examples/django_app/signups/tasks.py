"""Jobs of the example: run by ``manage.py queue_pg_worker``."""

from django.utils import timezone

import queue_pg
from signups.models import Signup


@queue_pg.task(queue="welcome", retries=3)
def send_welcome(signup_id: int) -> None:
    """Would send the welcome mail; here it only records that it ran."""
    Signup.objects.filter(pk=signup_id, welcomed_at__isnull=True).update(
        welcomed_at=timezone.now()
    )
