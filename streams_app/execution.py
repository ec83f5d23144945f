"""Running handlers on a batch of messages, in a handler thread."""
import logging
import time
from dataclasses import dataclass

from django.db import close_old_connections

from streams_app import metrics
from streams_app.exceptions import PayloadDecodeError

logger = logging.getLogger("streams_app.consumer")

FAILED = "failed"
POISON = "poison"


@dataclass(slots=True)
class Outcome:
    message: object
    status: str
    error: BaseException | None = None


def run_chunk(handler, messages, guard=None):
    """Run ``handler`` on each message; return (ids to ack, failed Outcomes, seconds per message).

    A handler exception is an outcome, never an escape: one bad message must not take the rest of
    the chunk, or the worker, with it. ``guard`` (streams_app.idempotency) skips duplicates.
    """
    close_old_connections()
    recorder = metrics.chunk_started(messages)
    started = time.perf_counter()
    acked = []
    failed = []
    runnable = []
    for message in messages:
        target = message.target_group
        if target is not None and target != message.group:
            # A dead letter replayed for another group: this group handled it the first time.
            acked.append(message.id)
            continue
        try:
            # Decode before the handler runs, so poison input is found even if the handler
            # would never have looked at the payload.
            message.decode()
        except PayloadDecodeError as exc:
            logger.error("Consumer %s: entry %s on %s is poison: %s", message.consumer, message.id, message.stream, exc)
            failed.append(Outcome(message, POISON, exc))
            continue
        runnable.append(message)
    if guard is not None and runnable:
        runnable, duplicates, busy = guard.begin(runnable)
        acked.extend(m.id for m in duplicates)
        failed.extend(Outcome(m, FAILED, exc) for m, exc in busy)
    succeeded = []
    errored = []
    for message in runnable:
        try:
            if guard is None:
                handler(message)
            elif not guard.call(handler, message):
                logger.info("Consumer %s: entry %s of %s/%s is a duplicate; acked without running the handler",
                            message.consumer, message.id, message.stream, message.group)
        except Exception as exc:
            logger.warning(
                "Consumer %s: handler failed on entry %s of %s (group %s, delivery %s): %s: %s",
                message.consumer, message.id, message.stream, message.group, message.deliveries,
                type(exc).__name__, exc, exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            failed.append(Outcome(message, FAILED, exc))
            errored.append(message)
        else:
            acked.append(message.id)
            succeeded.append(message)
    if guard is not None:
        guard.end(succeeded, errored)
    elapsed = time.perf_counter() - started
    recorder.finished(len(messages), len(acked), failed, elapsed)
    close_old_connections()
    return acked, failed, elapsed / max(len(messages), 1)
