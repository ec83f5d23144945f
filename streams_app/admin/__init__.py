from streams_app.admin import model_admins  # noqa: F401  (registers the ModelAdmins: Django autodiscovers streams_app.admin)
