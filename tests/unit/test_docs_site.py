"""The documentation site builds strictly (a broken link, a missing page or a page left out of the
nav fails the build), offline, with an API reference entry for every public name; and no page
speaks of anything but the product (no notes the project grew from, no one's requests)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import filter

ROOT = Path(__file__).resolve().parents[2]

# The pages a user reads: the site, the READMEs it embeds or links, and the examples.
DOC_PAGES = sorted(
    {
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "infra" / "README.md",
        *(p for p in (ROOT / "examples").iterdir() if p.is_file()),
    }
)

# Words that speak of the notes the project grew from, or of who asked for what, not of the product.
NOT_THE_PRODUCT = re.compile(
    r"\bseeds?\b|\bseeds'|asked for by|as I know them|written without network access|the user asked",
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


def test_the_documentation_site_builds_in_strict_mode_without_a_warning(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "inprocess" / "index.html").is_file()
    for page in ("architecture", "decisions"):  # each has a diagram, drawn from its Mermaid source
        html = (tmp_path / "site" / page / "index.html").read_text(encoding="utf-8")
        assert '<pre class="mermaid">' in html, page


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
    documented = re.findall(r"^::: filter\.(\w+)$", page, re.MULTILINE)
    public = [name for name in filter.__all__ if not name.startswith("_")]
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
        for source in sorted((ROOT / "filter").rglob("*.py"))
        for match in re.finditer(r'docs/([\w-]+\.md)(?:[,:] "([^"]+)")?', source.read_text(encoding="utf-8"))
    ]
    assert pointers
    for source, match in pointers:
        page = ROOT / "docs" / match.group(1)
        assert page.is_file(), f"{source.relative_to(ROOT)} names {match.group(0)}"
        if match.group(2):
            headings = [line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
            assert any(match.group(2) in h for h in headings), f"{source.relative_to(ROOT)} names {match.group(0)}"
