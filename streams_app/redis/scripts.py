"""The Lua scripts of streams_app (streams_app/lua/), run through shoal_common.lua."""
from pathlib import Path

from shoal_common.lua import LuaScripts

_scripts = LuaScripts(Path(__file__).resolve().parent.parent / "lua")  # streams_app/lua: this room is one level down
source = _scripts.source
run = _scripts.run
sha = _scripts.sha
