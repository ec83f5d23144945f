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

# The system checks too: a setting `manage.py check` refuses (STREAMS["PARTITIONS"] = "not-a-number")
# is a deploy that cannot load, like an import error; rolled out, it would serve with a broken
# configuration. Only errors stop the boot; database checks are left to `migrate`/`check --database`.
from django.core import checks  # noqa: E402

_errors = [str(e) for e in checks.run_checks() if e.is_serious() and not e.is_silenced()]
if _errors:
    raise RuntimeError("The system checks found errors; this worker will not serve:\n" + "\n".join(_errors))
