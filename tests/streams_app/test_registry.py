import pytest

from streams_app import consumer
from streams_app.exceptions import ConsumerConfigError
from streams_app.registry import _registry, registered, select, split_selector


@pytest.fixture
def clean_registry():
    saved = dict(_registry)
    yield
    _registry.clear()
    _registry.update(saved)


def test_consumers_modules_are_discovered():
    names = {spec.name for spec in registered()}
    assert {"jobs:a", "jobs:b", "queue:order-processing:workers"} <= names


def test_selector_splits_at_the_last_colon():
    assert split_selector("queue:order-processing:workers") == ("queue:order-processing", "workers")
    [spec] = select(["queue:order-processing:workers"])
    assert (spec.stream, spec.group) == ("queue:order-processing", "workers")


@pytest.mark.parametrize("selector", ["nocolon", ":group", "stream:"])
def test_malformed_selector(selector):
    with pytest.raises(ConsumerConfigError, match="STREAM:GROUP"):
        select([selector])


def test_unknown_selector_lists_registered_ones():
    with pytest.raises(ConsumerConfigError, match=r"no consumer is registered for 'jobs:zzz'. Registered: .*jobs:a"):
        select(["jobs:zzz"])


def test_second_handler_for_one_group_is_refused(clean_registry):
    def one(message):
        pass

    def two(message):
        pass

    consumer("dup", group="g")(one)
    consumer("dup", group="g")(one)  # re-import of the same module is fine
    with pytest.raises(ConsumerConfigError, match="already has a handler"):
        consumer("dup", group="g")(two)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"group": ""}, "group"),
        ({"group": "g", "start": "1"}, "start"),
        ({"group": "g", "batch": 0}, "batch"),
        ({"group": "g", "max_deliveries": 0}, "max_deliveries"),
    ],
)
def test_bad_declarations(kwargs, message):
    with pytest.raises(ConsumerConfigError, match=message):
        consumer("s", **kwargs)
