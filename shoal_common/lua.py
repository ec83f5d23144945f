"""Lua scripts kept as files in a directory, run by EVALSHA on whichever client runs them.

A restarted Redis (or a failed-over master) that lacks a script answers NOSCRIPT: the script is
loaded and run again. A pipeline gets redis-py's Script, which loads the scripts before executing.
"""
import hashlib
from functools import cache
from pathlib import Path

from redis.client import Pipeline
from redis.cluster import ClusterPipeline
from redis.exceptions import NoScriptError


class LuaScripts:
    def __init__(self, directory):
        self.directory = Path(directory)
        self.source = cache(self._read)
        self.sha = cache(lambda name: hashlib.sha1(self.source(name).encode()).hexdigest())

    def _read(self, name):
        return (self.directory / f"{name}.lua").read_text()

    def run(self, conn, name, keys, args, pipeline=None):
        """Run script ``name`` on ``conn``, or queue it on ``pipeline``."""
        client = pipeline if pipeline is not None else conn
        if isinstance(client, (Pipeline, ClusterPipeline)):
            # register_script only hashes the text; it holds no connection, so any client may run it.
            return conn.register_script(self.source(name))(keys=keys, args=args, client=client)
        # EVALSHA straight away: redis-py's Script object, made and hashed per call, cost as much as
        # a round trip's own client work (the hot paths run a script per task or per chunk).
        try:
            return client.execute_command("EVALSHA", self.sha(name), len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source(name))
            return client.execute_command("EVALSHA", self.sha(name), len(keys), *keys, *args)
