"""Keep this gunicorn instance registered in the discovery registry, from a process of its own.

    python -m discovery_app.web_registration ADDRESS PORT [METADATA_JSON [INSTANCE_ID [WSGI_MODULE]]]

streams_app.web.gunicorn_conf starts it in ``when_ready`` (shoal_common/web_supervision.py supervises it: restarted
when it dies, with the same INSTANCE_ID). It registers once a worker answers ``/readyz``, marks the
instance failing while ``/readyz`` does not answer (clients skip it), and lives until its stdin closes (the master exited,
or died: the pipe closes either way) or it gets TERM/INT; then it deregisters. On TERM/INT the
Registrar's own handler deregisters at once; the master sends TERM as soon as it is told to stop,
before its drain. It is a child of the
master rather than code in the master because registering needs Django and the app's settings, and
whatever the master imports is inherited, unreloaded, by every worker forked after a HUP: the master
imports no app code, so that ``kill -HUP`` loads new code.

The service name is ``settings.WEB_SERVICE_NAME`` (default ``shoal-web``), a Django setting, read once: a HUP
does not restart this process, and a restart loads whatever code and settings are on disk then; the registrar (discovery_app.registrar)
heartbeats and re-registers after Redis outages by itself.
"""
import json
import logging
import os
import queue
import signal
import ssl
import sys
import tempfile
import threading
import time
import urllib.request
from importlib import import_module

logger = logging.getLogger("discovery_app.web")


def _wait_for_eof(done):
    # os.read, not sys.stdin: a daemon thread blocked in a buffered read holds the buffer's lock,
    # and the interpreter aborts ("could not acquire lock ... at interpreter shutdown") on exit.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    done.put("eof")


def _say_off(path):
    """/readyz shows the supervisor's status file: say "off" there (the supervisor wrote "running" when it
    started this process and writes again only when the process dies or the master stops)."""
    if not path:
        return
    try:
        directory, name = os.path.split(path)
        fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp", dir=directory or ".")
        with os.fdopen(fd, "w") as f:
            json.dump({"state": "off", "pid": os.getpid(), "restarts": 0, "since": time.time(),
                       "why": "discovery_app is not in INSTALLED_APPS"}, f)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("Web registration: could not write its state to %s (%s)", path, exc)


PROBE_TIMEOUT = 3.0  # /readyz itself answers within READYZ_TIMEOUT (1 s)


def probe(url, timeout=PROBE_TIMEOUT):
    """True when ``url`` (this instance's /readyz) answers 2xx in time. Over TLS the certificate is
    not checked: this is our own instance, at the address it is registered under."""
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return 200 <= response.status < 300
    except (OSError, ValueError):
        return False


def wait_until_ready(url, done, interval=0.5, remind_every=30.0):
    """Poll ``url`` until it answers; False if told to stop first (EOF or a signal on ``done``)."""
    started = last_said = time.monotonic()
    while not probe(url):
        if time.monotonic() - last_said >= remind_every:
            last_said = time.monotonic()
            logger.warning("Web registration: no worker has answered %s for %.0f s; not registered yet",
                           url, last_said - started)
        try:
            done.get(timeout=interval)
            return False
        except queue.Empty:
            pass
    logger.info("Web registration: a worker answers %s after %.1f s; registering", url, time.monotonic() - started)
    return True


def main(argv):
    address, port = argv[0], int(argv[1])
    metadata = json.loads(argv[2]) if len(argv) > 2 else {}
    instance_id = argv[3] if len(argv) > 3 else None
    if len(argv) > 4 and argv[4] and "DJANGO_SETTINGS_MODULE" not in os.environ:
        # The host's wsgi.py names its settings (os.environ.setdefault), as it does for the workers.
        import_module(argv[4].split(":")[0])
    import django

    django.setup()
    from django.apps import apps
    from django.conf import settings


    from discovery_app.registrar import Registrar

    done = queue.SimpleQueue()  # safe to put on from a signal handler
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: done.put(signum))
    threading.Thread(target=_wait_for_eof, args=(done,), daemon=True).start()
    if not apps.is_installed("discovery_app"):
        # install.md: "leave out discovery_app if you use no registry". The package ships in the same wheel
        # as streams_app, so the master (which imports no app code) cannot tell; this process can. It idles
        # until the master stops rather than exiting: gunicorn's arbiter reaps any child of the master, so an
        # exit code saying "not wanted" could be lost, and the supervisor would take it for a crash.
        logger.info("Web registration off: discovery_app is not in INSTALLED_APPS")
        _say_off(os.environ.get("SHOAL_WEB_REGISTRATION_STATUS"))
        done.get()
        return 0
    host = f"[{address}]" if ":" in address else address
    readyz = f"{metadata.get('scheme', 'http')}://{host}:{port}/readyz"
    # Registered only once a worker answers /readyz: the master listens long before a worker has
    # loaded the app, and callers sent here meanwhile would wait or be refused.
    if not wait_until_ready(readyz, done):
        logger.info("Web registration: stopped before any worker was ready; nothing was registered")
        return 0
    # Then /readyz again before each heartbeat: when the workers stop answering (frozen, Redis or the
    # database gone), clients skip this instance until it answers again. WEB_HEALTH_CHECK=0 turns
    # that off (the probes are requests like any other in the access log and metrics).
    follow = os.environ.get("WEB_HEALTH_CHECK", "1") != "0"
    service = getattr(settings, "WEB_SERVICE_NAME", "shoal-web")
    registrar = Registrar(service, address, port, metadata=metadata, instance_id=instance_id,
                          health_check=(lambda: probe(readyz)) if follow else None)
    registrar.start()  # chains its own TERM/INT handler in front: it deregisters at once
    logger.info("Web registration: %s at %s:%s registered as %s", service, address, port,
                registrar.instance_id)
    while True:
        try:
            done.get(timeout=1.0)
            break
        except queue.Empty:
            pass
    registrar.stop()
    logger.info("Web registration: %s at %s:%s deregistered", service, address, port)
    from shoal_common.connections import close_all

    close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
