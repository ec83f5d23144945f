"""The WSGI application of this repository's deployment: Django's stock wsgi.py, as a host project has it.

Nothing here loads the URLconf or runs the checks: streams_app.web.gunicorn_conf does, before a worker tells
the master it is ready (streams_app/web/app_check.py), so a deploy that cannot load leaves the old code
serving in any host project, not only in this one.
"""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application = get_wsgi_application()
