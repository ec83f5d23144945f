"""One namespaced settings dict per app (``STREAMS``, ``DISCOVERY``), merged over documented defaults.

Read lazily and cached; the cache is dropped when a test changes the setting (``setting_changed``).
Validation is each app's system checks' job, so a malformed dict falls back to the defaults here.
"""
import math
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.core.signals import setting_changed


def namespaced_settings(name, defaults):
    """Return ``get_settings()``: ``settings.<name>`` merged over ``defaults``."""

    @cache
    def get_settings():
        user = getattr(settings, name, None) or {}
        return {**defaults, **(user if isinstance(user, dict) else {})}

    def reset(*, setting, **kwargs):
        if setting == name:
            get_settings.cache_clear()

    setting_changed.connect(reset, weak=False)
    return get_settings


# -- one table per app: name, default, kind and doc of every key ------------------------------
#
# Each app's defaults.py declares its keys once, as a SETTINGS table; the defaults dict, the
# type checks (the app's system checks call ``kind_errors``) and the table in docs/settings.md
# (python -m project.settings_docs; a test fails when it drifts) all come from it.


@dataclass(frozen=True)
class Kind:
    name: str  # as the docs and the check's message say it
    accepts: object = None  # value -> bool; None: a check of the app's own validates it
    most: object = None  # the largest value the code and Redis can take (a huge finite value must fail check)
    why: str = ""  # what the bound protects, for the check's message


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# Bounds: seconds reach time.sleep / datetime / Redis expiries (EX is turned into milliseconds in a
# 64-bit integer; Python's clocks count nanoseconds in one), so ~31 years is the most a duration may be;
# counts stay exact as floats and far inside Redis' 64-bit integers.
MOST_SECONDS = 10**9
MOST_MILLISECONDS = MOST_SECONDS * 1000
MOST_COUNT = 2**53
_SECONDS_WHY = "about 31 years; longer cannot be slept, stored as a timestamp or sent to Redis as an expiry"

POSITIVE_INT = Kind("positive integer", _positive_int, MOST_COUNT, "the largest integer exact in a float")
POSITIVE_NUMBER = Kind("positive number", lambda v: _number(v) and v > 0, MOST_SECONDS, _SECONDS_WHY)
# Integers that are durations: the same names in the docs, the duration bounds above.
SECONDS_INT = Kind("positive integer", _positive_int, MOST_SECONDS, _SECONDS_WHY)
MILLISECONDS_INT = Kind("positive integer", _positive_int, MOST_MILLISECONDS, _SECONDS_WHY)
NON_EMPTY_STRING = Kind("non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
BOOLEAN = Kind("boolean", lambda v: isinstance(v, bool))


@dataclass(frozen=True)
class Setting:
    name: str
    default: object
    kind: Kind
    doc: str
    check_id: str = "E003"  # the system check id of a value not of its kind


def defaults_of(table):
    return {s.name: s.default for s in table}


def kind_errors(namespace, table, merged, app_label):
    """An Error for each key whose value is not of its kind (keys a check of the app's own validates are skipped)."""
    from django.core.checks import Error

    errors = []
    for s in table:
        value = merged.get(s.name, s.default)
        if s.kind.accepts is None:
            continue
        hint = f"Default: {s.default!r}. {first_sentence(s.doc)}"
        if not s.kind.accepts(value):
            errors.append(Error(f"{namespace}[{s.name!r}] must be a {s.kind.name}, not {value!r}.",
                                hint=hint, id=f"{app_label}.{s.check_id}"))
        elif s.kind.most is not None and value > s.kind.most:
            errors.append(Error(f"{namespace}[{s.name!r}] must be at most {s.kind.most:,} ({s.kind.why}), not {value!r}.",
                                hint=hint, id=f"{app_label}.{s.check_id}"))
    return errors


def first_sentence(doc):
    text = " ".join(doc.split())
    return text.split(". ")[0].rstrip(".") + "."


def markdown_table(table):
    """The docs' table of ``table``: key, default, type, what it does."""
    rows = ["| key | default | type | what it does |", "|---|---|---|---|"]
    for s in table:
        doc = " ".join(s.doc.split()).replace("|", "\\|")
        rows.append(f"| `{s.name}` | `{s.default!r}` | {s.kind.name} | {doc} |")
    return "\n".join(rows) + "\n"
