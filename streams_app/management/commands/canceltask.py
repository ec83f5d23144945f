from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from streams_app.redis.connection import TRANSIENT_ERRORS
from streams_app.tasks import api_available, results


class Command(ShoalCommand):
    help = ("Cancel queued Django Tasks (READY: queued, deferred or waiting for a retry) by result id: they will "
            "never run, and their results end FAILED with a TaskCancelled error. Exit 1 if any could not be "
            "cancelled (running, finished or unknown).")

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", metavar="ID", help="Task result ids (TaskResult.id, as enqueue() returned).")

    def handle(self, *args, ids, verbosity, **options):
        if not api_available():
            raise CommandError("Django's Tasks API is not installed: Django 6.0+, or pip install django-shoal[tasks] "
                               "on Django 5.2.")
        from streams_app.redis.connection import get_connection
        from streams_app.tasks.cancelling import cancel

        bad = [result_id for result_id in ids if not results.valid_id(result_id)]
        if bad:
            raise CommandError(f"Not a task result id: {', '.join(repr(b[:80]) for b in bad)} (letters and digits, "
                               "at most 64, as TaskResult.id prints); nothing was cancelled.")
        refused = []
        for result_id in ids:
            try:
                done = cancel(result_id)
                record = None if done else results.get(get_connection(), result_id)
            except TRANSIENT_ERRORS as exc:
                raise CommandError(f"Redis did not answer ({type(exc).__name__}: {exc}) at {result_id}; the ids before "
                                   "it were handled as printed, it and the rest were not. Run the command again: a "
                                   "cancelled one stays cancelled.") from None
            if done:
                if verbosity > 0:
                    self.stdout.write(f"{result_id}: cancelled, it will not run")
            else:
                state = "unknown (never enqueued here, or expired)" if record is None else record["status"]
                refused.append(f"{result_id}: not cancelled, it is {state}")
        for line in refused:
            self.stderr.write(line)
        if refused:
            raise SystemExit(1)
