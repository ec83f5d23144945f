"""One call to an instance, as the client's breakers and in-flight counts see it: ``Call`` (what
``DiscoveryClient.begin``/``track`` hand out) and which errors say the instance misbehaved."""
from discovery_app.balancers import key_of

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


def is_instance_failure(exc):
    """Does ``exc``, escaping a call, say the instance misbehaved (and not the caller)?

    Connection errors and timeouts (OSErrors) do, and so do a broken or undecodable body. requests'
    other errors are OSErrors too but the caller's own (InvalidHeader, InvalidURL, MissingSchema,
    TooManyRedirects...): they must not eject a healthy instance.
    """
    if not isinstance(exc, OSError):
        return False
    try:
        import requests
    except ImportError:  # pragma: no cover - requests is a dependency, but track() does not need it
        return True
    if isinstance(exc, requests.RequestException):
        return isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                                requests.exceptions.ContentDecodingError))
    return True


class Call:
    """One call in flight to ``instance``: ``fail()`` when it misbehaved without raising (a 5xx);
    ``finish()`` ends it once (later calls do nothing)."""

    def __init__(self, client, instance):
        self.client = client
        self.instance = instance
        self.started = client.clock()
        self.failed = False
        self._done = False

    def fail(self):
        self.failed = True

    def finish(self, ok=True):
        """Leave the in-flight count; report ``ok and not failed`` to the breaker (None: report nothing)."""
        client, key = self.client, key_of(self.instance)
        with client._lock:
            if self._done:
                return
            self._done = True
            client._inflight[key] -= 1
            if not client._inflight[key]:
                del client._inflight[key]
        if ok is not None:
            client.report(self.instance, ok=ok and not self.failed, started=self.started)
