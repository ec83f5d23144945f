import time


def wait_for(condition, timeout=10.0, interval=0.02, what="condition"):
    """Poll ``condition`` until it returns a truthy value (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
