"""What a team checks before adopting django-shoal: the licence, the PyPI page, the documentation site.

The sdist and the wheel are built from a copy of the checkout as ``make check-package`` and a release build them
(``python -m build``: the sdist, then the wheel from it); the site is built by ``make docs`` into a temporary
directory. The link rewriting itself (setup.py, project/docs_site.py) is tested without building anything.
"""
import email.parser
import re
import runpy
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.host_project import ROOT, checkout_copy, run

LINK = re.compile(r"\]\(([^)\s]+)\)")
VENV_BIN = Path(sys.executable).parent


def project_urls():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("urls", {})


def metadata(text):
    return email.parser.Parser().parsestr(text)


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("package")
    source = checkout_copy(tmp / "checkout")
    run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(source)])
    [sdist] = (tmp / "dist").glob("django_shoal-*.tar.gz")
    [wheel] = (tmp / "dist").glob("django_shoal-*.whl")
    return sdist, wheel


def wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return metadata(archive.read(name).decode()), archive.namelist()


def sdist_file(sdist, name):
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        return archive.extractfile(f"{top}/{name}").read().decode()


@pytest.mark.slow
def test_the_wheel_and_the_sdist_carry_the_licence(dists):
    sdist, wheel = dists
    meta, names = wheel_metadata(wheel)
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert not [c for c in meta.get_all("Classifier") if c.startswith("License ::")]  # the expression says it
    [licence] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(licence).decode() == (ROOT / "LICENSE").read_text()
    assert sdist_file(sdist, "LICENSE").startswith("BSD 3-Clause License")


@pytest.mark.slow
def test_the_metadata_names_the_documentation_source_changelog_and_issues(dists):
    meta, _ = wheel_metadata(dists[1])
    urls = dict(value.split(", ", 1) for value in meta.get_all("Project-URL"))
    assert urls == project_urls() and set(urls) == {"Documentation", "Source", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())


@pytest.mark.slow
def test_the_pypi_description_has_no_relative_link(dists):
    sdist, wheel = dists
    readme = (ROOT / "README.md").read_text()
    for meta in (wheel_metadata(wheel)[0], metadata(sdist_file(sdist, "PKG-INFO"))):
        assert meta["Description-Content-Type"] == "text/markdown"
        description = meta.get_payload()
        targets = LINK.findall(description)
        assert len(targets) == len(LINK.findall(readme)) > 30  # every link of the README, none dropped
        assert [t for t in targets if not t.startswith("https://")] == []
        docs = project_urls()["Documentation"]
        assert f"]({docs}consuming/#guarantees-by-group-kind)" in description
        assert f"]({docs}architecture.svg)" in description  # the picture, from the site
        assert f"]({docs}#5-write-a-consumer)" in description  # the README's own anchors: the site's home page
        assert f"]({project_urls()['Source']}/blob/main/bench/README.md)" in description


@pytest.mark.slow
def test_twine_check_strict_passes_on_the_sdist_and_the_wheel(dists):
    out = run([str(VENV_BIN / "twine"), "check", "--strict", *map(str, dists)])
    assert out.count("PASSED") == 2, out


def test_the_pypi_description_points_each_kind_of_link_at_the_site_or_the_repository():
    readme = ("See [a](docs/consuming.md#async-handlers), [b](docs/limits.md), ![c](docs/architecture.svg),\n"
              "[d](#the-picture), [e](bench/README.md#iopy), [f](LICENSE), [g](https://example.com/x.md).\n"
              "```\n[not a link](docs/code.md)\n```\n")
    docs, source = "https://docs.example/en/latest/", "https://git.example/o/r"
    setup = runpy.run_path(str(ROOT / "setup.py"))  # its functions; setup() itself runs only as __main__
    assert setup["pypi_description"](readme, {"Documentation": docs, "Source": source}) == (
        f"See [a]({docs}consuming/#async-handlers), [b]({docs}limits/), ![c]({docs}architecture.svg),\n"
        f"[d]({docs}#the-picture), [e]({source}/blob/main/bench/README.md#iopy), [f]({source}/blob/main/LICENSE), "
        "[g](https://example.com/x.md).\n```\n[not a link](docs/code.md)\n```\n")


