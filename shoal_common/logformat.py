"""Structured logs: ``LOG_FORMAT=json`` writes one JSON object per line.

Every line carries the time, level, logger, pid and message; where they apply, the consumer name,
selector, stream and group too. Those come from the record itself (``extra=``) or from the context
a process or thread declared with ``set_context`` (a worker names its consumer and selectors once;
each read loop's thread names its stream and group), so existing log calls need no change.
"""
import json
import logging
import threading
from datetime import datetime, UTC

CONTEXT_FIELDS = ("consumer", "selector", "stream", "group")
_process = {}
_thread = threading.local()


def set_context(*, thread=False, **fields):
    """Fields added to every structured line of this process (or, with ``thread=True``, this thread)."""
    target = _thread.__dict__ if thread else _process
    target.update({k: v for k, v in fields.items() if v is not None})


def context():
    return {**_process, **getattr(_thread, "__dict__", {})}


class JsonFormatter(logging.Formatter):
    def format(self, record):
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        fields = context()
        fields.update({name: getattr(record, name) for name in CONTEXT_FIELDS if hasattr(record, name)})
        line.update({name: str(fields[name]) for name in CONTEXT_FIELDS if fields.get(name) is not None})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)
