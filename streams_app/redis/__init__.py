"""What streams_app knows of Redis: its connections (connection), key names (keys), the Lua scripts
of streams_app/lua (scripts), entry ids (entry_ids), stream names (names) and groups' lag (lag).

Every module here imports the redis library as ``import redis`` (absolute imports only): this
package is ``streams_app.redis`` and never shadows it.
"""
