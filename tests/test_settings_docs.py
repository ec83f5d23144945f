"""Settings come from one table per app; the docs are generated from it and fail here when they drift."""
import re
from pathlib import Path

from django.core.checks import run_checks

from discovery_app.defaults import DEFAULTS as DISCOVERY_DEFAULTS
from discovery_app.defaults import SETTINGS as DISCOVERY_SETTINGS
from project import settings_docs
from streams_app.defaults import DEFAULTS as STREAMS_DEFAULTS
from streams_app.defaults import SETTINGS as STREAMS_SETTINGS

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "settings.md").read_text()


def test_docs_settings_tables_are_generated_from_the_tables():
    assert settings_docs.main(["--check"]) == 0, "run `python -m project.settings_docs`"


def test_a_drifted_docs_table_is_found():
    drifted = DOC.replace("| `BATCH_SIZE` | `500` |", "| `BATCH_SIZE` | `100` |")
    assert drifted != DOC and settings_docs.render(drifted) == DOC


def test_defaults_are_the_tables():
    assert STREAMS_DEFAULTS == {s.name: s.default for s in STREAMS_SETTINGS}
    assert DISCOVERY_DEFAULTS == {s.name: s.default for s in DISCOVERY_SETTINGS}
    for table in (STREAMS_SETTINGS, DISCOVERY_SETTINGS):
        assert all(s.doc.strip() for s in table)
        assert all(s.kind.accepts is None or s.kind.accepts(s.default) for s in table)  # defaults pass their checks


def test_every_key_is_checked_against_its_kind(settings):
    # The checks come from the same table: a wrong kind for any key is an error naming it.
    checked = [s for s in STREAMS_SETTINGS if s.kind.accepts is not None]
    settings.STREAMS = {s.name: float("nan") if s.kind.name.startswith("positive") else 0 for s in checked}
    ids = {(e.msg.split("]")[0], e.id) for e in run_checks(databases=[]) if e.id.startswith("streams_app.E")}
    assert {f"STREAMS[{s.name!r}" for s in checked} == {msg for msg, _ in ids}
    assert ("STREAMS['BROADCAST_CHANNEL'", "streams_app.E020") in ids


def test_every_check_id_is_documented():
    source = "".join(p.read_text() for p in [ROOT / "streams_app/checks.py", ROOT / "discovery_app/checks.py",
                                                ROOT / "streams_app/defaults.py", ROOT / "discovery_app/defaults.py"])
    ids = set(re.findall(r'id="((?:streams_app|discovery_app)\.[EW]\d+)"', source))
    ids |= {f"streams_app.{s.check_id}" for s in STREAMS_SETTINGS if s.kind.accepts}
    ids |= {f"discovery_app.{s.check_id}" for s in DISCOVERY_SETTINGS if s.kind.accepts}
    assert {"streams_app.E020", "streams_app.W010"} <= ids
    assert [i for i in sorted(ids) if f"`{i}`" not in DOC] == []


def test_every_environment_variable_of_the_settings_is_documented():
    source = (ROOT / "project/settings.py").read_text() + (ROOT / "project/devrun.py").read_text()
    names = set(re.findall(r'(?:environ\.get|environ\[|env_bool|env_int|env_list)\(?\s*"([A-Z_]+)"', source))
    assert {"LOG_LEVEL", "SHOAL_VAR_DIR", "SHOAL_DEMO", "SHOAL_INSECURE_DEV_KEY"} <= names
    documented = DOC + (ROOT / "docs" / "serving.md").read_text()
    assert [n for n in sorted(names) if f"`{n}`" not in documented] == []
