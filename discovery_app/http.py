"""``DiscoveryClient.request``: one HTTP call to a service, over requests.

Picks an instance, counts the call in flight until its body is read or the response closed (also
with ``stream=True``), feeds the instance's breaker (connection errors, timeouts, broken bodies, 5xx
and 429 are failures; other 4xx and the caller's own errors, such as an invalid header, are not),
and retries an idempotent method once on another instance after a connection error, a 5xx or 429,
or (by default, see RETRY_READ_TIMEOUTS) a read timeout. A non-idempotent call is never sent twice: the first instance
may have acted on it; one whose connection could not be made (refused, as by a draining instance) was
not sent at all, and goes to another instance.

Calls are stateless: cookies a response sets are not kept for later calls. A thread serves many end
users in turn, and one user's downstream session cookie must never ride along with another user's
call. Connections are still pooled, in one Session per thread (requests does not promise a shared
one is thread-safe) and per process.
"""
import http.cookiejar
import logging
import os
import time
import weakref

import requests
import urllib3

from discovery_app.balancers import key_of
from discovery_app.calls import IDEMPOTENT_METHODS, is_instance_failure

logger = logging.getLogger("discovery_app.client")

RETRYABLE_ERRORS = (requests.ConnectionError, requests.Timeout)
# What reading a streamed body raises when the instance breaks off (requests' wrappers, or urllib3's
# own for callers reading response.raw).
BODY_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, OSError)


class DeadlineExceeded(requests.Timeout):
    """The call's ``deadline`` passed (connecting, waiting and reading the body all count)."""


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """Accept no cookie into the session's jar and send none from it (per-call cookies still go)."""

    def set_ok(self, cookie, request):
        return False

    def return_ok(self, cookie, request):
        return False


def _session(client):
    local = client._http
    if getattr(local, "pid", None) != os.getpid():
        session = requests.Session()
        session.cookies.set_policy(_NoCookies())
        local.session, local.pid = session, os.getpid()
    return local.session


def _track_body(response, call):
    """Keep ``call`` in flight until the streamed body is consumed, fails, or the response closes."""
    iter_content, close = response.iter_content, response.close

    def tracked_iter_content(*args, **kwargs):
        try:
            yield from iter_content(*args, **kwargs)
        except BODY_ERRORS:
            call.finish(False)
            raise
        call.finish(True)

    def tracked_close():
        try:
            close()
        finally:
            call.finish(True)

    # .content, .text, .json() and iter_lines() all read through iter_content.
    response.iter_content, response.close = tracked_iter_content, tracked_close
    weakref.finalize(response, call.finish, None)  # dropped unread: out of flight, no verdict


def _read_body(response, deadline):
    """Read a body as requests would, but give up at ``deadline`` (a per-read timeout alone lets a
    trickling body run on for ever)."""
    chunks = []
    try:
        for chunk in response.iter_content(16 * 1024):
            chunks.append(chunk)
            if deadline is not None and time.monotonic() > deadline:
                response.close()
                raise DeadlineExceeded(f"the body of {response.url} was still arriving at the deadline")
    except requests.ConnectionError as exc:
        # requests reports a read timeout in the body as a ConnectionError: call it what it is.
        if exc.args and isinstance(exc.args[0], urllib3.exceptions.ReadTimeoutError):
            raise requests.ReadTimeout(*exc.args, response=response) from exc
        raise
    response._content = b"".join(chunks)
    response._content_consumed = True


def _never_sent(exc):
    """Did the call fail before any byte of the request left (refused, unreachable, connect timeout)?"""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None  # urllib3's MaxRetryError
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


def _timeout_for(timeout, deadline):
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the deadline passed before the call could be sent")
    if timeout is None:
        return left
    if isinstance(timeout, tuple):
        return tuple(None if t is None else min(t, left) for t in timeout)
    return min(timeout, left)


def request(client, service, method, path, *, retry=None, deadline=None, tags=None, version=None, **kwargs):
    """Send ``method path`` to an instance of ``service``; return the ``requests.Response``.

    ``retry``: None retries idempotent methods only; True/False force it. ``deadline``: seconds for
    the whole call, retries and body included (default DISCOVERY["HTTP_DEADLINE"], None: no limit
    beyond the per-read ``timeout``). Raises ServiceNotAvailable when no instance can be resolved,
    DeadlineExceeded (a requests.Timeout), or the last connection error. ``tags``/``version``: as
    for ``DiscoveryClient.resolve``.
    """
    method = method.upper()
    if not path.startswith("/"):
        path = "/" + path
    timeout = kwargs.pop("timeout", client.http_timeout)
    stream = kwargs.pop("stream", False)
    deadline = client.http_deadline if deadline is None else deadline
    ends = None if deadline is None else time.monotonic() + deadline
    resend = method in IDEMPOTENT_METHODS if retry is None else retry
    # A connection that could not be made sent nothing: even a POST goes to another instance then (a
    # stopping instance refuses connections at once), unless retry=False says never.
    attempts = 2 if resend or retry is None else 1
    tried = set()
    failed = None  # why the last attempt is sent again, said once the next instance is known
    for attempt in range(1, attempts + 1):
        try:
            instance = client.resolve(service, exclude=tried, tags=tags, version=version)
        except Exception:
            if failed is not None:
                logger.info("Discovery: %s %s on %s; no instance to retry on", method, path, failed)
            raise
        if failed is not None:
            # resolve() gives an excluded instance back when it is the only one: say so, not "another".
            where = "on the same instance, the only one" if key_of(instance) in tried else "on another instance"
            logger.info("Discovery: %s %s on %s; retrying %s (%s)", method, path, failed, where, instance.url)
        tried.add(key_of(instance))
        last = attempt == attempts
        call = client.begin(instance)
        try:
            response = _session(client).request(method, instance.url + path, stream=True,
                                                timeout=_timeout_for(timeout, ends), **kwargs)
            if not stream:
                _read_body(response, ends)
        except RETRYABLE_ERRORS as exc:
            call.finish(False)
            if last or isinstance(exc, DeadlineExceeded) or (
                    isinstance(exc, requests.ReadTimeout) and not client.retry_read_timeouts) or (
                    not resend and not _never_sent(exc)):
                raise
            failed = f"{instance.url} failed ({exc})"
            continue
        except BaseException as exc:
            call.finish(False if is_instance_failure(exc) else None)
            raise
        if response.status_code >= 500 or response.status_code == 429:
            call.fail()
            if not last and resend:
                failed = f"{instance.url} answered {response.status_code}"
                response.close()
                call.finish(False)
                continue
        if stream:
            _track_body(response, call)
        else:
            call.finish(True)  # reports the failure if call.fail() was called
        return response
