from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from streams_app.redis.connection import TRANSIENT_ERRORS
from streams_app.exceptions import StreamsError
from streams_app.operations.repartition import MOST_PARTITIONS, repartition


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
            _known(stream)
            repartition(stream, count, say=say, wait=not no_wait)
        except StreamsError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError(f"stopped; nothing is lost and the state is in Redis: run manage.py repartition "
                               f"{stream} {count} again to finish the change.") from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"Redis failed during the repartition ({exc}); nothing is lost: run the command "
                               f"again to finish it.") from None


def _known(stream):
    """CommandError for a stream nothing knows (a typo): not in STREAMS["PARTITIONS"], read by no @consumer,
    and without a key in Redis, partitions and layout included. A trial's ``repartition nosuch 4`` wrote
    a layout and exited 0."""
    from streams_app.partitioning import layout, partitions
    from streams_app.redis.connection import get_connection
    from streams_app.registry import registered

    declared = partitions.count(stream) > 1
    consumed = any(spec.logical == stream for spec in registered())
    if declared or consumed:
        return
    conn = get_connection()
    if conn.exists(layout.layout_key(stream)) or any(conn.exists(name) for name in partitions.names(stream)):
        return
    raise CommandError(f"no stream {stream!r}: it is not in STREAMS['PARTITIONS'], no @consumer reads it, and Redis "
                       "holds no such stream. Check the name (a logical stream, e.g. orders, not a partition).")
