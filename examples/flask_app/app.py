"""A Flask app that enqueues a welcome job in the same transaction as the signup row.

    flask --app app try-it                    # the whole story in one command
    flask --app app queue-pg migrate          # or as a service: schema, queues, and
    flask --app app run                       # POST /signup email=ann@example.com
    flask --app app queue-pg worker           # runs send_welcome

The database is $QUEUE_PG_DSN, else database ``flask_example`` on the embedded server (created
on first use).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

import click
from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import DateTime, String, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import queue_pg
from queue_pg.contrib.flask import QueuePG
from queue_pg.dsn import sqlalchemy_url
from queue_pg.embedded import app_dsn
from queue_pg.jobs.tasks import registry


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
qp = QueuePG()


class Signup(db.Model):  # type: ignore[name-defined]
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    referrals: Mapped[int] = mapped_column(default=0)
    welcomed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


@queue_pg.task(queue="welcome", name="send_welcome", retries=3)
def send_welcome(signup_id: int) -> None:
    """Would send the welcome mail; here it only records that it ran (in an app context)."""
    signup = db.session.get(Signup, signup_id)
    if signup is not None and signup.welcomed_at is None:
        signup.welcomed_at = datetime.now(timezone.utc)
        db.session.commit()


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(app_dsn("flask_example"))
    app.config["QUEUE_PG_QUEUES"] = {
        "welcome-dlq": {},
        "welcome": {"dead_letter_queue": "welcome-dlq", "max_receive_count": 5},
    }
    app.config.update(config or {})
    db.init_app(app)
    qp.init_app(app)

    @app.post("/signup")
    def signup() -> ResponseReturnValue:
        """The signup and its welcome job commit together; an unknown referrer rolls both
        back."""
        new = Signup(email=request.form["email"])
        db.session.add(new)
        try:
            db.session.flush()
        except IntegrityError:  # the email is taken: a conflict, and nothing was enqueued
            db.session.rollback()
            return jsonify(error="already signed up"), 409
        message_id = qp.enqueue(send_welcome, new.id)  # in db.session's transaction
        referred_by = request.form.get("referred_by")
        if referred_by:
            referrer = db.session.scalar(
                select(Signup).filter_by(email=referred_by).with_for_update()
            )
            if referrer is None:
                db.session.rollback()
                return jsonify(error="unknown referrer"), 400
            referrer.referrals += 1
        db.session.commit()
        return jsonify(id=new.id, message_id=message_id), 201

    app.cli.add_command(try_it)
    return app


@click.command("try-it")
def try_it() -> None:
    """Install, sign up three times (new, taken, bad referrer), run the welcome job, show it."""
    from flask import current_app

    app = current_app._get_current_object()  # type: ignore[attr-defined]
    qp.migrate()
    db.create_all()
    web = app.test_client()
    for form in ({"email": "ann@example.com"}, {"email": "ann@example.com"},
                 {"email": "bob@example.com", "referred_by": "nobody@example.com"}):
        response = web.post("/signup", data=form)
        click.echo(f"POST /signup {form} -> {response.status_code} {response.get_json()}")
    worker = queue_pg.Worker(qp.client, "welcome", registry, concurrency=1, wait=1)
    thread = threading.Thread(target=worker.run, kwargs={"signals": ()})
    thread.start()
    try:
        deadline = time.monotonic() + 30
        waiting = select(Signup).filter_by(email="ann@example.com", welcomed_at=None)
        while db.session.scalar(waiting):
            db.session.rollback()  # a fresh snapshot for the next look
            if time.monotonic() > deadline:
                raise click.ClickException("the welcome job did not run within 30 s")
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join()
    for row in db.session.scalars(select(Signup).order_by(Signup.id)):
        click.echo(f"signup {row.email}: welcomed at {row.welcomed_at:%H:%M:%S}")