def test_the_site_links_its_own_pages_and_the_repository_for_the_rest():
    from project import docs_site

    source = "https://git.example/o/r"

    def on_site(text, page):
        return docs_site.rewrite_links(text, docs_site.repository_path(page),
                                       lambda path, fragment: docs_site.site_target(path, fragment, page, source))

    assert on_site("[a](../README.md#add-shoal-to-your-project) [b](../bench/README.md#x) [c](limits.md) "
                   "[d](../deploy/systemd/shoal-consumers.service) [e](../CHANGELOG.md)", "install.md") == (
        "[a](index.md#add-shoal-to-your-project) [b](benchmarks.md#x) [c](limits.md) "
        f"[d]({source}/blob/main/deploy/systemd/shoal-consumers.service) [e](changelog.md)")
    assert on_site("[a](docs/consuming.md) ![b](docs/architecture.svg) [c](#the-picture) [d](bench/README.md)",
                   "index.md") == "[a](consuming.md) ![b](architecture.svg) [c](index.md#the-picture) [d](benchmarks.md)"
    assert on_site("[a](../docs/operations.md#which) [b](throughput.py)", "benchmarks.md") == (
        f"[a](operations.md#which) [b]({source}/blob/main/bench/throughput.py)")


def test_the_site_and_the_metadata_name_the_same_urls():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # the !!python tag stays a string
    urls = project_urls()
    assert (config["site_url"], config["repo_url"]) == (urls.get("Documentation"), urls.get("Source"))
    assert config["strict"] == "true"


def make_docs(checkout, site):
    """``make docs`` in a copy of the checkout: it rewrites docs/settings.md's tables, which
    tests/test_settings_docs.py must find as committed. ``-o deps``: the packages are this test run's (make docs
    would otherwise install requirements.txt first)."""
    return subprocess.run(["make", "--no-print-directory", "-o", "deps", "docs", f"VENV={VENV_BIN.parent}",
                           f"SITE_DIR={site}"], cwd=checkout, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    built = make_docs(checkout_copy(tmp / "checkout"), tmp / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    return tmp / "site"


@pytest.mark.slow
def test_make_docs_builds_the_site_with_an_api_reference(site):
    api = (site / "api" / "index.html").read_text()
    for name in ("streams_app.publishing.producer.publish", "streams_app.registry.consumer", "streams_app.publishing.message.Message",
                 "streams_app.testing.capture_publishes", "streams_app.tasks.backend.StreamsBackend",
                 "discovery_app.client.DiscoveryClient"):
        assert f'id="{name}"' in api, name
    assert "Every key of <code>settings.STREAMS</code>" in api  # the settings modules' docstrings
    assert "Append one message; return its entry id" in api  # publish()'s docstring
    assert "StreamsBackend" in (site / "tasks" / "index.html").read_text()


@pytest.mark.slow
def test_the_site_has_every_chapter_its_screenshots_and_no_link_into_the_repository_tree(site):
    chapters = [p.stem for p in (ROOT / "docs").glob("*.md")]
    for page in [*chapters, "benchmarks", "changelog"]:
        assert (site / page / "index.html").exists(), page
    assert "Competing consumers on Redis Streams" in (site / "index.html").read_text()  # the README is the home page
    for screenshot in (ROOT / "docs").glob("*.png"):
        assert (site / screenshot.name).read_bytes() == screenshot.read_bytes()
    assert 'src="../admin-index.png"' in (site / "admin" / "index.html").read_text()
    stray = {page.relative_to(site).as_posix(): href for page in site.rglob("*.html")
             for href in re.findall(r'href="([^"#]+\.md)(?:#[^"]*)?"', page.read_text())
             if not href.startswith(project_urls()["Source"])}
    assert stray == {}


@pytest.mark.slow
def test_a_broken_link_fails_make_docs(tmp_path):
    copy = checkout_copy(tmp_path / "checkout")
    with open(copy / "docs" / "limits.md", "a") as page:
        page.write("\nSee [the consumers](consuming.md#no-such-heading).\n")
    built = make_docs(copy, tmp_path / "site")
    assert built.returncode != 0
    assert "does not contain an anchor '#no-such-heading'" in built.stdout + built.stderr
