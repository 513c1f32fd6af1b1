"""``python manage.py try_it``: the whole example in one command."""

import threading
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import Client

import queue_pg
from queue_pg.embedded import app_dsn
from queue_pg.jobs.tasks import registry
from signups.models import Signup


class Command(BaseCommand):
    help = "Migrate, sign up three times (new, taken, bad referrer), run the welcome job, show it."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0)
        web = Client()
        for form in ({"email": "ann@example.com"}, {"email": "ann@example.com"},
                     {"email": "bob@example.com", "referred_by": "nobody@example.com"}):
            response = web.post("/signup/", form)
            self.stdout.write(f"POST /signup/ {form} -> {response.status_code} {response.json()}")
        with queue_pg.Client(app_dsn("django_example")) as client:
            worker = queue_pg.Worker(client, "welcome", registry, concurrency=1, wait=1)
            thread = threading.Thread(target=worker.run, kwargs={"signals": ()})
            thread.start()
            try:
                deadline = time.monotonic() + 30
                while Signup.objects.filter(email="ann@example.com", welcomed_at=None).exists():
                    if time.monotonic() > deadline:
                        raise CommandError("the welcome job did not run within 30 s")
                    time.sleep(0.1)
            finally:
                worker.stop()
                thread.join()
        for row in Signup.objects.order_by("id"):
            self.stdout.write(f"signup {row.email}: welcomed at {row.welcomed_at:%H:%M:%S}")
