"""Write the STREAMS and DISCOVERY tables of docs/settings.md from the apps' SETTINGS tables.

    python -m project.settings_docs          # rewrite the generated parts of docs/settings.md
    python -m project.settings_docs --check  # exit 1 if they are out of date (tests/test_settings_docs.py)

Only the text between the BEGIN/END GENERATED markers is replaced; the rest of the page is prose.
"""
import re
import sys
from pathlib import Path

from discovery_app.defaults import SETTINGS as DISCOVERY_SETTINGS
from shoal_common.appsettings import markdown_table
from streams_app.defaults import SETTINGS as STREAMS_SETTINGS

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
TABLES = {"STREAMS": STREAMS_SETTINGS, "DISCOVERY": DISCOVERY_SETTINGS}


def _block(name):
    return re.compile(rf"(<!-- BEGIN GENERATED: {name} [^>]*-->\n)(.*?)(<!-- END GENERATED: {name} -->)", re.S)


def render(text):
    for name, table in TABLES.items():
        pattern = _block(name)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no BEGIN/END GENERATED markers for {name}")
        text = pattern.sub(lambda m, t=table: m.group(1) + markdown_table(t) + m.group(3), text)
    return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    current = DOC.read_text()
    wanted = render(current)
    if "--check" in argv:
        if wanted != current:
            print(f"{DOC} is out of date: run `python -m project.settings_docs`.")
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
