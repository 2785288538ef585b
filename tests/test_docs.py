"""README and docs: every relative link points at a file inside the repository, and the layout they
describe is the tree on disk."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs" / "results").glob("*.md")),
    REPO / "data" / "FORMAT.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`(embodied/[\w/]+(?:\.py)?/?)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_stay_inside_the_repository(page: Path):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            bad.append(target)
    assert not bad, f"{page.name} links to files outside the repository or missing: {bad}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
    return {s if n == 0 else f"{s}-{n}" for s, count in seen.items() for n in range(count + 1)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_to_a_section_find_it(page: Path):
    """A section moved to another page (docs/results/) takes its anchor with it: links must follow."""
    bad = []
    for target in LINK.findall(page.read_text()):
        path, _, anchor = target.partition("#")
        if not anchor or re.match(r"[a-z]+://", target):
            continue
        linked = (page.parent / path).resolve() if path else page
        if linked.suffix == ".md" and linked.exists() and anchor not in _anchors(linked):
            bad.append(target)
    assert not bad, f"{page.name} links to sections that are not there: {bad}"


@pytest.mark.parametrize("page", [REPO / "README.md", REPO / "docs" / "architecture.md"], ids=str)
def test_named_code_paths_exist(page: Path):
    missing = [p for p in CODE_PATH.findall(page.read_text()) if not (REPO / p).exists()]
    assert not missing, f"{page.name} names paths that are not in the tree: {missing}"


def test_architecture_page_names_every_subpackage():
    text = (REPO / "docs" / "architecture.md").read_text()
    packages = sorted(p.parent.name for p in (REPO / "embodied").glob("*/__init__.py"))
    assert not [p for p in packages if f"`embodied/{p}/`" not in text], packages


def test_readme_layout_lists_the_tree():
    text = (REPO / "README.md").read_text()
    layout = text[text.index("## Layout") :]
    packages = [p.parent.name + "/" for p in (REPO / "embodied").glob("*/__init__.py")]
    modules = [p.name for p in (REPO / "embodied").glob("*.py") if p.name != "__init__.py"]
    missing = [name for name in packages + modules if name not in layout]
    assert not missing, f"README's layout section does not list {missing}"
