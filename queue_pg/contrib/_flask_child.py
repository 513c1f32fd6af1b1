"""Imported first by each worker process of ``flask queue-pg worker --processes N``: loads the
Flask app as the flask command did (``$FLASK_APP``, else app.py / wsgi.py), which sets QueuePG
up and registers the tasks defined beside it."""

import os

from flask.cli import ScriptInfo

app = ScriptInfo(app_import_path=os.environ.get("FLASK_APP")).load_app()
