"""make_message builds what a handler receives; ShoalTestMixin gives Django's TestCase the capture and runner."""
import decimal

import pytest
from django.test import TestCase

from streams_app import consumer, publish
from streams_app.exceptions import PayloadDecodeError, PublishError
from streams_app.registry import _registry
from streams_app.testing import ShoalTestMixin, make_message
from tests.testapp.models import Effect


def test_make_message_encodes_as_publish_does():
    message = make_message({"total": decimal.Decimal("1.50")}, stream="s", group="g", id="5-0", key="k",
                           headers={"a": 1}, deliveries=3)
    assert (message.id, message.stream, message.group, message.deliveries) == ("5-0", "s", "g", 3)
    assert message.payload == {"total": decimal.Decimal("1.50")} and message.key == "k" and message.headers == {"a": 1}
    assert message.fields["payload_types"] == '{"/total":"decimal"}'  # the typed payload's envelope, as stored
    with pytest.raises(PublishError):
        make_message({"x": float("inf")})
    with pytest.raises(PayloadDecodeError):
        make_message(fields={"payload": "{"}).decode()


class MixinTests(ShoalTestMixin, TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.saved = dict(_registry)

        @consumer("t.mixin", group="g", idempotent="db")
        def write(message):
            Effect.objects.create(name=message.payload, entry_id=message.id)
            publish("t.mixin.done", message.payload)

    @classmethod
    def tearDownClass(cls):
        _registry.clear()
        _registry.update(cls.saved)
        super().tearDownClass()

    def test_publishes_are_captured_and_drained_in_the_tests_transaction(self):
        publish("t.mixin", "one")
        report = self.drain()
        report.assert_handled()
        self.assertEqual(self.published.payloads("t.mixin.done"), ["one"])
        self.assertEqual(list(Effect.objects.values_list("name", flat=True)), ["one"])

    def test_outbox_publishes_appear_with_the_on_commit_callbacks(self):
        with self.captureOnCommitCallbacks(execute=True):
            publish("t.mixin", "two", outbox=True)
            self.assertEqual(len(self.published), 0)
        self.assertEqual(self.published.payloads("t.mixin"), ["two"])
        self.assertTrue(self.run_handlers(self.published.on("t.mixin"))[0].handled)


@pytest.mark.parametrize("stream, error", [
    ("", "stream name must be a non-empty string"),
    ("a{b}", "must not contain '{' or '}'"),
])
def test_make_message_refuses_the_stream_names_publish_refuses(stream, error):
    with pytest.raises(PublishError, match=error):
        make_message({"a": 1}, stream=stream)


@pytest.mark.parametrize("deliveries", [0, -3, True, 1.5])
def test_make_message_refuses_a_delivery_count_below_1(deliveries):
    with pytest.raises(ValueError, match=r"deliveries must be a whole number, 1 or more \(1 is the first delivery\)"):
        make_message({"a": 1}, deliveries=deliveries)


@pytest.mark.parametrize("entry_id", ["not-an-id", "0-0", "5", "5-", "-1-0", " 5-0", "5-0\n"])
def test_make_message_refuses_an_id_that_is_not_an_entry_id(entry_id):
    with pytest.raises(ValueError, match=r"id must be an entry id like '1700000000000-0'"):
        make_message({"a": 1}, id=entry_id)


def test_make_message_takes_a_real_entry_id_and_a_later_delivery():
    message = make_message({"a": 1}, id="1700000000000-7", deliveries=3)
    assert (message.id, message.deliveries) == ("1700000000000-7", 3)
