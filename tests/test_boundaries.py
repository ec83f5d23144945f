"""The import contracts of .importlinter hold, and each catches the break it exists for.

The contracts are the one statement of Shoal's import boundaries (layers, no cycles, the apps
independent, shoal_common below both, the distribution apart from project/demo/tests/bench);
`make lint` checks them with lint-imports, as this does. A contract that cannot fail would
pass vacuously, so each kind of break is made in a copy of the tree and must be reported.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".importlinter"
PACKAGES = ("streams_app", "discovery_app", "shoal_common", "project", "demo", "tests", "bench")


def lint_imports(cwd):
    """Run lint-imports with the repository's contracts on the packages found in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only cwd's packages
    return subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo",
                           "--config", str(CONFIG)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_contracts_hold_for_the_tree():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


BREAKS = {
    "an app importing the other inside a function": (
        "streams_app/web/health.py", "\n\ndef _sync():\n    from discovery_app.sync import sync_instances\n",
        "streams_app and discovery_app are independent of each other"),
    "shoal_common importing an app": (
        "shoal_common/text.py", "\nimport streams_app.redis.keys  # noqa\n", "shoal_common imports neither app"),
    "the distribution importing the deployment": (
        "discovery_app/keys.py", "\nimport project.settings  # noqa\n", "imports nothing of this repository's deployment"),
    "the lost-group protocol importing the read loop": (
        "streams_app/consuming/lost_group.py", "\n\ndef _loop():\n    from streams_app.consuming.loop import GroupLoop\n",
        "streams_app.consuming.lost_group is not allowed to import streams_app.consuming.loop"),
    "the producer importing the consumer package": (
        "streams_app/publishing/producer.py", "\nfrom streams_app.consuming.groups import ensure_group  # noqa\n",
        "streams_app.publishing is not allowed to import streams_app.consuming"),
    "two admin modules importing each other": (
        "streams_app/admin/support.py", "\n\ndef _admins():\n    from streams_app.admin import model_admins\n",
        "No cycles are allowed in streams_app.admin"),
    "a module given no layer": (
        "streams_app/unplaced.py", "from streams_app.redis import keys  # noqa\n", "streams_app.unplaced"),
}


@pytest.mark.parametrize("break_", sorted(BREAKS))
def test_a_break_of_the_boundaries_is_reported(tmp_path, break_):
    path, code, reported = BREAKS[break_]
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / path, "a") as file:
        file.write(code)
    result = lint_imports(tmp_path)
    output = " ".join((result.stdout + result.stderr).split())  # lint-imports wraps long lines
    assert result.returncode == 1, output
    assert reported in output
