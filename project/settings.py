"""Shoal settings. Everything a deployment changes comes from the environment."""
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from project.env import database_from_url, env_bool, env_int, env_list
from shoal_common.cache import redis_cache

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SHOAL_VAR_DIR", BASE_DIR / "var"))

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and not env_bool("SHOAL_INSECURE_DEV_KEY", False):
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Export SECRET_KEY (any long random string), "
            "or set DEBUG=1 for local development."
        )
    # Development only: a fixed key is fine where DEBUG is on and nothing is exposed.
    SECRET_KEY = "insecure-development-key-do-not-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])

# HTTPS (docs/serving.md). Behind a TLS-terminating proxy, Django must be told the request was https,
# or a login through it fails the CSRF origin check (403): trust the proxy's X-Forwarded-Proto, and
# list the public origins. Cookies are secure unless DEBUG; redirects and HSTS are opt-in, since
# HSTS cannot be taken back by the server.
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Probes and metrics scrapes come over plain HTTP inside the cluster (/healthz and /readyz answer
# before SecurityMiddleware anyway).
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "shoal_common",  # templates both apps' admin pages use (confirmation, mirror age)
    "streams_app",
    "discovery_app",
]
if env_bool("SHOAL_DEMO", False):
    INSTALLED_APPS.append("demo")
    # demo/tasks.py: a Django Task on Shoal (docs/tasks.md); runconsumer runs the queue beside the consumers.
    TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend", "QUEUES": ["default"]}}

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    # /healthz and /readyz answer here, before host validation, sessions and auth.
    "streams_app.web.health.HealthCheckMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "project.csp.AdminContentSecurityPolicyMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "project" / "templates"],  # the admin index that shows the control-room summary
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

DATABASES = {
    "default": database_from_url(os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")),
}
# SQLite is shared by several processes here (under `make run`: the producer, the outbox relay, the
# admin mirror, gunicorn), which SQLite's defaults serve badly: in rollback-journal mode a reader
# blocks a writer, the busy timeout is 5 s, and a transaction that read first and then writes is
# refused at once ("database is locked", no waiting) when another process wrote in between. So: WAL
# (readers and the one writer no longer block each other; the mode is kept in the file), a 30 s busy
# timeout, and the write lock taken at BEGIN in every atomic block (transaction_mode, Django 5.1+).
# synchronous=NORMAL is WAL's usual companion: a killed process loses nothing, a power cut may lose the
# last commits. docs/install.md gives host projects the same advice.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
    }

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# Serving (streams_app/web/gunicorn_conf.py, streams_app/web/health.py).
READYZ_TIMEOUT = float(os.environ.get("READYZ_TIMEOUT", "1.0"))  # seconds Redis and the database get to answer /readyz
WEB_SERVICE_NAME = os.environ.get("WEB_SERVICE_NAME", "shoal-web")  # this web tier's name in the discovery registry
PROMETHEUS_EXPORT_MIGRATIONS = False  # django-prometheus would query the database in every process at start-up

# django-redis owns the Redis connections. Its pools are per process (redis-py resets a pool
# it finds was created before fork()), so forked consumer workers never share a socket.
CACHES = {"default": redis_cache(REDIS_URL)}

STREAMS = {}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO").upper()
# LOG_FORMAT=json: one JSON object per line (shoal_common/logformat.py), for log shippers.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").lower()
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use plain (the default) or json.")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"},
        "json": {"()": "shoal_common.logformat.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "streams_app": {"level": LOG_LEVEL},
        "discovery_app": {"level": LOG_LEVEL},
        "demo": {"level": LOG_LEVEL},
        # Probes and scanners are not news: a 404 or 400 is the client's business (django.request
        # logs 4xx as WARNING), and a request with a Host outside ALLOWED_HOSTS is dropped with a 400
        # and no 14-line traceback. Server errors (5xx) are still logged; /readyz's 503 is not an
        # error of this process (streams_app/web/health.py marks it logged).
        "django.request": {"level": "ERROR"},
        "django.security.DisallowedHost": {"handlers": [], "level": "CRITICAL", "propagate": False},
    },
}
