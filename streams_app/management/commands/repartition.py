from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from streams_app.connection import TRANSIENT_ERRORS
from streams_app.exceptions import StreamsError
from streams_app.repartition import MOST_PARTITIONS, repartition


class Command(ShoalCommand):
    help = ("Change the partition count of STREAM to N while producers and consumers run, keeping per-key order "
            "(docs/cluster.md, \"Repartitioning online\"). Stopped or killed, run it again to finish.")

    def add_arguments(self, parser):
        parser.add_argument("stream", help="The logical stream, e.g. orders.")
        parser.add_argument("count", type=int, metavar="N", help=f"The new partition count, 2 to {MOST_PARTITIONS}.")
        parser.add_argument("--no-wait", action="store_true",
                            help="Stop once the new layout is live and sealed; a later run drains and retires the "
                                 "previous partitions.")

    def handle(self, *args, stream, count, no_wait, verbosity, **options):
        def say(text):
            if verbosity > 0:
                self.stdout.write(text)
                self.stdout.flush()

        try:
            repartition(stream, count, say=say, wait=not no_wait)
        except StreamsError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError(f"stopped; nothing is lost and the state is in Redis: run manage.py repartition "
                               f"{stream} {count} again to finish the change.") from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"Redis failed during the repartition ({exc}); nothing is lost: run the command "
                               f"again to finish it.") from None
