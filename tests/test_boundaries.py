"""Import boundaries, read from the source (AST): neither app imports the other, and only project/ composes them.

streams_app and discovery_app share what both need through shoal_common, which imports neither;
project/ (the reference deployment) imports the apps, never the reverse. Imports inside functions
count too: a lazy import is still a dependency.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "streams_app": {"discovery_app", "project", "demo", "tests", "bench"},
    "discovery_app": {"streams_app", "project", "demo", "tests", "bench"},
    "shoal_common": {"streams_app", "discovery_app", "project", "demo", "tests", "bench"},
}


def imported_packages(path):
    """(line, top-level package) of every absolute import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(package, forbidden, root=ROOT):
    return [f"{path.relative_to(root)}:{line} imports {name}"
            for path in sorted((root / package).rglob("*.py"))
            for line, name in imported_packages(path) if name in forbidden]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_inside_its_boundary(package):
    assert violations(package, FORBIDDEN[package]) == []


def test_the_check_finds_a_lazy_import_inside_a_function(tmp_path):
    # The rule would pass vacuously if it missed imports: show it catches the kind that was there.
    (tmp_path / "streams_app").mkdir()
    (tmp_path / "streams_app" / "mirror.py").write_text(
        "import json\n\ndef sync():\n    from discovery_app.sync import sync_instances\n    import project.settings\n")
    assert violations("streams_app", FORBIDDEN["streams_app"], root=tmp_path) == [
        "streams_app/mirror.py:4 imports discovery_app", "streams_app/mirror.py:5 imports project"]
