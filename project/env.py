"""Reading settings from the environment, with errors that say what to fix."""
import os
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

_ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
}


def env_bool(name, default=False):
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off.")


def env_int(name, default=0):
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number of 0 or more.")
    return value


def env_list(name, default=()):
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url):
    """Turn ``sqlite:///var/db.sqlite3`` or ``postgres://user:pw@host:5432/name`` into a DATABASES entry."""
    parts = urlsplit(url)
    engine = _ENGINES.get(parts.scheme)
    if engine is None:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {parts.scheme!r} is not supported; use one of {', '.join(sorted(_ENGINES))}."
        )
    if parts.scheme == "sqlite":
        # sqlite:///relative/path and sqlite:////absolute/path, as dj-database-url reads them.
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ImproperlyConfigured("DATABASE_URL sqlite:/// needs a file path, e.g. sqlite:///var/db.sqlite3.")
        return {"ENGINE": engine, "NAME": path}
    config = {
        "ENGINE": engine,
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 60,
    }
    options = dict(parse_qsl(parts.query))
    if options:
        config["OPTIONS"] = options
    return config
