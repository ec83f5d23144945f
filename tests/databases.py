"""Databases for tests that run real processes (``manage.py runconsumer``, ``runreclaimer``).

pytest-django's test database lives inside the test process; a subprocess cannot see it. These
helpers make a migrated database a subprocess reaches through ``DATABASE_URL``, on SQLite (a file)
or on PostgreSQL (a database created for this test run, with a unique name so parallel checkouts on
one server never collide, dropped at the end).

PostgreSQL is the server on ``SHOAL_TEST_PG`` (default ``postgres://postgres@127.0.0.1:5432``, the
trust-auth server of the development machines). When none answers, PostgreSQL tests are skipped
with a reason that says where we looked.

Use the ``process_database`` fixture (tests/conftest.py): parametrized over both engines, each
test starts with empty application tables.
"""
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = os.environ.get("SHOAL_TEST_PG", "postgres://postgres@127.0.0.1:5432")
# Emptied before each test: the apps' own tables. Django's (auth, contenttypes, migrations) stay.
APP_TABLE_PREFIXES = ("streams_app_", "discovery_app_", "testapp_", "django_admin_log")


def migrate(url):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"],
                   cwd=ROOT, env=env, check=True, timeout=300)


class SqliteDatabase:
    kind = "sqlite"

    def __init__(self, path):
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"

    def create(self):
        migrate(self.url)
        return self

    def rows(self, sql, params=()):
        with sqlite3.connect(self.path, timeout=30) as conn:
            return conn.execute(sql.replace("%s", "?"), params).fetchall()

    def empty(self):
        with sqlite3.connect(self.path, timeout=30) as conn:
            tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                      if t.startswith(APP_TABLE_PREFIXES)]
            for table in tables:
                conn.execute(f'DELETE FROM "{table}"')

    def drop(self):
        self.path.unlink(missing_ok=True)


class PostgresUnavailable(Exception):
    pass


class PostgresDatabase:
    """A database of its own on the test PostgreSQL server: ``create()``, ``url``, ``rows()``, ``drop()``."""

    kind = "postgres"

    def __init__(self, server=PG_SERVER, name=None):
        self.server = server.rstrip("/")
        self.name = name or f"shoal_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.url = f"{self.server}/{self.name}"

    def _admin(self):
        import psycopg

        parts = urlsplit(self.server)
        try:
            return psycopg.connect(host=parts.hostname, port=parts.port or 5432, user=parts.username or "postgres",
                                   password=parts.password or None, dbname="postgres", autocommit=True,
                                   connect_timeout=5)
        except psycopg.OperationalError as exc:
            raise PostgresUnavailable(f"no PostgreSQL answered at {self.server} ({str(exc).strip()}); "
                                      "set SHOAL_TEST_PG=postgres://user:pw@host:port to use another") from None

    def create(self):
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        migrate(self.url)
        return self

    def connect(self):
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def rows(self, sql, params=()):
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def empty(self):
        with self.connect() as conn:
            tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                      if t.startswith(APP_TABLE_PREFIXES)]
            if tables:
                conn.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE")

    def drop(self):
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
