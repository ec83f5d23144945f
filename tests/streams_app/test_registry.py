import functools

import pytest
from asgiref.sync import markcoroutinefunction

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


# -- handler shapes and options (issue 20, 22, 11) ---------------------------------------------------

def _generator(message):
    yield message


async def _async_generator(message):
    yield message


async def _async_handler(message):
    pass


class _AsyncCallable:
    async def __call__(self, message):
        pass


class _GeneratorCallable:
    def __call__(self, message):
        yield message


@pytest.mark.parametrize("handler, error", [
    (_generator, r"_generator is a generator function \(it contains yield\): calling it runs nothing"),
    (functools.partial(_generator), "is a generator function"),
    (_GeneratorCallable(), "is a generator function"),
    (_async_generator, r"is an async generator function \(async def with yield\)"),
    ("not a function", "@consumer decorates a callable taking the message, not str 'not a function'"),
    (None, "not NoneType None"),
])
def test_handlers_whose_call_runs_nothing_are_refused_at_declaration(clean_registry, handler, error):
    with pytest.raises(ConsumerConfigError, match=error):
        consumer("shapes", group="g")(handler)
    assert ("shapes", "g") not in _registry


@pytest.mark.parametrize("handler", [_async_handler, functools.partial(_async_handler), _AsyncCallable(),
                                     markcoroutinefunction(lambda message: _async_handler(message))])
def test_async_handlers_of_every_shape_are_declared_async(clean_registry, handler):
    consumer("shapes", group="g")(handler)
    assert _registry[("shapes", "g")].is_async


def test_sync_handlers_are_declared_sync():
    assert not select(["jobs:a"])[0].is_async and select(["ajobs:a"])[0].is_async


def test_async_handler_with_the_db_guard_is_refused_saying_why_and_what_to_do(clean_registry):
    with pytest.raises(ConsumerConfigError, match=r"idempotent='db' cannot guard an async handler.*"
                                                  r"Django's transactions do not work in async code.*"
                                                  r"Use a sync handler \(def\) with idempotent='db', or "
                                                  r"idempotent='redis'"):
        consumer("shapes", group="g", idempotent="db")(_async_handler)


@pytest.mark.parametrize("option, hint", [
    ("max_delivery", "; did you mean max_deliveries?"),
    ("idempotency", "; did you mean idempotent?"),
    ("retry_back_off", "; did you mean retry_backoff?"),
    ("colour", "."),
])
def test_unknown_options_are_refused_naming_the_closest_valid_one(option, hint):
    with pytest.raises(ConsumerConfigError) as raised:
        consumer("s", group="g", **{option: 1})
    assert str(raised.value).startswith(f"@consumer got an unknown option {option}=1{hint} Valid options: group, ")


# -- trial findings: non-finite back-off, unprintable names, a decorator used wrongly -------------

@pytest.mark.parametrize("backoff", [float("nan"), float("inf"), (float("nan"), 1), (0.1, float("inf")),
                                     (float("-inf"), 1), 10**400])
def test_non_finite_retry_backoff_is_refused_at_declaration(backoff):
    with pytest.raises(ConsumerConfigError, match="retry_backoff must be .*finite"):
        consumer("s", group="g", retry_backoff=backoff)


@pytest.mark.parametrize("stream, group, message", [
    ("s", " ", "group name ' ' is only whitespace"),
    ("s", "\n", "only whitespace"),
    ("s", "a\x00b", "control character"),
    ("s", "a\x1bb", "control character"),
    ("s", "\ud800", "lone surrogate"),
    ("a\x00b", "g", "stream name .* control character"),
    ("\ud800", "g", "stream name .* lone surrogate"),
    ("a\tb", "g", "control character"),
])
def test_unprintable_stream_and_group_names_are_refused_at_declaration(stream, group, message):
    with pytest.raises(ConsumerConfigError, match=message):
        consumer(stream, group=group)


def test_printable_unicode_names_are_fine(clean_registry):
    consumer("commandes:été", group="équipe-1")(lambda message: None)


def test_consumer_without_a_group_or_without_parentheses_says_how_to_declare_one():
    with pytest.raises(ConsumerConfigError, match=r"@consumer needs a stream and a group: @consumer\('o', group='...'\)"):
        consumer("o")

    def handle(message):
        pass

    with pytest.raises(ConsumerConfigError, match="above def handle, not a bare @consumer"):
        consumer(handle)
