"""Settings of the example project: one PostgreSQL database, ``$QUEUE_PG_DSN``, else database
``django_example`` on queue_pg's embedded server (created on first use)."""

import os

from psycopg.conninfo import conninfo_to_dict

from queue_pg.embedded import app_dsn

_db = conninfo_to_dict(app_dsn("django_example"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "queue_pg.contrib.django",
    "signups",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

QUEUE_PG = {
    # created by `manage.py migrate`; the dead-letter queue first
    "QUEUES": {
        "welcome-dlq": {},
        "welcome": {"dead_letter_queue": "welcome-dlq", "max_receive_count": 5},
    },
}
