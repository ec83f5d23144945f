from importlib import import_module

from django.apps import AppConfig, apps
from django.utils.module_loading import module_has_submodule


class StreamsConfig(AppConfig):
    name = "streams_app"
    verbose_name = "Streams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from shoal_common.broadcasting import add_loggers
        from streams_app import broadcast, checks  # noqa: F401  (registers the system checks and the built-in broadcasts)

        add_loggers("streams_app")

        # Like admin.py: every installed app's consumers.py declares its @consumer handlers.
        import_consumers_modules()
        # The queues of a StreamsBackend in TASKS are consumers too (streams_app/tasks/setup.py).
        from streams_app.tasks import checks as task_checks  # noqa: F401  (registers the TASKS checks)
        from streams_app.tasks.setup import install

        install()  # the shoal_tasks_* counters are counted by the backend itself (streams_app/tasks/counting.py)


def import_consumers_modules():
    """Import each installed app's consumers.py; any error there is a ConsumerConfigError naming it.

    manage.py turns a ConsumerConfigError at start-up into a one-line message and exit 3 (a
    configuration error: restarting will not help), where an ImportError or a TypeError in a
    consumers.py would otherwise be a traceback and exit 1, which service managers restart.
    """
    from streams_app.exceptions import ConsumerConfigError

    for config in apps.get_app_configs():
        if not module_has_submodule(config.module, "consumers"):
            continue
        name = f"{config.name}.consumers"
        try:
            import_module(name)
        except ConsumerConfigError:
            raise
        except Exception as exc:
            where = _where(exc, name)
            raise ConsumerConfigError(f"importing {name} failed{where}: {type(exc).__name__}: {exc}") from exc


def _where(exc, module):
    """`` (path, line N)`` of the deepest frame of ``exc`` in ``module``'s file, or ''."""
    import traceback

    path = module.replace(".", "/") + ".py"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(path)]
    if isinstance(exc, SyntaxError) and exc.filename and exc.filename.endswith(path):
        return f" ({exc.filename}, line {exc.lineno})"
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
