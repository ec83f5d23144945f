import pytest

from streams_app.registry import _registry


@pytest.fixture
def clean_registry():
    """Consumers a test declares are gone after it."""
    saved = dict(_registry)
    yield
    _registry.clear()
    _registry.update(saved)
