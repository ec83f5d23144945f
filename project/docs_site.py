"""The documentation site's MkDocs hook (mkdocs.yml ``hooks``): `make docs` builds it with ``mkdocs build --strict``.

The site's pages are docs/*.md as they are in the repository, plus three files from outside docs/, added here so
they are written once: README.md (the home page, index.md), CHANGELOG.md (changelog.md) and bench/README.md
(benchmarks.md). Their links are written for the repository, where GitHub and tests/test_docs_links.py resolve
them; on the site each relative link is rewritten (setup.py's ``rewrite_links``, which the PyPI page uses too):
to the site's own page or file when the target is one of those, else to the file in the repository
(pyproject.toml's ``Source`` URL, branch main: the deployment in deploy/, the scripts in bench/).

The API reference (docs/api.md) is mkdocstrings' work: it reads the docstrings with griffe, statically, so
nothing is imported and neither Django nor Redis is needed to build the site.
"""
import logging
import posixpath
import runpy
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
_setup = runpy.run_path(str(ROOT / "setup.py"))  # its functions only: setup() runs under __main__
rewrite_links, with_fragment = _setup["rewrite_links"], _setup["with_fragment"]
# site page -> the repository file it is made of
GENERATED = {"index.md": "README.md", "changelog.md": "CHANGELOG.md", "benchmarks.md": "bench/README.md"}
SOURCES = {source: page for page, source in GENERATED.items()}
log = logging.getLogger("mkdocs.hooks.docs_site")  # a warning under "mkdocs" fails the --strict build


def repository_path(page):
    """The repository file a site page (its ``src_uri``) was made of."""
    return GENERATED.get(page, f"docs/{page}")


def site_target(path, fragment, page, source_url):
    """A link target on the site for ``path`` (from the repository's root), as seen from the site page ``page``."""
    if path in SOURCES:
        name = SOURCES[path]
    elif path.startswith("docs/"):
        name = path.removeprefix("docs/")
    else:
        if not (ROOT / path).exists():
            log.warning("Doc file '%s' links to '%s', which is not in the repository", page, path)
        return with_fragment(f"{source_url}/blob/main/{path}", fragment)
    return with_fragment(posixpath.relpath(name, posixpath.dirname(page) or "."), fragment)


def on_files(files, config):
    for page, source in GENERATED.items():
        files.append(File.generated(config, page, content=(ROOT / source).read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown, page, config, files):
    source_url = config["repo_url"].rstrip("/")
    src = page.file.src_uri
    return rewrite_links(markdown, repository_path(src),
                         lambda path, fragment: site_target(path, fragment, src, source_url))
