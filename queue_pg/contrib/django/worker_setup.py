"""Imported first by every worker process of ``manage.py queue_pg_worker``: sets Django up (a
spawned process starts bare; DJANGO_SETTINGS_MODULE comes from the environment)."""

import django

django.setup()
