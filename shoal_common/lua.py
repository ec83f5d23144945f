"""Lua scripts kept as files in a directory, registered lazily on whichever client runs them.

redis-py's Script sends EVALSHA and falls back to loading the script, so a restarted Redis or a
pipeline (which loads scripts before executing) needs nothing special.
"""
from functools import cache
from pathlib import Path


class LuaScripts:
    def __init__(self, directory):
        self.directory = Path(directory)
        self.source = cache(self._read)

    def _read(self, name):
        return (self.directory / f"{name}.lua").read_text()

    def run(self, conn, name, keys, args, pipeline=None):
        """Run script ``name`` on ``conn``, or queue it on ``pipeline``."""
        client = pipeline if pipeline is not None else conn
        # register_script only hashes the text; it holds no connection, so any client may run it.
        return conn.register_script(self.source(name))(keys=keys, args=args, client=client)
