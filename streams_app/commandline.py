"""``execute_from_command_line`` for a host project's manage.py: Django's, plus what Shoal's daemons need.

    # manage.py
    def main():
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
        from streams_app.commandline import execute_from_command_line

        execute_from_command_line(sys.argv)

What it adds to Django's:
- a configuration error found while Django starts (an invalid ``@consumer`` or a failing import in a
  consumers.py, a bad setting, a ``@task`` its backend refuses as its module is imported) is one line on stderr and exit 3 (the exit-code table of
  docs/operations.md), not a traceback and exit 1, which a service manager would restart in a loop;
- ``runconsumer`` honours a TERM that arrives while Django starts (shoal_common.early_signals), and a
  supervisor (``--workers``/``--min-workers``/``--max-workers``) is neither killed by HUP nor stopped by
  TTIN/TTOU before its own handlers are in place.

Nothing of Django is imported before the signals are caught: that import is the slow part of start-up.
"""
import signal
import sys

from shoal_common.exitcodes import EXIT_CONFIG

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


def execute_from_command_line(argv=None):
    argv = sys.argv if argv is None else argv
    _catch_early_stop_signals(argv)
    _ignore_pool_signals_until_ready(argv)
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line as django_execute

    from streams_app.exceptions import ConsumerConfigError

    try:
        django_execute(argv)
    except ConsumerConfigError as exc:
        # Django imports every consumers.py at start-up; an invalid @consumer there (a generator
        # handler, an unknown option) or any error importing it (a missing dependency) is a
        # configuration error: restarting will not help.
        sys.stderr.write(f"Configuration error in consumers.py: {exc}\n")
        sys.exit(EXIT_CONFIG)
    except ImproperlyConfigured as exc:
        # A bad setting (SECRET_KEY unset, LOG_FORMAT=xml, ...) is found while the settings load, before
        # any command runs: say what it is, without a traceback.
        sys.stderr.write(f"Configuration error: {exc}\n")
        sys.exit(EXIT_CONFIG)
    except Exception as exc:
        where = _task_declaration(exc)
        if where is None:
            raise
        # A @task its backend refuses (an unknown queue_name, a bad priority) raises while its module
        # is imported, often by the URL check (urls -> views -> tasks): the declaration, in one line.
        sys.stderr.write(f"Configuration error: the @task at {where} is refused by its backend: {exc} "
                         "(a task's queue_name must be in its backend's TASKS QUEUES; docs/tasks.md)\n")
        sys.exit(EXIT_CONFIG)


def _task_declaration(exc):
    """"file:line" of the @task declaration ``exc`` (Django's InvalidTaskError) was raised for while its
    module was imported (InvalidTask on Django 6, InvalidTaskError in the backport); None for any other
    exception (a traceback, as ever)."""
    import os
    import traceback

    if type(exc).__name__ not in ("InvalidTask", "InvalidTaskError") or type(exc).__module__ not in (
            "django.tasks.exceptions", "django_tasks.exceptions"):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    if not any(frame.filename.startswith("<frozen importlib") for frame in frames):
        return None  # raised by a call, not by an import: the caller's own error
    packages = tuple(os.path.dirname(sys.modules[name].__file__) + os.sep
                     for name in ("django", "django_tasks", "streams_app") if name in sys.modules)
    ours = [frame for frame in frames if not frame.filename.startswith(("<", *packages))]
    return f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "an imported module"
