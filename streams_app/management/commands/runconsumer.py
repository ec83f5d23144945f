import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from streams_app.exceptions import ConsumerConfigError, StreamsError
from streams_app.registry import select
from streams_app.worker import EXIT_CONFIG, Worker

_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


positive_int.__name__ = "positive integer"


class Command(BaseCommand):
    help = "Run the registered stream consumers (all, or the STREAM:GROUP pairs named) in this process."

    def add_arguments(self, parser):
        parser.add_argument("selectors", nargs="*", metavar="STREAM:GROUP",
                            help="Consumers to run, e.g. orders:email. Splits at the last ':'. Default: all registered.")
        parser.add_argument("--threads", type=positive_int, help="Handler threads (default STREAMS['THREADS']).")
        parser.add_argument("--batch", type=positive_int, help="Entries per read (default STREAMS['BATCH_SIZE']).")
        parser.add_argument("--block-ms", type=positive_int, help="How long an idle read blocks, in ms (default STREAMS['BLOCK_MS']).")
        parser.add_argument("--shutdown-timeout", type=float,
                            help="Seconds in-flight handlers get after SIGTERM (default STREAMS['SHUTDOWN_TIMEOUT']).")

    def handle(self, *args, selectors, threads, batch, block_ms, shutdown_timeout, verbosity, **options):
        logging.getLogger("streams_app").setLevel(_LEVELS.get(verbosity, logging.INFO))
        if shutdown_timeout is not None and shutdown_timeout < 0:
            raise CommandError("--shutdown-timeout must be 0 or more seconds.")
        try:
            specs = select(selectors)
        except ConsumerConfigError as exc:
            raise CommandError(str(exc), returncode=EXIT_CONFIG) from None
        worker = Worker(specs, threads=threads, batch=batch, block_ms=block_ms, shutdown_timeout=shutdown_timeout)
        try:
            code = worker.run()
        except StreamsError as exc:
            raise CommandError(str(exc), returncode=EXIT_CONFIG) from None
        if worker.stuck:
            # Handler threads that ignored the shutdown timeout would keep the interpreter alive.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            raise CommandError(f"consumer {worker.name} stopped after an error (exit {code}); see the log above.", returncode=code)
