"""LOG_FORMAT=json: one JSON object per line, with the consumer's context."""
import json

from streams_app import publish
from tests.waiting import wait_for


def test_log_format_json_gives_one_object_per_line_with_the_consumer_context(run_consumer, redis):
    proc = run_consumer("jobs:a", env={"LOG_FORMAT": "json"})
    publish("jobs", {"n": 1})
    wait_for(lambda: redis.llen("handled:jobs:a") == 1, timeout=60, what="the entry to be handled")
    proc.signal(2)
    assert proc.wait(timeout=60) == 0, proc.output()
    lines = [line for line in proc.output().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    shoal = [r for r in records if r["logger"].startswith("streams_app")]
    assert shoal and all({"time", "level", "pid", "message"} <= r.keys() for r in shoal)
    started = next(r for r in shoal if "started" in r["message"])
    assert started["selector"] == "jobs:a" and started["consumer"] in started["message"]


def test_an_unknown_log_format_is_a_clear_error(run_consumer):
    proc = run_consumer("jobs:a", env={"LOG_FORMAT": "xml"})
    assert proc.wait(timeout=60) == 3, proc.output()  # a configuration error: no restart
    assert "Configuration error: LOG_FORMAT='xml': use plain (the default) or json." in proc.output()
    assert "Traceback" not in proc.output()
