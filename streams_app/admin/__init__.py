from streams_app.admin import model_admins  # noqa: F401  (registers the ModelAdmins: Django autodiscovers streams_app.admin)
from streams_app.outbox import admin as outbox_admin  # noqa: F401,E402  (the outbox's ModelAdmin)
from streams_app.admin import replay_jobs  # noqa: F401,E402  (the ReplayJob ModelAdmin)
from streams_app.tasks import api_available  # noqa: E402

if api_available():  # the Tasks page needs Django's Tasks API: Django 6, or on 5.2 the `tasks` extra
    from streams_app.admin import tasks  # noqa: F401  (the Tasks page: Django Tasks' results)
    from streams_app.admin import schedules  # noqa: F401  (the Schedules page: periodic tasks)
