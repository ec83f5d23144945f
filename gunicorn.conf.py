"""gunicorn settings of this repository's deployment, picked up by ``gunicorn project.wsgi`` run from the
repository root: Shoal's packaged config (streams_app/web/gunicorn_conf.py, what any host project uses) with
this checkout's var/ (and the var/env that `make dev-env` writes) and WSGI module."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("SHOAL_VAR_DIR", str(ROOT / "var"))

# What `make run` / `make dev-env` chose (var/env: DEBUG, REDIS_URL, SHOAL_DEMO), as manage.py reads it:
# `gunicorn project.wsgi` in a new shell of this checkout then works as docs/serving.md says (it failed
# with "SECRET_KEY is not set"). The environment's own values win; a deployment has no var/env. Before
# the packaged config, which reads the environment (WEB_CONCURRENCY, ...); devenv imports no Django.
from project.devenv import load_dev_env  # noqa: E402

load_dev_env()

from streams_app.web.gunicorn_conf import *  # noqa: E402,F401,F403

wsgi_app = "project.wsgi"
