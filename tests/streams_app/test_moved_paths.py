"""The old paths of the modules that moved into rooms (issue 49) still work: streams_app.MOVED's finder
makes each old name the new module itself, with one DeprecationWarning naming the new path."""
import importlib
import subprocess
import sys
import warnings
from unittest import mock

import pytest

import streams_app
from streams_app import MOVED
from tests.serving.gunicorn_process import ROOT, Gunicorn
from tests.waiting import wait_for

# Importing the gunicorn config sets PROMETHEUS_MULTIPROC_DIR and more in os.environ: that one is
# imported in subprocesses only.
IN_PROCESS = sorted(old for old in MOVED if old != "streams_app.gunicorn_conf")


@pytest.fixture
def forget_old_names(monkeypatch):
    """Each test sees the old names as a fresh process does: not imported yet."""
    for old in MOVED:
        monkeypatch.delitem(sys.modules, old, raising=False)
        monkeypatch.delattr(streams_app, old.rsplit(".", 1)[1], raising=False)
    yield
    for old in MOVED:  # what the test imported by an old name, gone again
        sys.modules.pop(old, None)
        vars(streams_app).pop(old.rsplit(".", 1)[1], None)


@pytest.mark.parametrize("old", IN_PROCESS)
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(forget_old_names, old):
    new = MOVED[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} has moved to {new}\b") as caught:
        module = importlib.import_module(old)
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1
    assert module is importlib.import_module(new)
    assert sys.modules[old] is module and module.__name__ == new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is module  # once per process: the second import is silent


def test_from_an_old_path_import_a_name(forget_old_names):
    with pytest.warns(DeprecationWarning, match="streams_app.publishing.producer"):
        from streams_app.producer import publish
    from streams_app.publishing.producer import publish as new

    assert publish is new is streams_app.publish


def test_a_mock_target_by_an_old_path_patches_the_new_module(forget_old_names):
    from streams_app.publishing import producer

    with pytest.warns(DeprecationWarning), mock.patch("streams_app.producer.set_publish_hook") as patched:
        assert producer.set_publish_hook is patched


def test_names_that_did_not_move_are_untouched():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module("streams_app.registry").__name__ == "streams_app.registry"
    for name in ("streams_app.nosuch", "streams_app.producers", "streams_app.web.producer"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


def test_the_gunicorn_config_by_its_old_path_in_a_fresh_interpreter(tmp_path):
    probe = ("import warnings; warnings.simplefilter('always')\n"
             "from streams_app.gunicorn_conf import when_ready\n"
             "import streams_app.web.gunicorn_conf as new\n"
             "assert when_ready is new.when_ready\n")
    env = {"PATH": "/usr/bin:/bin", "SHOAL_VAR_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("has moved to") == 1, out.stderr
    assert "streams_app.gunicorn_conf has moved to streams_app.web.gunicorn_conf" in out.stderr


@pytest.mark.slow
def test_gunicorn_started_as_the_readme_said_serves(tmp_path, redis_server):
    # README: gunicorn -c python:streams_app.gunicorn_conf mysite.wsgi (here the repository's own wsgi).
    server = Gunicorn(tmp_path / "old", redis_server.url, workers=1,
                      env={"PYTHONWARNINGS": "always::DeprecationWarning"})
    server.args[server.args.index("-c") + 1] = "python:streams_app.gunicorn_conf"
    try:
        server.start()
        assert server.get("/healthz")[0] == 200
        wait_for(lambda: "has moved to streams_app.web.gunicorn_conf" in server.output(), timeout=10,
                 what="the master's DeprecationWarning")
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.output()
