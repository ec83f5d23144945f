"""The enqueue's one write: the READY results, their queues' index entries and the messages of a batch
of tasks in one script call (streams_app/lua/task_enqueue.lua), for ``enqueue`` (a batch of one) and
``enqueue_many``. One Redis server only: on a cluster a result and its queue's stream are in
different slots, and the backend writes them one by one.

A MULTI/EXEC of the same writes cost four or five commands per task, each packed and each with its
own reply; most of an enqueue's time went there. The script also checks every stream and index's
type before its first write, so a key of another type refuses the whole batch with nothing written.
"""
import time

import redis

from streams_app.partitioning import partitions
from streams_app.redis import scripts
from streams_app.publishing.encoding import message_encoder
from streams_app.tasks import results


def send(conn, prepared, ttl):
    """Write ``prepared`` ((TaskResult, stream, payload, record) per task; ``record`` as results.create
    takes it). Returns the entry ids, or None when Redis refused the batch (nothing written: a stream
    or index of another type; the caller's one-by-one path then raises Redis's reason as ``publish``
    words it). PublishError, before anything is written, for a message ``publish`` would refuse."""
    encode = message_encoder()
    positions = {}  # stream or index -> its position in KEYS (1-based)
    streams, indexes, tasks = [], [], []
    for result, stream, payload, record in prepared:
        fields = encode(payload, key=result.id)
        # As publish does: a stream the settings partition goes to its key's partition.
        if len(partitions.ensure_recorded(conn, stream)) > 1:
            stream = partitions.route(stream, result.id)
        if stream not in positions:
            positions[stream] = None
            streams.append(stream)
        index = results.index_key(record["queue"])
        if index not in positions:
            positions[index] = None
            indexes.append(index)
        tasks.append((stream, index, result.id, record["enqueued_at"], results.encoded(record), fields))
    for position, name in enumerate(streams + indexes, 1):
        positions[name] = position
    now = time.time()
    names = list(tasks[0][4]) if tasks else []
    trim = [results.index_trim_due(index, now) for index in indexes]  # each marked: the script trims them all
    args = [ttl, int(now * 1000), "1" if any(trim) else "0",
            len(streams), len(streams) + len(indexes), len(names), *names]
    keys = streams + indexes
    for stream, index, result_id, enqueued_at, hash_fields, fields in tasks:
        if list(hash_fields) != names:  # the names are sent once: every record must have them, in order
            raise ValueError(f"result {result_id} has fields {list(hash_fields)}, not {names}")
        keys.append(results.key(result_id))
        args += (positions[stream], positions[index], result_id, repr(enqueued_at.timestamp() * 1000),
                 *hash_fields.values(), 2 * len(fields))
        for item in fields.items():
            args += item
    try:
        return scripts.run(conn, "task_enqueue", keys, args)
    except redis.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        return None
