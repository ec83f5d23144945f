import logging
import signal
import threading

from django.core.management.base import CommandError

from shoal_common.cli import DaemonCommand, log_level, port, positive_float
from shoal_common.text import counted

from streams_app.consuming.worker import EXIT_CONFIG
from streams_app.operations.reclaim import Reclaimer
from streams_app.checks import settings_errors
from streams_app.registry import registered

logger = logging.getLogger("streams_app.reclaim")
relay_logger = logging.getLogger("streams_app.outbox")


def make_relay():
    from streams_app.management.commands.runrelay import check_outbox_table
    from streams_app.outbox.relay import Relay

    check_outbox_table("default")
    return Relay("default")


def relay_once(relay):
    """``--once --relay``: relay what is waiting, as ``runrelay --once`` does; an error text or None."""
    relay_logger.info("Relay: relaying the outbox of database 'default' to Redis (once, in the reclaim daemon)")
    try:
        while relay.tick():
            pass
    finally:
        relay.guard.release()
    relay_logger.info("Relay: stopped after relaying %s", counted(relay.relayed, "row"))
    if relay.down_since is not None:
        return "the outbox relay could not reach Redis: its rows wait in the database"
    return None


def start_relay(relay, stop):
    """The outbox relay in a thread that stops with the reclaimer (streams_app/outbox/relay.py);
    it logs as ``runrelay`` does."""
    relay.stop = stop
    thread = threading.Thread(target=relay.run, name="shoal-relay", daemon=True)
    relay_logger.info("Relay: relaying the outbox of database 'default' to Redis (a thread of the reclaim daemon)")
    thread.start()
    return thread


class Command(DaemonCommand):
    help = ("Run the reclaim daemon: dead-letter entries over their delivery limit, remove idle consumers, "
            "trim acknowledged entries (retention='acked'), record snapshots. One pass per interval.")

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=positive_float,
                            help="Seconds between passes (default STREAMS['RECLAIM_INTERVAL']).")
        parser.add_argument("--once", action="store_true", help="Make one pass and exit.")
        parser.add_argument("--relay", action="store_true",
                            help="Also run the outbox relay (as `runrelay` does) in a thread of this process; "
                                 "with --once, relay what is waiting once.")
        parser.add_argument("--metrics-port", type=port,
                            help="Serve the shoal_* Prometheus gauges on this port (default: not served).")

    def handle(self, *args, interval, once, relay, metrics_port, verbosity, **options):
        problems = settings_errors()  # also when called without system checks (call_command)
        if problems:
            raise CommandError("STREAMS settings are invalid (python manage.py check lists them): " + "; ".join(problems),
                               returncode=EXIT_CONFIG)
        logging.getLogger("streams_app").setLevel(log_level(verbosity))
        specs = registered()
        if not specs:
            raise CommandError("no consumers are registered, so there is nothing to reclaim. Declare one with "
                               "@consumer(...) in a consumers.py module of an installed app.", returncode=EXIT_CONFIG)
        reclaimer = Reclaimer(specs)
        if metrics_port is not None:
            from prometheus_client import start_http_server

            try:
                start_http_server(metrics_port)
            except OSError as exc:
                raise CommandError(f"cannot serve metrics on port {metrics_port}: {exc}") from None

        def on_signal(signum, frame):
            reclaimer.stop.set()  # the current pass finishes; run() returns before the next

        outbox_relay = make_relay() if relay else None  # a missing outbox table stops us before any pass
        relay_thread = start_relay(outbox_relay, reclaimer.stop) if relay and not once else None
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        logger.info("Reclaimer: watching %s (%s)", counted(len(specs), "group"), ", ".join(s.name for s in specs))
        reclaimer.run(interval=interval, once=once)
        if relay_thread is not None:
            relay_thread.join()
            relay_logger.info("Relay: stopped after relaying %s", counted(outbox_relay.relayed, "row"))
        errors = list(reclaimer.last_report.errors) if reclaimer.last_report else []
        if relay and once:
            errors += filter(None, [relay_once(outbox_relay)])
        if once and errors:
            # A cron job must not report success for a pass that audited nothing (Redis away, a bad key).
            raise CommandError(f"the pass did not complete: {'; '.join(errors)}", returncode=1)
        logger.info("Reclaimer: stopped after %d passes", reclaimer.passes)
