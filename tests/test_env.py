import pytest
from django.core.exceptions import ImproperlyConfigured

from project.env import database_from_url


def test_sqlite_relative_and_absolute():
    assert database_from_url("sqlite:///var/db.sqlite3")["NAME"] == "var/db.sqlite3"
    assert database_from_url("sqlite:////tmp/db.sqlite3")["NAME"] == "/tmp/db.sqlite3"


def test_postgres():
    config = database_from_url("postgres://u:p%40ss@db.example:5433/shoal?sslmode=require")
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["USER"], config["PASSWORD"], config["HOST"], config["PORT"], config["NAME"]) == (
        "u", "p@ss", "db.example", "5433", "shoal")
    assert config["OPTIONS"] == {"sslmode": "require"}


def test_unknown_scheme_says_what_is_supported():
    with pytest.raises(ImproperlyConfigured, match="not supported; use one of"):
        database_from_url("oracle://x/y")
