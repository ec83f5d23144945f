"""Running handlers on a batch of messages, in a handler thread."""
import logging
import time
from dataclasses import dataclass

from django.db import close_old_connections

from streams_app.metrics import consumer as metrics
from streams_app.exceptions import PayloadDecodeError

logger = logging.getLogger("streams_app.consumer")

FAILED = "failed"
POISON = "poison"


@dataclass(slots=True)
class Outcome:
    message: object
    status: str
    error: BaseException | None = None


def run_chunk(handler, messages, guard=None, budget=None):
    """Run ``handler`` on each message; return (ids to ack, failed Outcomes, seconds per message, not started).

    A handler exception is an outcome, never an escape: one bad message must not take the rest of
    the chunk, or the worker, with it. ``guard`` (streams_app.consuming.idempotency) skips duplicates.

    ``budget`` (seconds): once a chunk has run that long it starts no further message and hands
    the rest back. Chunks are sized from past handler speed; when handlers slow down, a big chunk
    would otherwise hold finished entries unacked until another consumer's takeover (after the
    pending timeout) handled them a second time.
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
        try:
            runnable, duplicates, busy = guard.begin(runnable)
        except BaseException:
            recorder.in_flight.dec(len(messages))  # the chunk fails whole; the loop retries it
            raise
        acked.extend(m.id for m in duplicates)
        failed.extend(Outcome(m, FAILED, exc) for m, exc in busy)
    succeeded = []
    errored = []
    left = []
    for index, message in enumerate(runnable):
        if budget is not None and index and time.perf_counter() - started > budget:
            left = runnable[index:]
            break
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
        try:
            guard.end(succeeded, errored)
        except Exception as exc:
            # The handlers ran: ack them all the same. Without the done mark a later duplicate
            # delivery may run again, which the "redis" guard never promised to prevent.
            logger.warning("Consumer %s: could not record %d handled entries of %s/%s in the idempotency guard: %s",
                           messages[0].consumer, len(succeeded), messages[0].stream, messages[0].group, exc)
    elapsed = time.perf_counter() - started
    done = len(messages) - len(left)
    recorder.finished(done, len(acked), failed, elapsed)
    if left:
        recorder.in_flight.dec(len(left))
    close_old_connections()
    return acked, failed, elapsed / max(done, 1), left
