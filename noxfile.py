"""The version matrix: Shoal's tests on each supported Python and Django beside the reference one.

`make test` runs the whole suite on the reference combination (Python 3.11, Django 5.2 LTS, in .venv),
then these sessions, each in its own virtualenv under .nox/ built from a pinned requirements file:

    tests(python='3.13', django='6.1')   everything not marked slow, and the host-project install tests
    tests(python='3.12', django='5.2')   the same
    tests(python='3.12', django='6.0')   what differs between Django versions: the install tests, the admin, the
                                         version-difference tests (tests/test_django_versions.py)

`make test-matrix` runs only these; `.venv/bin/nox -s "tests(python='3.13', django='6.1')" -- -x tests/streams_app`
runs one session with pytest arguments of your own. Python 3.12 and 3.13 come from PATH, or from pyenv.
"""
import glob
import os
import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True  # a combination CI cannot run is a failure, not a skip
nox.options.reuse_existing_virtualenvs = True  # rebuilt when the interpreter changes; requirements re-applied

NOT_SLOW = ["-m", "not slow or install"]
DJANGO_DIFFERENCES = ["tests/test_host_project.py", "tests/test_django_versions.py", "tests/streams_app/admin",
                      "tests/discovery_app/test_admin.py", *NOT_SLOW]

# (python, django): (the pinned requirements, those installed without their dependency check, what pytest runs)
MATRIX = {
    ("3.13", "6.1"): ("requirements/django61.txt", "requirements/django61-no-deps.txt", NOT_SLOW),
    ("3.12", "5.2"): ("requirements.txt", None, NOT_SLOW),
    ("3.12", "6.0"): ("requirements/django60.txt", None, DJANGO_DIFFERENCES),
}


def _real_pythons_first():
    """pyenv's shims answer ``python3.13`` only when PYENV_VERSION names 3.13; nox looks interpreters up
    on PATH, so put each installed pyenv version's own bin directory there (newest patch release first)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = []
    for python, _ in MATRIX:
        if shutil.which(f"python{python}") and ".pyenv/shims" not in shutil.which(f"python{python}"):
            continue
        versions = sorted(glob.glob(f"{root}/versions/{python}.*/bin"),
                          key=lambda path: [int(part) for part in path.split("/")[-2].split(".") if part.isdigit()])
        if versions:
            found.append(versions[-1])
    os.environ["PATH"] = os.pathsep.join([*dict.fromkeys(found), os.environ.get("PATH", "")])


_real_pythons_first()


@nox.session
@nox.parametrize(("python", "django"), list(MATRIX))
def tests(session, django):
    requirements, without_deps, selection = MATRIX[(session.python, django)]
    session.install("--quiet", "--disable-pip-version-check", "-r", requirements)
    if without_deps:
        session.install("--quiet", "--disable-pip-version-check", "--no-deps", "-r", without_deps)
    installed = session.run("python", "-c", "import django; print(django.get_version())", silent=True).strip()
    if not installed.startswith(f"{django}."):
        session.error(f"{requirements} installed Django {installed}, not {django}")
    # In parallel as `make test` runs the reference suite (TEST_WORKERS pytest-xdist workers; 0: one process).
    workers = os.environ.get("TEST_WORKERS", "4")
    session.run("pytest", "-p", "no:cacheprovider", "-n", workers, *(session.posargs or selection))
