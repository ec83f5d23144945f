"""shoal_common.connections keeps django-redis's client per thread: it must stay the client Django would give."""
import threading

from django_redis import get_redis_connection

from streams_app import publish
from streams_app.redis.connection import get_connection


def test_a_thread_keeps_the_client_django_gives_that_thread(redis):
    assert get_connection() is get_redis_connection("default")
    seen = {}

    def in_thread():
        seen["kept"], seen["django"] = get_connection(), get_redis_connection("default")
        seen["again"] = get_connection()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen["kept"] is seen["django"] is seen["again"]
    assert seen["kept"] is not get_connection()  # Django gives each thread a backend of its own
    assert get_connection() is get_redis_connection("default")


def test_publish_follows_caches_to_another_server(redis, redis_factory, use_redis):
    publish("orders", {"n": 1})
    other = redis_factory()
    use_redis(other)  # changes CACHES: the kept client must go with Django's
    publish("orders", {"n": 2})
    assert redis.xlen("orders") == 1
    assert other.client().xlen("orders") == 1
