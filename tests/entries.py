"""What the process tests write into and read back from a test Redis, as a foreign producer would."""
import json


def publish_raw(client, stream, payloads):
    """XADD each payload as JSON in one pipeline, bypassing Shoal's publish (no key, no headers)."""
    pipe = client.pipeline(transaction=False)
    for payload in payloads:
        pipe.xadd(stream, {"payload": json.dumps(payload)})
    return pipe.execute()


def listed(client, kind, stream, group):
    """The entry ids tests/testapp's handlers recorded under ``kind`` ("started", "handled")."""
    return client.lrange(f"{kind}:{stream}:{group}", 0, -1)
