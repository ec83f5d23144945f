import pytest

from tests.serving.gunicorn_process import Gunicorn
from tests.serving.hup_site import make_site


@pytest.fixture
def gunicorn(tmp_path, redis_server):
    """Start real gunicorn masters with gunicorn.conf.py against the test Redis; stopped at teardown."""
    started = []

    def start(*, workers=2, args=(), env=None, directory=None, wait=True):
        server = Gunicorn(directory or tmp_path / f"gunicorn{len(started)}", redis_server.url,
                          workers=workers, args=args, env=env)
        started.append(server)
        return server.start() if wait else server.launch()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def site(tmp_path):
    """A settings module whose URLconf adds /version, answered by a view module the test rewrites."""
    return make_site(tmp_path / "site")
