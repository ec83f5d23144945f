"""The PyPI page of django-shoal: README.md with its relative links made absolute. The rest is pyproject.toml.

README.md is also the repository's front page, where its links stay relative (docs/consuming.md, bench/README.md,
#5-write-a-consumer) and tests/test_docs_links.py checks that they resolve. On PyPI a relative link is broken, so
the long description points them at pyproject.toml's project URLs: a docs/ page or file to the documentation site
(``Documentation``; README.md is the site's home page, so its own #anchors go there), any other file to the
repository (``Source``, branch main). The documentation site's hook (project/docs_site.py) rewrites its pages'
links with ``rewrite_links`` too.

setuptools runs this file as ``__main__``; importing it (``runpy.run_path``) defines the functions only.
"""
import posixpath
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# A Markdown link or image target: ](target) or ](target#fragment); absolute URLs are left alone.
LINK = re.compile(r"\]\(([^)\s]+)\)")
ABSOLUTE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:")
FENCE = re.compile(r"^\s*(```|~~~)")


def rewrite_links(text, page, url_of):
    """``text`` (the Markdown of ``page``, a path from the repository's root) with each relative link target
    replaced by ``url_of(path, fragment)``: ``path`` from the repository's root, ``fragment`` without its '#'
    ('' when none). Code blocks are left as written."""
    def replace(match):
        target = match[1]
        if ABSOLUTE.match(target):
            return match[0]
        file, _, fragment = target.partition("#")
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page), file)) if file else page
        return f"]({url_of(path, fragment)})"

    lines, in_code = [], False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            in_code = not in_code
        lines.append(line if in_code else LINK.sub(replace, line))
    return "".join(lines)


def with_fragment(url, fragment):
    return f"{url}#{fragment}" if fragment else url


def pypi_description(readme, urls):
    """README.md for PyPI: every link absolute (docs/ on the documentation site, the rest in the repository)."""
    docs, source = urls["Documentation"].rstrip("/") + "/", urls["Source"].rstrip("/")

    def url_of(path, fragment):
        if path == "README.md":
            return with_fragment(docs, fragment)
        if path.startswith("docs/"):
            name = path.removeprefix("docs/")
            return with_fragment(docs + (name.removesuffix(".md") + "/" if name.endswith(".md") else name), fragment)
        return with_fragment(f"{source}/blob/main/{path}", fragment)

    return rewrite_links(readme, "README.md", url_of)


def project_urls():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]


if __name__ == "__main__":
    from setuptools import setup

    setup(long_description=pypi_description((ROOT / "README.md").read_text(encoding="utf-8"), project_urls()),
          long_description_content_type="text/markdown")
