"""`make run`: migrate, find or start a Redis, then run the Procfile.dev processes in the foreground.

Redis, in order: $REDIS_URL if set; else the local one on 127.0.0.1:6379; else a private
redis-server started here with its data under var/redis. The choice is written to var/env
(project/devenv.py) so that ``manage.py`` in another shell uses the same Redis and the demo app.
``--prepare-only`` (`make dev-env`) stops there. One Ctrl-C stops everything, and a clean stop
exits 0.

On the first run it creates a superuser ``admin`` with a generated password, printed once and kept
in var/admin-password (mode 0600) for later.
"""
import argparse
import os
import secrets
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis

from project.devenv import env_path, write_env

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PRIVATE_PORT = 6390
DEFAULT_WEB_PORT = 8000
ADMIN_USER = "admin"


def reachable(url):
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return False


def start_private_redis():
    server = shutil.which("redis-server")
    if not server:
        sys.exit("No Redis is reachable and redis-server is not installed: run `make redis-deps` or set REDIS_URL.")
    data = VAR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [server, "--port", str(PRIVATE_PORT), "--bind", "127.0.0.1", "--dir", str(data), "--daemonize", "yes",
         "--appendonly", "yes", "--pidfile", str(data / "redis.pid"), "--logfile", str(data / "redis.log")],
        check=True,
    )
    url = f"redis://127.0.0.1:{PRIVATE_PORT}/0"
    for _ in range(50):
        if reachable(url):
            return url
        time.sleep(0.1)
    sys.exit(f"started redis-server on port {PRIVATE_PORT} but it does not answer; see {data / 'redis.log'}")


def choose_redis():
    if os.environ.get("REDIS_URL"):
        url = os.environ["REDIS_URL"]
        if not reachable(url):
            sys.exit(f"REDIS_URL={url} is not reachable. Start that Redis, or unset REDIS_URL to use a local one.")
        return url, "from REDIS_URL"
    local = "redis://127.0.0.1:6379/0"
    if reachable(local):
        return local, "the local Redis on 6379"
    private = f"redis://127.0.0.1:{PRIVATE_PORT}/0"
    if reachable(private):
        return private, "the private Redis under var/redis"
    return start_private_redis(), "a private redis-server started under var/redis"


def create_admin_once(python, env, var=VAR):
    """Create the ``admin`` superuser on the first run; return its password then, else None."""
    secret = var / "admin-password"
    if secret.exists():
        return None
    password = secrets.token_urlsafe(18)
    made = subprocess.run(
        [python, "manage.py", "createsuperuser", "--no-input", "--username", ADMIN_USER, "--email", "admin@localhost"],
        cwd=ROOT, env={**env, "DJANGO_SUPERUSER_PASSWORD": password}, capture_output=True, text=True,
    )
    if made.returncode != 0:
        if "already taken" in made.stderr:
            print(f"Shoal: a user {ADMIN_USER!r} already exists; set its password with "
                  f"`python manage.py changepassword {ADMIN_USER}`.", flush=True)
            return None
        sys.exit(f"could not create the admin user:\n{made.stderr}")
    # O_EXCL and mode 0600 from the start: the password is never readable by others, even briefly.
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    return password


def prepare():
    """Choose Redis, write var/env, migrate, create the admin once; return the processes' environment."""
    VAR.mkdir(exist_ok=True)
    url, where = choose_redis()
    chosen = {"REDIS_URL": url, "DEBUG": os.environ.get("DEBUG", "1"), "SHOAL_DEMO": "1"}
    write_env(chosen)
    env = {**os.environ, **chosen, "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "project.settings"}
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True)
    print(f"Shoal: Redis at {url} ({where}); database {env.get('DATABASE_URL', 'var/db.sqlite3')}; "
          f"written to {env_path().relative_to(ROOT) if env_path().is_relative_to(ROOT) else env_path()}", flush=True)
    password = create_admin_once(python, env)
    if password:
        print(f"Shoal: created the admin user {ADMIN_USER!r} with password {password}\n"
              f"       (shown this once; kept in var/admin-password, readable by you only)", flush=True)
    elif (VAR / "admin-password").exists():
        print(f"Shoal: admin user {ADMIN_USER!r}; its password is in var/admin-password", flush=True)
    return env


def web_port():
    raw = os.environ.get("SHOAL_WEB_PORT", str(DEFAULT_WEB_PORT))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        sys.exit(f"SHOAL_WEB_PORT={raw!r} is not a port number; use e.g. SHOAL_WEB_PORT=8001.")
    return int(raw)


def metrics_ports(port):
    """The consumer's and the reclaimer's metrics ports: the ports honcho gives their Procfile.dev
    entries ($PORT + 100 per entry), which nothing else there binds."""
    ports = {"SHOAL_CONSUMER_METRICS_PORT": port + 100, "SHOAL_RECLAIMER_METRICS_PORT": port + 300}
    if max(ports.values()) > 65535:
        sys.exit(f"SHOAL_WEB_PORT={port} leaves no room for the metrics ports (+100, +300); use e.g. 8001.")
    return ports


def run_procfile(env, port):
    """Run Procfile.dev under honcho until Ctrl-C; return 0 for a requested stop."""
    python = Path(sys.executable)
    honcho = python.with_name("honcho")
    # The terminal's Ctrl-C reaches honcho too (same process group); honcho stops the processes
    # with TERM and exits 130. That is the normal way to stop, so it is not reported as a failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    proc = subprocess.Popen([str(honcho), "-f", str(ROOT / "Procfile.dev"), "start", "-p", str(port)], cwd=ROOT,
                            env={**env, "PATH": f"{python.parent}:{env.get('PATH', '')}"},
                            restore_signals=True)
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    if code in (130, 143, -signal.SIGINT, -signal.SIGTERM):
        print("Shoal: stopped.", flush=True)
        return 0
    return code


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run Shoal locally (make run), or only prepare it (make dev-env).")
    parser.add_argument("--prepare-only", action="store_true",
                        help="Choose Redis, write var/env, migrate and create the admin; run nothing.")
    args = parser.parse_args(argv)
    port = web_port()
    env = prepare()
    web = f"http://127.0.0.1:{port}"
    if args.prepare_only:
        print("Shoal: ready. In any shell here: `source .venv/bin/activate` (or `make shell`), then "
              "`python manage.py ...`; `make run` starts everything.", flush=True)
        return 0
    ports = metrics_ports(port)
    env = {**env, **{name: str(value) for name, value in ports.items()}}
    print(f"Shoal: admin at {web}/admin/   metrics {web}/metrics   health {web}/healthz {web}/readyz", flush=True)
    print(f"Shoal: consumer metrics http://127.0.0.1:{ports['SHOAL_CONSUMER_METRICS_PORT']}/metrics   "
          f"reclaimer and outbox metrics http://127.0.0.1:{ports['SHOAL_RECLAIMER_METRICS_PORT']}/metrics", flush=True)
    print(f"Shoal: starting Procfile.dev: gunicorn on 127.0.0.1:{port}, consumers for orders:email and "
          "orders:points, the reclaimer and a producer. Ctrl-C stops them all.", flush=True)
    return run_procfile(env, port)


if __name__ == "__main__":
    sys.exit(main())
