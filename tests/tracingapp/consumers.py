"""Handlers of the tracing tests (tests/streams_app/test_tracing_processes.py): one sync, one async, one that
raises (two deliveries: a retry, then the dead-letter stream)."""
from streams_app import consumer


@consumer("traced", group="sync")
def traced_sync(message):
    pass


@consumer("traced-async", group="async")
async def traced_async(message):
    pass


@consumer("traced-fail", group="g", max_deliveries=2, retry_backoff=(0.1, 0.2))
def traced_fails(message):
    raise ValueError(f"traced failure of {message.payload!r}")


@consumer("traced-slow", group="g")
def traced_slow(message):
    """Its first run says so in a file (SHOAL_TEST_MARKER), then hangs: the test kills the process."""
    import os
    import time
    from pathlib import Path

    marker = Path(os.environ["SHOAL_TEST_MARKER"])
    if not marker.exists():
        marker.write_text(message.id)
        time.sleep(600)
