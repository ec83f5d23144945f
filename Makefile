# The two commands: `make run` (the whole system, locally) and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-requirements
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run dev-env shell test test-fast lint docs deps system-deps bench clean

deps: $(STAMP)

$(STAMP): requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is needed (Shoal targets Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# Debian packages the tests and `make run` need. Installed only when missing.
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y redis-server; }
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }

# `make test`: lint, then the whole suite. `make test-fast`: everything but the tests marked `slow`
# (several real processes each: gunicorn, supervisors, the chaos run, a browser); see pytest.ini.
test: deps system-deps lint
	$(VENV)/bin/pytest

test-fast: deps system-deps lint
	$(VENV)/bin/pytest -m "not slow"

lint: deps
	$(VENV)/bin/ruff check .

# The STREAMS / DISCOVERY tables of docs/settings.md, from streams_app/defaults.py and discovery_app/defaults.py.
docs: deps
	$(PY) -m project.settings_docs

run: deps system-deps
	@$(PY) -m project.devrun

# What `make run` prepares (.venv, Redis choice in var/env, migrations, the admin user), without running it.
dev-env: deps system-deps
	@$(PY) -m project.devrun --prepare-only

# A bash with .venv activated: `python manage.py ...` then works as the README shows. The venv is
# activated after ~/.bashrc, which may put other pythons (pyenv shims) first on PATH.
shell: deps
	@mkdir -p var
	@printf '%s\n' '[ -f ~/.bashrc ] && . ~/.bashrc' '. "$(CURDIR)/$(VENV)/bin/activate"' \
		'echo "Shoal: .venv is active in this shell; exit to leave it."' > var/shellrc
	@exec bash --rcfile var/shellrc -i

bench: deps system-deps
	$(PY) bench/throughput.py
	$(PY) bench/http_bench.py

clean:
	rm -rf $(VENV) var/run
