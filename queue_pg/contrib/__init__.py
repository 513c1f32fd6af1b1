"""Framework integrations: ``queue_pg.contrib.django`` (a Django app) and
``queue_pg.contrib.flask`` (a Flask extension). Each joins the framework's own database
transaction for enqueueing and runs :class:`queue_pg.Worker` with the framework set up."""
