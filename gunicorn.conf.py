"""gunicorn settings of this repository's deployment, picked up by ``gunicorn project.wsgi`` run from the
repository root: Shoal's packaged config (streams_app/gunicorn_conf.py, what any host project uses) with
this checkout's var/ and WSGI module."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("SHOAL_VAR_DIR", str(ROOT / "var"))

from streams_app.gunicorn_conf import *  # noqa: E402,F401,F403

wsgi_app = "project.wsgi"
