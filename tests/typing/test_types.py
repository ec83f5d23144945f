"""The public API's annotations catch mistakes: mypy (strict, mypy.ini) passes on tests/typing/example.py
and fails on a copy of the same calls with wrong arguments."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (requirements/base.txt pins it; make deps)")

WRONG = '''
from streams_app import Message, consumer, publish, publish_many
from streams_app.testing import make_message, run_handlers

publish(42, {"id": 1})  # line 5: the stream is a str
publish("orders", {"id": 1}, key=7)  # line 6
publish_many("orders", [1], keys="abc", maxlen="10")  # line 7: maxlen is an int


@consumer("orders", group="g", max_deliveries="3")  # line 10
def handle(message: Message) -> None: ...


@consumer("orders", group="g2", idempotent="yes")  # line 14: "redis", "db" or None
def handle2(message: Message) -> None: ...


@consumer("orders", group="g3")  # line 18: a handler takes the message
def handle3(message: int) -> None: ...


run_handlers(make_message(1, deliveries="2"))  # line 22
entry_id: int = publish("orders", 1)  # line 23: publish returns str | None

from discovery_app.client import DiscoveryClient  # noqa: E402

DiscoveryClient().resolve("billing", tags=3)  # line 27: tags are a collection of str
'''


def mypy(*paths, cache_dir=None):
    # A cache of its own per call: mypy's cache in the checkout remembered "wrong" under an earlier run's temporary
    # path (each version-matrix session runs this test again) and reported its errors there.
    cache = ["--cache-dir", str(cache_dir)] if cache_dir is not None else []
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), *cache,
                           *map(str, paths)], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_typed_example_passes_mypy_strict():
    result = mypy(ROOT / "tests" / "typing" / "example.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_wrong_arguments_fail_mypy(tmp_path):
    example = tmp_path / "wrong.py"
    example.write_text(WRONG)
    result = mypy(example, cache_dir=tmp_path / "mypy_cache")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = {int(line.split(":")[1]) for line in result.stdout.splitlines() if line.startswith(str(example))}
    assert {5, 6, 7, 10, 14, 18, 22, 23, 27} <= lines, result.stdout
