"""The documentation site builds strictly (a broken link, a missing page or a page left out of the
nav fails the build), offline, with an API reference entry for every public name; and no page
speaks of anything but the product (no notes the project grew from, no one's requests).

The built site is then read as a reader's browser gets it: no script or stylesheet fetched from
another host (offline, or behind a strict CSP, the page would break), every diagram drawn by a
script served with the site (else it shows as its source text), one H1 per page, and a table of
contents that lists every section of the page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import pubsub_filter

ROOT = Path(__file__).resolve().parents[2]

# The pages a user reads: the site, the READMEs it embeds or links, and the examples.
DOC_PAGES = sorted(
    {
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "infra" / "README.md",
        *(p for p in (ROOT / "examples").iterdir() if p.is_file()),
        ROOT / "infra" / "example-config.yaml",
        ROOT / "CHANGELOG.md",
    }
)

# Words that speak of the notes the project grew from, of who asked for what, of how it was
# built (issue numbers, work sessions, commits, another codebase's function names, what could
# not be installed where it was written), not of the product.
NOT_THE_PRODUCT = re.compile(
    r"\bseeds?\b|\bseeds'|asked for by|as I know them|written without network access|the user asked"
    r"|\bissues? \d+|\bthis (work )?session|\bsession's|\bthis pass\b|compute_data_hash|_hash_events"
    r"|could (not )?be installed|from the package registries"
    r"|(?<![\w-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w-])",  # a commit hash
    re.IGNORECASE,
)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it; the build's output must hold no warning."""
    out = tmp_path_factory.mktemp("docs") / "site"
    done = build(ROOT / "mkdocs.yml", out)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    return out


def test_the_documentation_site_builds_in_strict_mode_without_a_warning(site: Path) -> None:
    assert (site / "inprocess" / "index.html").is_file()
    for page in ("architecture", "decisions"):  # each has a diagram, drawn from its Mermaid source
        html = (site / page / "index.html").read_text(encoding="utf-8")
        assert '<pre class="mermaid">' in html, page


class Page(HTMLParser):
    """What a reader's browser takes from one built page: the scripts and stylesheets it loads,
    the headings of the article with their ids, the links of the table of contents, diagrams."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.stylesheets: list[str] = []
        self.headings: list[tuple[int, str]] = []  # (level, id) in the article
        self.toc: list[str] = []  # the fragments the page's table of contents links to
        self.diagrams = 0  # <pre class="mermaid">: drawn in the browser by the Mermaid script
        self.raw_diagrams = 0  # a ```mermaid block that became a plain code block
        self._nav_depth = 0  # inside the secondary nav (the table of contents) when > 0
        self._depth = 0
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        if tag == "link" and "stylesheet" in a.get("rel", "").split():
            self.stylesheets.append(a.get("href", ""))
        if tag in {"h1", "h2", "h3", "h4"}:
            self.headings.append((int(tag[1]), a.get("id", "")))
        if tag == "pre" and "mermaid" in classes:
            self.diagrams += 1
        if tag == "code" and "language-mermaid" in classes:
            self.raw_diagrams += 1
        if tag == "nav":
            self._depth += 1
            if "md-nav--secondary" in classes and not self._nav_depth:
                self._nav_depth = self._depth
        if tag == "a" and self._nav_depth and a.get("href", "").startswith("#"):
            self.toc.append(a["href"][1:])

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav":
            if self._nav_depth == self._depth:
                self._nav_depth = 0
            self._depth -= 1


def pages(site: Path) -> dict[str, Page]:
    return {
        p.parent.relative_to(site).as_posix() or "index": Page(p.read_text(encoding="utf-8"))
        for p in sorted(site.rglob("index.html"))
        if p.parent.name != "404"
    }


def remote(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url))


def test_no_page_loads_a_script_or_stylesheet_from_another_host(site: Path) -> None:
    loaded = {name: [u for u in page.scripts + page.stylesheets if remote(u)] for name, page in pages(site).items()}
    assert not {name: urls for name, urls in loaded.items() if urls}


def test_every_diagram_is_drawn_by_a_mermaid_script_the_site_serves(site: Path) -> None:
    drawn = {name: page for name, page in pages(site).items() if page.diagrams}
    assert {"architecture", "decisions"} <= set(drawn)
    for name, page in pages(site).items():
        assert not page.raw_diagrams, f"{name}: a mermaid block left as code"
    for name, page in drawn.items():
        local = [src for src in page.scripts if src.split("?")[0].endswith("/mermaid.min.js")]
        assert local, f"{name} draws diagrams but loads no Mermaid script: Material would fetch one from a CDN"
        script = (site / name / local[0].split("?")[0]).resolve()
        assert script.is_file() and script.stat().st_size > 1_000_000, script
        assert "mermaid" in script.read_text(encoding="utf-8", errors="replace")[-5000:]


def test_every_page_has_one_h1_and_a_table_of_contents_with_every_section(site: Path) -> None:
    for name, page in pages(site).items():
        h1 = [i for level, i in page.headings if level == 1]
        assert len(h1) == 1, f"{name}: {len(h1)} H1 headings"
        sections = [i for level, i in page.headings if level in (2, 3) and i]
        lost = [i for i in sections if i not in page.toc]
        assert not lost, f"{name}: the table of contents lost {lost}"


def test_the_deploying_page_lists_the_walk_through_steps_in_its_table_of_contents(site: Path) -> None:
    toc = pages(site)["deploying"].toc
    for section in ("1-build-and-push-the-image", "6-read-the-skip-rate", "alerts", "two-timing-rules"):
        assert section in toc, toc


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    # The same site beside the real sources, with one page linking to a page that does not exist.
    for name in ("filter", "README.md", "bench", "infra"):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_the_build_fetches_nothing_from_the_network() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+font: false$", config, re.MULTILINE), "the theme would load Google Fonts"
    assert "social" not in config, "social cards fetch fonts and images at build time"


def test_the_api_reference_documents_every_public_name_and_only_those() -> None:
    page = (ROOT / "docs" / "inprocess.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: pubsub_filter\.(\w+)$", page, re.MULTILINE)
    public = [name for name in pubsub_filter.__all__ if not name.startswith("_")]
    assert sorted(documented) == sorted(public)
    assert len(documented) == len(set(documented))


def test_every_doc_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w-]+\.md)$", config, re.MULTILINE))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed


def test_no_doc_page_speaks_of_seed_notes_or_of_who_asked() -> None:
    hits = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in DOC_PAGES
        for number, line in enumerate(page.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if NOT_THE_PRODUCT.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_every_docs_page_the_code_points_a_user_at_exists_with_the_section_named() -> None:
    pointers = [
        (source, match)
        for source in sorted((ROOT / "filter" / "pubsub_filter").rglob("*.py"))
        for match in re.finditer(r'docs/([\w-]+\.md)(?:[,:] "([^"]+)")?', source.read_text(encoding="utf-8"))
    ]
    assert pointers
    for source, match in pointers:
        page = ROOT / "docs" / match.group(1)
        assert page.is_file(), f"{source.relative_to(ROOT)} names {match.group(0)}"
        if match.group(2):
            headings = [line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
            assert any(match.group(2) in h for h in headings), f"{source.relative_to(ROOT)} names {match.group(0)}"
