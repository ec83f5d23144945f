#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""
import os
import signal
import sys


# A runconsumer supervisor installs its HUP/TTIN/TTOU handlers only once Django has started, which
# takes seconds on a loaded host. Until then the default actions would kill (HUP) or stop (TTIN,
# TTOU) it; ignoring them meanwhile loses nothing: the workers it is about to start load the code
# on disk anyway. Its workers are exec'd after its own handlers are in place, so they start with
# the default dispositions.
_POOL_FLAGS = ("--workers", "--min-workers", "--max-workers")


def _ignore_pool_signals_until_ready(argv):
    if len(argv) > 1 and argv[1] == "runconsumer" and any(a.split("=")[0] in _POOL_FLAGS for a in argv[2:]):
        for sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(sig, signal.SIG_IGN)


def _catch_early_stop_signals(argv):
    # A TERM during start-up is honoured once the consumers are up (see shoal_common.early_signals).
    if len(argv) > 1 and argv[1] == "runconsumer":
        from shoal_common import early_signals

        early_signals.catch()


def main():
    _catch_early_stop_signals(sys.argv)
    _ignore_pool_signals_until_ready(sys.argv)
    # What `make run` chose (var/env: REDIS_URL, DEBUG, SHOAL_DEMO), so that the README's commands
    # work in any shell of this checkout; the environment's own values win.
    from project.devenv import load_dev_env

    load_dev_env()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import execute_from_command_line

    from django.core.exceptions import ImproperlyConfigured

    from streams_app.exceptions import ConsumerConfigError

    try:
        execute_from_command_line(sys.argv)
    except ConsumerConfigError as exc:
        # Django imports every consumers.py at start-up; an invalid @consumer there (a generator
        # handler, an unknown option) or any error importing it (a missing dependency) is a
        # configuration error: exit 3 with the reason (the exit-code table of docs/operations.md),
        # so a service manager does not restart it in a loop.
        sys.stderr.write(f"Configuration error in consumers.py: {exc}\n")
        sys.exit(3)
    except ImproperlyConfigured as exc:
        # A bad setting (SECRET_KEY unset, LOG_FORMAT=xml, ...) is found while the settings load, before
        # any command runs: say what it is, without a traceback, and exit 3 like other configuration errors.
        sys.stderr.write(f"Configuration error: {exc}\n")
        sys.exit(3)


if __name__ == "__main__":
    main()
