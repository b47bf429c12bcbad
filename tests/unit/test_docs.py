"""The README and docs/ in step (issue 54): the README stays a short entry that links every
page under docs/, and every relative link in them leads to a file that exists and, for
``page.md#anchor``, to a heading of that page (GitHub's anchors). Pure file reading."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

README_MAX_LINES = 400  # exclusive: the README is read in minutes, the reference is in docs/

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](x), ![alt](x)
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [name]: x
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:


def markdown_files(root: Path) -> list[Path]:
    """The README and every page under docs/ (not its subfolders: images)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans, each line kept in place
    (a link or a heading in code is not one)."""
    lines, fenced = [], None
    for line in text.split("\n"):
        fence = FENCE.match(line)
        if fenced is None and fence:
            fenced = fence.group(1)
            lines.append("")
        elif fenced is not None:
            if line.strip().startswith(fenced):
                fenced = None
            lines.append("")
        else:
            lines.append(line)
    return INLINE_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), "\n".join(lines))


def github_anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: the text as rendered (a link's text, code without
    its backticks), lowercase, every character but letters, digits, spaces, '-' and '_'
    dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file: its headings' (a repeated one gets -1, -2, ...) and
    explicit ``<a name>``/``<a id>`` ones."""
    text = path.read_text(encoding="utf-8")
    found, seen = set(), Counter()
    for line in _fenceless_lines(text):
        heading = HEADING.match(line)
        if heading:
            slug = github_anchor(heading.group(2))
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return found | set(HTML_ANCHOR.findall(text))


def _fenceless_lines(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks (inline code kept: a heading's
    backticks are part of its text)."""
    lines, fenced = [], None
    for line in text.split("\n"):
        fence = FENCE.match(line)
        if fenced is None and fence:
            fenced = fence.group(1)
        elif fenced is not None:
            if line.strip().startswith(fenced):
                fenced = None
        else:
            lines.append(line)
    return lines


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative link and image in a Markdown file, outside code."""
    prose = _prose(path.read_text(encoding="utf-8"))
    found = sorted(
        (m.start(1), m.group(1)) for pattern in (LINK, REFERENCE) for m in pattern.finditer(prose)
    )
    return [
        (prose.count("\n", 0, at) + 1, target) for at, target in found if not SCHEME.match(target)
    ]


def broken_links(path: Path) -> list[str]:
    """``file:line: target (why)`` for each relative link of ``path`` that leads nowhere: no
    such file, or no such heading in the Markdown file it names."""
    broken = []
    for line, target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.name}:{line}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no file {dest})")
        elif anchor and dest.suffix != ".md":
            broken.append(f"{where} (an anchor into a file that is not Markdown)")
        elif anchor and anchor not in anchors(dest):
            broken.append(f"{where} (no heading with anchor #{anchor} in {dest.name})")
    return broken


def unlinked_pages(root: Path) -> list[str]:
    """The pages under ``root``/docs/ that the README links to no one."""
    readme = root / "README.md"
    linked = {
        (readme.parent / target.partition("#")[0]).resolve()
        for _, target in relative_links(readme)
        if target.partition("#")[0]
    }
    return [p.name for p in sorted((root / "docs").glob("*.md")) if p.resolve() not in linked]


def test_the_readme_is_an_entry_read_in_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines (under {README_MAX_LINES}): move reference into a page "
        "under docs/ and link it from the README"
    )


@pytest.mark.parametrize("path", markdown_files(ROOT), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_a_heading(path):
    assert broken_links(path) == []


def test_every_docs_page_is_linked_from_the_readme():
    assert unlinked_pages(ROOT) == [], "link each from the README's Further reading"


def test_the_checks_can_fail(tmp_path):
    """The checks on a scratch copy: a link to a missing page, a missing heading, a heading in
    code, a link in code (not one), a page the README does not link."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## `stateops run` (Spark)\n\n## Twice\n\n## Twice\n\n```\n# not a heading\n"
        "[in code](nowhere.md)\n```\n\nSee `[code](nowhere.md)`, [run](#stateops-run-spark), "
        "[twice](#twice-1), [back](../README.md#top).\n"
    )
    (tmp_path / "docs" / "b.md").write_text("# B\n")
    (tmp_path / "README.md").write_text(
        "# Top\n\n[a](docs/a.md#twice) [gone](docs/gone.md) [no heading](docs/a.md#not-a-heading)"
        "\n[wrong case](docs/a.md#Twice)\n"
    )
    assert broken_links(tmp_path / "docs" / "a.md") == []
    assert [b.split(" (")[0] for b in broken_links(tmp_path / "README.md")] == [
        "README.md:3: docs/gone.md",
        "README.md:3: docs/a.md#not-a-heading",
        "README.md:4: docs/a.md#Twice",
    ]
    assert unlinked_pages(tmp_path) == ["b.md"]
    assert github_anchor("Backup and restore (S3)") == "backup-and-restore-s3"
    assert github_anchor("`stream_checkpoint_backup` and `stream_restore`") == (
        "stream_checkpoint_backup-and-stream_restore"
    )
