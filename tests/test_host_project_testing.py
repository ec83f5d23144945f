"""docs/testing.md's complete example, in a fresh ``django-admin startproject`` with Shoal installed from the
wheel: the documented tests pass with ``pytest`` and with ``manage.py test``, with no Redis server (the
settings name one where nothing listens), and a handler's failure is reported with its exception."""
import re
import subprocess
import sys
from importlib.metadata import version

import django
import pytest

from tests.host_project import ROOT, build_wheel, host_env, make_host_project, run

pytestmark = pytest.mark.install

EXAMPLE_BLOCK = re.compile(r"<!-- testing-example: (?P<file>[\w./]+) -->\n```\w*\n(?P<body>.*?)```", re.S)
NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def example_files():
    return {m["file"]: m["body"] for m in EXAMPLE_BLOCK.finditer((ROOT / "docs" / "testing.md").read_text())}


def test_docs_testing_has_the_example_files():
    assert {"shop/models.py", "shop/views.py", "shop/consumers.py", "host/urls.py", "conftest.py", "pytest.ini",
            "shop/test_flow.py", "shop/tests.py"} <= set(example_files())


@pytest.mark.timeout(1200)
def test_the_documented_tests_run_without_redis(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    env = host_env(venv, NO_REDIS, tmp_path)
    run([python, "-m", "pip", "install", "--quiet", str(wheel), f"Django=={django.get_version()}",
         f"pytest=={version('pytest')}", f"pytest-django=={version('pytest-django')}"], cwd=tmp_path, env=env)
    site = tmp_path / "site"
    site.mkdir()
    make_host_project(site, venv, env)
    for name, body in example_files().items():
        with open(site / name, "a" if name == "host/urls.py" else "w") as f:
            f.write("\n" + body)
    run([python, "manage.py", "makemigrations", "shop", "--verbosity", "0"], cwd=site, env=env)

    out = run([str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider"], cwd=site, env=env)
    assert "3 passed" in out, out
    tests = subprocess.run([python, "manage.py", "test", "shop", "--verbosity", "2"], cwd=site, env=env,
                           capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0 and "Ran 2 tests" in tests.stderr, tests.stdout + tests.stderr
