"""The systemd unit the docs show is the file in deploy/systemd, and systemd itself accepts it."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "shoal-consumers.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's binary and the EnvironmentFile exist, so point the example's
    # paths at this checkout; every other line is checked as shipped.
    env = tmp_path / "env"
    env.write_text("SECRET_KEY=x\n")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/srv/shoal", str(ROOT)).replace("User=shoal", "User=root")
                    .replace("EnvironmentFile=/etc/shoal/env", f"EnvironmentFile={env}"))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ignoring" not in out.stderr.lower(), out.stderr


def test_the_docs_show_the_shipped_unit_verbatim():
    text = UNIT.read_text()
    body = text[text.index("[Unit]"):].strip()
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert any(body in doc.read_text() for doc in docs if doc.exists()), \
        "the systemd unit in the docs differs from deploy/systemd/shoal-consumers.service"
