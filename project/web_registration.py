"""Keep this gunicorn instance registered in the discovery registry, from a process of its own.

    python -m project.web_registration ADDRESS PORT [METADATA_JSON [INSTANCE_ID]]

gunicorn.conf.py starts it in ``when_ready`` (project/web_supervision.py supervises it: restarted
when it dies, with the same INSTANCE_ID) and it lives until its stdin closes (the master exited,
or died: the pipe closes either way) or it gets TERM/INT; then it deregisters. On TERM/INT the
Registrar's own handler deregisters at once; the master sends TERM as soon as it is told to stop,
before its drain. It is a child of the
master rather than code in the master because registering needs Django and the app's settings, and
whatever the master imports is inherited, unreloaded, by every worker forked after a HUP: the master
imports no app code, so that ``kill -HUP`` loads new code.

The service name is ``settings.WEB_SERVICE_NAME``; the registrar (discovery_app.registrar)
heartbeats and re-registers after Redis outages by itself.
"""
import json
import logging
import os
import queue
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
    done.put("eof")


def main(argv):
    address, port = argv[0], int(argv[1])
    metadata = json.loads(argv[2]) if len(argv) > 2 else {}
    instance_id = argv[3] if len(argv) > 3 else None
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.conf import settings

    from discovery_app.registrar import Registrar

    done = queue.SimpleQueue()  # safe to put on from a signal handler
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: done.put(signum))
    threading.Thread(target=_wait_for_eof, args=(done,), daemon=True).start()
    # With WEB_HEALTH_CHECK=1, the instance's own /readyz before each heartbeat: when Redis or the
    # database stop answering it, clients skip this instance. Opt-in: the probes are requests like
    # any other in the access log and metrics. (Over TLS the certificate may not match the address.)
    host = f"[{address}]" if ":" in address else address
    wanted = os.environ.get("WEB_HEALTH_CHECK", "") not in ("", "0") and metadata.get("scheme", "http") == "http"
    health = f"http://{host}:{port}/readyz" if wanted else None
    registrar = Registrar(settings.WEB_SERVICE_NAME, address, port, metadata=metadata, instance_id=instance_id,
                          health_check=health)
    registrar.start()  # chains its own TERM/INT handler in front: it deregisters at once
    logger.info("Web registration: %s at %s:%s registered as %s", settings.WEB_SERVICE_NAME, address, port,
                registrar.instance_id)
    while True:
        try:
            done.get(timeout=1.0)
            break
        except queue.Empty:
            pass
    registrar.stop()
    logger.info("Web registration: %s at %s:%s deregistered", settings.WEB_SERVICE_NAME, address, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
