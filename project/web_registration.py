"""Keep this gunicorn instance registered in the discovery registry, from a process of its own.

    python -m project.web_registration ADDRESS PORT [METADATA_JSON]

gunicorn.conf.py starts it in ``when_ready`` and it lives until its stdin closes (the master exited,
or died: the pipe closes either way) or it gets TERM/INT; then it deregisters. It is a child of the
master rather than code in the master because registering needs Django and the app's settings, and
whatever the master imports is inherited, unreloaded, by every worker forked after a HUP: the master
imports no app code, so that ``kill -HUP`` loads new code.

The service name is ``settings.WEB_SERVICE_NAME``; the registrar (discovery_app.registrar)
heartbeats and re-registers after Redis outages by itself.
"""
import json
import logging
import os
import signal
import sys
import threading

logger = logging.getLogger("discovery_app.web")


def _wait_for_eof(done):
    # os.read, not sys.stdin: a daemon thread blocked in a buffered read holds the buffer's lock,
    # and the interpreter aborts ("could not acquire lock ... at interpreter shutdown") on exit.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    done.set()


def main(argv):
    address, port = argv[0], int(argv[1])
    metadata = json.loads(argv[2]) if len(argv) > 2 else {}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.conf import settings

    from discovery_app.registrar import Registrar

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    threading.Thread(target=_wait_for_eof, args=(done,), daemon=True).start()
    registrar = Registrar(settings.WEB_SERVICE_NAME, address, port, metadata=metadata)
    registrar.start()
    logger.info("Web registration: %s at %s:%s registered", settings.WEB_SERVICE_NAME, address, port)
    while not done.wait(1.0):
        pass
    registrar.stop()
    logger.info("Web registration: %s at %s:%s deregistered", settings.WEB_SERVICE_NAME, address, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
