import json

from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from streams_app.publishing.codec import apply_types
from streams_app.redis.connection import TRANSIENT_ERRORS
from streams_app.exceptions import StreamsError
from streams_app.deadletters.replay import JSON_NULL, SKIP_REASONS, replay


class Command(ShoalCommand):
    help = "Put dead letters of STREAM back on STREAM for one group only; other groups do not see them again."

    def add_arguments(self, parser):
        parser.add_argument("stream", help="The origin stream, e.g. orders (its dead letters are in {orders}:dlq).")
        parser.add_argument("--group", required=True, help="The group that failed the entries and will handle them again.")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", dest="ids", action="extend", nargs="+", metavar="ID",
                           help="Dead-letter entry ids (the ids in {STREAM}:dlq): --id A B C, or --id A --id B.")
        which.add_argument("--all", action="store_true", help="Every dead letter of the group.")
        parser.add_argument("--payload", help="JSON that replaces the payload of every replayed entry.")
        parser.add_argument("--payload-types", metavar="JSON",
                            help="With --payload: the types of its values, as the entry's payload_types field writes "
                                 "them, e.g. '{\"/at\": \"datetime\"}' (docs/publishing.md). Without --payload the "
                                 "original payload is replayed with its types.")
        parser.add_argument("--dry-run", action="store_true", help="Show what would be replayed; change nothing.")

    def handle(self, *args, stream, group, ids, all, payload, payload_types, dry_run, verbosity, **options):
        override = None
        if payload_types is not None and payload is None:
            raise CommandError("--payload-types describes the values of --payload; give --payload too "
                               "(without it the original payload is replayed with its own types).")
        if payload is not None:
            try:
                override = json.loads(payload)
            except ValueError as exc:
                raise CommandError(f"--payload is not valid JSON ({exc}); quote it, e.g. --payload '{{\"n\": 1}}'") from None
            if payload_types is not None:
                try:
                    override = apply_types(override, json.loads(payload_types))
                except ValueError as exc:
                    raise CommandError(f"--payload-types does not fit --payload: {exc}") from None
            if override is None:
                override = JSON_NULL  # --payload null: replay with the payload null, not the original
        progress = None
        if all and verbosity > 0:
            def progress(scanned, total):
                self.stdout.write(f"  scanned {scanned}/{total} dead letters", ending="\r" if scanned < total else "\n")
                self.stdout.flush()
        try:
            result = replay(stream, group, ids=ids, all=all, payload_override=override, dry_run=dry_run, progress=progress)
        except StreamsError as exc:
            raise CommandError(str(exc)) from None
        except TRANSIENT_ERRORS as exc:
            if dry_run:
                done = "nothing was replayed (a dry run replays nothing)"
            elif not all:
                done = "nothing was replayed"
            else:
                done = "the replay stopped part-way (replay --all again: what was replayed is gone from the dead letters)"
            raise CommandError(f"Redis is unreachable ({exc}); {done}. Check REDIS_URL.") from None
        for dead_id, new_id in result.replayed:
            if verbosity > 1 or dry_run:
                self.stdout.write(f"{dead_id} -> {new_id or '(dry run)'}")
        for dead_id, why in result.skipped.items():
            self.stderr.write(f"{dead_id}: skipped, {SKIP_REASONS[why]}")
        verb = "Would replay" if dry_run else "Replayed"
        self.stdout.write(self.style.SUCCESS(f"{verb} {len(result.replayed)} dead letters of {stream} for group {group}"))
        if ids and result.skipped and not result.replayed:
            raise CommandError(f"none of the given ids could be replayed for group {group}; see above.")
