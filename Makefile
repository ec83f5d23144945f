# The two commands: `make run` (the whole system, locally) and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-requirements
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test deps system-deps bench clean

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

test: deps system-deps
	$(VENV)/bin/pytest

run: deps system-deps
	$(PY) -m project.devrun

bench: deps system-deps
	$(PY) bench/throughput.py
	$(PY) bench/http_bench.py

clean:
	rm -rf $(VENV) var/run
