import pytest


@pytest.fixture(autouse=True)
def _nudges_on(monkeypatch):
    """Each test starts with nudges on: a failed nudge (Redis away) quiets them for a sweep interval per process."""
    from streams_app.outbox import enqueue

    monkeypatch.setattr(enqueue, "_quiet_until", 0.0)
