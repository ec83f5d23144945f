"""Testing code that uses Shoal, without Redis: capture what is published, run handlers in process.

    from streams_app.testing import capture_publishes, drain, make_message, run_handlers

docs/testing.md explains each helper, the pytest fixtures (``streams_app.testing.pytest_plugin``) and
the ``TestCase`` mixin (``ShoalTestMixin``).
"""
from streams_app.testing.capture import Published, capture_publishes, capturing
from streams_app.testing.handlers import Delivery, Report, Status, drain, run_handlers
from streams_app.testing.messages import make_message, new_entry_id
from streams_app.testing.mixins import ShoalTestMixin

__all__ = [
    "Delivery", "Published", "Report", "ShoalTestMixin", "Status", "capture_publishes", "capturing", "drain",
    "make_message", "new_entry_id", "run_handlers",
]
