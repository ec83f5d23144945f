"""Django's Tasks framework on Shoal: ``TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend"}}``
(docs/tasks.md). The backend is imported lazily, so projects without django.tasks or the django-tasks
backport can import streams_app.tasks.setup."""


def __getattr__(name):
    if name == "StreamsBackend":
        from streams_app.tasks.backend import StreamsBackend

        return StreamsBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
