"""The Lua scripts of streams_app, registered lazily on whichever client runs them.

redis-py's Script sends EVALSHA and falls back to loading the script, so a restarted Redis or a
pipeline (which loads scripts before executing) needs nothing special.
"""
from functools import cache
from pathlib import Path

_DIR = Path(__file__).resolve().parent / "lua"


@cache
def source(name):
    return (_DIR / f"{name}.lua").read_text()


def run(conn, name, keys, args, pipeline=None):
    client = pipeline if pipeline is not None else conn
    # register_script only hashes the text; it holds no connection, so any client may run it.
    return conn.register_script(source(name))(keys=keys, args=args, client=client)
