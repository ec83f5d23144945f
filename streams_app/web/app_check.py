"""Can this process's Django application answer? Asked once by a gunicorn worker before it tells the
master it is ready (``verify``, from streams_app.web.gunicorn_conf), and by every ``/readyz`` (``load_urlconf``).

Django's stock wsgi.py loads the settings and the middleware but not the URLconf, which is imported on
the first request. A view module that cannot be imported then fails every request, not the worker's
boot: the master would roll such a deploy out, and /readyz answered before the URLconf is ever looked
at. So the guarantee "new code that cannot load leaves the old code serving" is made here, from the
packaged gunicorn config, not by a wsgi.py a host project never copies: the URLconf is loaded (and the
views it names with it), the system checks run (an error of ``manage.py check`` is a deploy that
cannot load too), and one request goes through the whole application.
"""
import io
import sys
import threading
import traceback

INTERNAL_PATH = "/healthz"
"""What the internal request asks for: streams_app's view (no I/O), or a 404 where the URLconf has no such path.
HealthCheckMiddleware lets this request through to the URLconf: answering it there, before the middleware
below it ran, let a deploy whose later middleware fails every request roll out."""
MARKER = "shoal.app_check"
"""The internal request's mark in its WSGI environ (request.META): not an ``HTTP_`` key, so no client can
send it and have its /healthz skip HealthCheckMiddleware."""


class ApplicationCannotLoad(RuntimeError):
    """The application cannot answer; the message says why (with the cause's traceback where there is one)."""


def load_urlconf():
    """Import the root URLconf, and so every module it includes and every view module it names.

    Django keeps the loaded URLconf, so after the first success this costs nothing; a failed import
    is tried again on the next call (as Django does on the next request)."""
    from django.urls import get_resolver

    try:
        get_resolver().url_patterns  # noqa: B018 - the property imports the module
    except Exception as exc:
        raise ApplicationCannotLoad(f"the URLconf cannot be loaded: {type(exc).__name__}: {exc}") from exc


def system_check_errors():
    """The errors ``manage.py check`` would report (not the database checks: those are migrate's)."""
    from django.core import checks

    # databases=[]: Django 6.1's model checks otherwise open a connection (JSONField asks SQLite what it
    # supports), and a database that is down would read as code that cannot load: every HUP aborted,
    # no worker able to boot. A database outage is /readyz's to report, not the boot check's.
    return [str(e) for e in checks.run_checks(databases=[]) if e.is_serious() and not e.is_silenced()]


def internal_host():
    """A Host header ALLOWED_HOSTS lets through, or None when it lets none through."""
    from django.conf import settings

    for host in settings.ALLOWED_HOSTS:
        if host == "*":
            return "localhost"
        return host[1:] if host.startswith(".") else host  # ".example.com" matches example.com itself
    return "localhost" if settings.DEBUG else None  # Django's own allowance with DEBUG


def internal_request(application, path=INTERNAL_PATH, host=None):
    """GET ``path`` through the WSGI ``application`` in this thread: (status, formatted exceptions the
    application raised while answering)."""
    from django.core.signals import got_request_exception

    host = host or internal_host() or "localhost"
    environ = {
        "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": "",
        "SERVER_NAME": host, "SERVER_PORT": "443", "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": host,
        "REMOTE_ADDR": "127.0.0.1", "HTTP_USER_AGENT": "shoal-app-check", MARKER: "1",
        # https: SECURE_SSL_REDIRECT would answer plain http with a redirect before the middleware below
        # SecurityMiddleware ran (with SECURE_PROXY_SSL_HEADER and no such header Django goes by this too).
        "wsgi.version": (1, 0), "wsgi.url_scheme": "https", "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr,
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }
    raised = []
    thread = threading.get_ident()

    def seen(sender, request=None, **kwargs):
        # Sent inside Django's except block: the exception is the one being handled.
        if threading.get_ident() == thread and request is not None and request.META.get(MARKER):
            raised.append("".join(traceback.format_exception(*sys.exc_info())))

    status = []
    got_request_exception.connect(seen, weak=False)
    try:
        body = application(environ, lambda line, headers, exc_info=None: status.append(line) or (lambda data: None))
        try:
            for _ in body:
                pass
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
    finally:
        got_request_exception.disconnect(seen)
    return int(status[0].split()[0]), raised


def verify(application):
    """Raise ApplicationCannotLoad unless ``application`` can answer: its URLconf loads, the system checks
    pass, and GET /healthz through it (every middleware, then the URLconf) answers below 500."""
    load_urlconf()
    errors = system_check_errors()
    if errors:
        raise ApplicationCannotLoad("the system checks found errors; this worker will not serve:\n" + "\n".join(errors))
    host = internal_host()
    if host is None:
        return  # ALLOWED_HOSTS refuses every host: no request could get through, this one neither
    status, raised = internal_request(application, host=host)
    if status >= 500:
        raise ApplicationCannotLoad(f"GET {INTERNAL_PATH} through the application answered {status}; "
                                    "this worker will not serve" + "".join(f"\n{t}" for t in raised))
