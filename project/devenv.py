"""``var/env``: what `make run` / `make dev-env` chose, so that ``manage.py`` in another shell agrees.

`make run` picks a Redis (``$REDIS_URL``, the local one, or a private one it starts), turns on
``DEBUG`` and the demo app, and writes those choices here as ``NAME=value`` lines. ``manage.py``
reads the file when it runs with the default settings module (not under the tests'
``DJANGO_SETTINGS_MODULE``), and only for variables the environment does not already set: an
exported ``REDIS_URL`` still wins. Deployments have no ``var/env`` and are unaffected.

No Django imports here: ``manage.py`` reads the file before Django starts.
"""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def env_path(environ=os.environ):
    return Path(environ.get("SHOAL_VAR_DIR") or ROOT / "var") / "env"


def write_env(values, path=None):
    path = path or env_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Written by `make run` / `make dev-env`; read by manage.py in this checkout. Delete to forget.\n"]
    lines += [f"{name}={value}\n" for name, value in values.items()]
    path.write_text("".join(lines))
    return path


def read_env(path=None):
    path = path or env_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            values[name.strip()] = value.strip()
    return values


def load_dev_env(environ=os.environ, path=None):
    """Set the variables of ``var/env`` that ``environ`` lacks; return the names set."""
    if environ.get("DJANGO_SETTINGS_MODULE", "project.settings") != "project.settings":
        return []
    values = read_env(path or env_path(environ))
    added = [name for name in values if name not in environ]
    for name in added:
        environ[name] = values[name]
    return added
