"""shoal_common/lua.py: scripts run by EVALSHA, loaded again when Redis lacks them."""
from streams_app.redis import scripts

ARGS = ["2026-01-01T00:00:00+00:00", "{}", 60]


def test_a_script_redis_no_longer_has_is_loaded_and_run(redis):
    # A restarted Redis, or a replica promoted after a failover, starts with no scripts.
    redis.script_flush()
    assert redis.script_exists(scripts.sha("task_cancel")) == [False]
    first = scripts.run(redis, "task_cancel", ["shoal:task:{nope}"], ARGS)
    assert redis.script_exists(scripts.sha("task_cancel")) == [True]
    redis.script_flush()
    assert scripts.run(redis, "task_cancel", ["shoal:task:{nope}"], ARGS) == first


def test_a_pipeline_queues_the_script_and_loads_it_first(redis):
    redis.script_flush()
    pipe = redis.pipeline(transaction=False)
    scripts.run(redis, "task_cancel", ["shoal:task:{nope}"], ARGS, pipeline=pipe)
    assert len(pipe.execute()) == 1
    assert redis.script_exists(scripts.sha("task_cancel")) == [True]
