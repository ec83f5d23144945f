"""README.md and docs/*.md link to files and headings that exist (the README was split into docs/)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    return {anchor(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def broken_links(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, fragment = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(target)
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(target)
    return broken


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert {str(p.relative_to(ROOT)): broken_links(p) for p in pages if broken_links(p)} == {}


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in readme] == []


TEST_PATH = re.compile(r"\btests/[\w/]+\.py\b")


def test_every_test_file_the_docs_name_exists():
    # A user trial ran docs/development.md's one-file example and got "file or directory not found": the
    # file had moved under tests/streams_app/ and nothing checked code spans, only links.
    pages = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]
    missing = {str(page.relative_to(ROOT)): sorted({p for p in TEST_PATH.findall(page.read_text())
                                                   if not (ROOT / p).exists()}) for page in pages}
    assert {page: paths for page, paths in missing.items() if paths} == {}
