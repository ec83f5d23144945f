"""The production settings from the environment: ``check --deploy`` is clean with the documented variables."""
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def documented_production_env():
    text = (ROOT / "docs" / "serving.md").read_text()
    block = text.split("<!-- production-env -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    pairs = dict(line.split("=", 1) for line in block.strip().splitlines())
    pairs["SECRET_KEY"] = secrets.token_urlsafe(50)  # the placeholder says: 50+ random characters
    return pairs


def manage(tmp_path, env, *args):
    base = {k: v for k, v in os.environ.items() if not re.match(r"(DEBUG|SECURE_|CSRF_|SECRET_KEY|ALLOWED_HOSTS|SHOAL_)", k)}
    full = {**base, "DJANGO_SETTINGS_MODULE": "project.settings", "SHOAL_VAR_DIR": str(tmp_path),
            "REDIS_URL": "redis://127.0.0.1:1/0", **env}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_with_the_documented_production_variables(tmp_path):
    env = documented_production_env()
    done = manage(tmp_path, env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    shown = manage(tmp_path, env, "shell", "-c", "from django.conf import settings as s; print(s.SECURE_PROXY_SSL_HEADER, "
                                                 "s.CSRF_TRUSTED_ORIGINS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE)")
    assert shown.stdout.strip().splitlines()[-1] == "('HTTP_X_FORWARDED_PROTO', 'https') ['https://shoal.example.com'] True True", shown.stderr


def test_without_them_check_deploy_names_what_is_missing(tmp_path):
    done = manage(tmp_path, {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50)}, "check", "--deploy")
    assert "security.W004" in done.stderr and "security.W008" in done.stderr  # HSTS and the https redirect
    assert "security.W012" not in done.stderr and "security.W016" not in done.stderr  # cookies are secure anyway
    insecure = manage(tmp_path, {"DEBUG": "0", "SHOAL_INSECURE_DEV_KEY": "1"}, "check", "--deploy")
    assert "security.W009" in insecure.stderr  # the public development key is flagged
