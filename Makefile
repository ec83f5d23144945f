# The two commands: `make run` (the whole system, locally) and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-requirements
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run dev-env shell test test-fast test-matrix lint docs deps redis-deps system-deps bench clean

deps: $(STAMP)

$(STAMP): requirements.txt requirements/base.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is needed (the reference combination: Python 3.11, Django 5.2 LTS)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# Debian packages, each installed only when missing. `make run` needs redis-server (for the private Redis
# it starts when none answers) and nothing else; the tests need chromium too (the admin's browser test),
# and only they install it: a demo has no reason to put a browser on the machine.
redis-deps:
	@command -v redis-server >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y redis-server; }

system-deps: redis-deps
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }

# `make test`: lint, the whole suite on the reference combination (Python 3.11, Django 5.2 LTS), then the
# version matrix (noxfile.py: Python 3.13 + Django 6.1, 3.12 + 5.2, 3.12 + 6.0, each in its own .nox/ venv).
# Both run in parallel, TEST_WORKERS pytest-xdist workers each (every worker has its own Redis servers,
# databases and port range: docs/development.md). `make test ARGS=tests/streams_app/test_codec.py` runs lint and
# those pytest arguments alone, on the reference combination, in one process (TEST_WORKERS=4 to spread them).
# `make test-fast`: everything but the tests marked `slow` (several real processes each: gunicorn,
# supervisors, the chaos run, a browser), on the reference combination only; see pytest.ini.
TEST_WORKERS ?= $(if $(ARGS),0,4)
ARGS ?=
export TEST_WORKERS

test: deps system-deps lint $(if $(ARGS),,check-docs check-package)
	@start=$$(date +%s); $(VENV)/bin/pytest -n $(TEST_WORKERS) $(ARGS); status=$$?; \
	  echo "make test: the reference suite took $$(( $$(date +%s) - start )) s"; exit $$status
	@$(if $(ARGS),,$(MAKE) --no-print-directory test-matrix)

test-fast: deps system-deps lint
	$(VENV)/bin/pytest -n $(TEST_WORKERS) -m "not slow" $(ARGS)

test-matrix: deps system-deps
	@start=$$(date +%s); $(VENV)/bin/nox; status=$$?; \
	  echo "make test-matrix: the version matrix took $$(( $$(date +%s) - start )) s"; exit $$status

# lint-imports: the import contracts of .importlinter (layers, no cycles; docs/development.md).
# mypy: strict on the public API (mypy.ini; tests/typing/example.py must pass).
lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy --config-file mypy.ini

# The documentation site (mkdocs.yml), built into $(SITE_DIR) with every warning an error, after its one generated
# page: the STREAMS / DISCOVERY tables of docs/settings.md, from streams_app/defaults.py and discovery_app/defaults.py.
# (NO_MKDOCS_2_WARNING: Material for MkDocs prints a banner on every build otherwise; docs/development.md.)
SITE_DIR ?= site
MKDOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
docs: deps
	$(PY) -m project.settings_docs
	$(MKDOCS_BUILD) --site-dir $(SITE_DIR)

# What `make test` runs: the same build into a temporary directory, and the tables only checked, never rewritten
# (stale tables fail here and in tests/test_settings_docs.py rather than being fixed in CI's clone).
.PHONY: check-docs
check-docs: deps
	$(PY) -m project.settings_docs --check
	@site=$$(mktemp -d); trap 'rm -rf "$$site"' EXIT; $(MKDOCS_BUILD) --site-dir "$$site"

# The sdist and the wheel built from it (python -m build), into a temporary directory, then `twine check --strict`:
# what PyPI would show, checked before a release is (docs/development.md "Releasing").
.PHONY: check-package
check-package: deps
	@dist=$$(mktemp -d); trap 'rm -rf "$$dist"' EXIT; \
	  $(PY) -m build --outdir "$$dist" . >"$$dist/build.log" 2>&1 || { cat "$$dist/build.log"; exit 1; }; \
	  $(VENV)/bin/twine check --strict "$$dist"/*.tar.gz "$$dist"/*.whl

run: deps redis-deps
	@$(PY) -m project.devrun

# What `make run` prepares (.venv, Redis choice in var/env, migrations, the admin user), without running it.
dev-env: deps redis-deps
	@$(PY) -m project.devrun --prepare-only

# A bash with .venv activated: `python manage.py ...` then works as the README shows. The venv is
# activated after ~/.bashrc, which may put other pythons (pyenv shims) first on PATH.
shell: deps
	@mkdir -p var
	@printf '%s\n' '[ -f ~/.bashrc ] && . ~/.bashrc' '. "$(CURDIR)/$(VENV)/bin/activate"' \
		'echo "Shoal: .venv is active in this shell; exit to leave it."' > var/shellrc
	@exec bash --rcfile var/shellrc -i

bench: deps redis-deps
	$(PY) bench/throughput.py
	$(PY) bench/http_bench.py

clean:
	rm -rf $(VENV) .nox var/run site
