import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application = get_wsgi_application()

# Import the URLconf (and the views it names) now rather than on the first request: a module that
# cannot be imported then fails the worker's boot, so gunicorn's master keeps the workers that run
# the previous code (shoal_common/web_rollout.py), instead of every request of the new ones failing; and
# a new worker is ready to answer quickly when it says it is.
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018 - the property imports the module
