import logging
import signal

from django.core.management.base import CommandError
from django.db import DatabaseError, connections

from shoal_common.cli import DaemonCommand, log_level, port
from shoal_common.text import counted

from streams_app.checks import settings_errors
from streams_app.consuming.worker import EXIT_CONFIG
from streams_app.outbox.relay import Relay

logger = logging.getLogger("streams_app.outbox")  # start and stop are log lines (LOG_FORMAT=json structures them)


def check_outbox_table(using):
    """A CommandError that says what to do when the outbox table is missing or the database is unknown."""
    from streams_app.outbox.models import OutboxMessage

    if using not in connections:
        raise CommandError(f"no database {using!r} in DATABASES (--database)", returncode=EXIT_CONFIG)
    try:
        OutboxMessage.objects.using(using).exists()
    except DatabaseError as exc:
        raise CommandError(f"cannot read the outbox table of database {using!r} ({exc}). Run `python manage.py "
                           f"migrate --database {using}` first.", returncode=EXIT_CONFIG) from None


class Command(DaemonCommand):
    help = ("Run the outbox relay: publish committed publish(..., outbox=True) rows to Redis, in order per key, "
            "right after each commit (nudged) and at every sweep. Several may run on PostgreSQL; one at a time on SQLite.")

    def add_arguments(self, parser):
        parser.add_argument("--database", default="default", help="The database whose outbox to relay (default 'default').")
        parser.add_argument("--once", action="store_true", help="Relay what is waiting, one batch at a time, and exit.")
        parser.add_argument("--metrics-port", type=port,
                            help="Serve the shoal_outbox_* Prometheus gauges on this port (default: not served).")

    def handle(self, *args, database, once, metrics_port, verbosity, **options):
        problems = settings_errors()
        if problems:
            raise CommandError("STREAMS settings are invalid (python manage.py check lists them): " + "; ".join(problems),
                               returncode=EXIT_CONFIG)
        logging.getLogger("streams_app").setLevel(log_level(verbosity))
        check_outbox_table(database)
        if metrics_port is not None:
            from prometheus_client import start_http_server

            try:
                start_http_server(metrics_port)
            except OSError as exc:
                raise CommandError(f"cannot serve metrics on port {metrics_port}: {exc}") from None
        relay = Relay(database)

        def on_signal(signum, frame):
            relay.stop.set()  # the current batch finishes; the loop ends within a sweep interval

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        logger.info("Relay: relaying the outbox of database %r to Redis", database)
        if once:
            while relay.tick():
                pass
            if relay.down_since is not None:
                raise CommandError("Redis is unreachable: the outbox rows wait in the database", returncode=1)
        else:
            relay.run()
        logger.info("Relay: stopped after relaying %s", counted(relay.relayed, "row"))
