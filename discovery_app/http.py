"""``DiscoveryClient.request``: one HTTP call to a service, over requests.

Picks an instance, counts the call in flight, feeds the instance's breaker (connection errors,
timeouts and 5xx are failures), and retries an idempotent method once on another instance after
a connection error or a 5xx. A non-idempotent call is never sent twice: the first instance may
have acted on it. Sessions are per thread (requests does not promise a shared one is thread-safe)
and per process.
"""
import logging
import os

import requests

from discovery_app.balancers import key_of
from discovery_app.client import IDEMPOTENT_METHODS

logger = logging.getLogger("discovery_app.client")

RETRYABLE_ERRORS = (requests.ConnectionError, requests.Timeout)


def _session(client):
    local = client._http
    if getattr(local, "pid", None) != os.getpid():
        local.session, local.pid = requests.Session(), os.getpid()
    return local.session


def request(client, service, method, path, *, retry=None, **kwargs):
    """Send ``method path`` to an instance of ``service``; return the ``requests.Response``.

    ``retry``: None retries idempotent methods only; True/False force it. Raises
    ServiceNotAvailable when no instance can be resolved, or the last connection error.
    """
    method = method.upper()
    if not path.startswith("/"):
        path = "/" + path
    kwargs.setdefault("timeout", client.http_timeout)
    attempts = 2 if (method in IDEMPOTENT_METHODS if retry is None else retry) else 1
    tried = set()
    for attempt in range(1, attempts + 1):
        instance = client.resolve(service, exclude=tried)
        tried.add(key_of(instance))
        last = attempt == attempts
        with client.track(instance) as call:
            try:
                response = _session(client).request(method, instance.url + path, **kwargs)
            except RETRYABLE_ERRORS as exc:
                call.fail()
                if last:
                    raise
                logger.info("Discovery: %s %s on %s failed (%s); retrying on another instance",
                            method, path, instance.url, exc)
                continue
            if response.status_code >= 500:
                call.fail()
                if not last:
                    logger.info("Discovery: %s %s on %s answered %s; retrying on another instance",
                                method, path, instance.url, response.status_code)
                    response.close()
                    continue
            return response
