"""References into docs/ hold: a comment or page that names a section finds it.

Code and docs point at the rule they rely on as ``(docs/contract.md, "Selection")`` (one or
several quoted headings after the page), as ``docs/api.md#output-limit``, or, in Markdown, as a
relative link ``[text](api.md#output-limit)``. Each named page must exist and each heading or
anchor must be one of its headings (anchors as GitHub makes them). No reference may point at the
project's former brief, a document outside the repository. The errors table of docs/contract.md
is held to the service's error classes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from context_assembly import errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Directories that hold no source of ours: environments, caches, dependencies, build output.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".venv",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        "__pycache__",
        "node_modules",
        "dist",
        "build",
    }
)
SCANNED_SUFFIXES = frozenset(
    {
        ".py",
        ".md",
        ".ts",
        ".mts",
        ".js",
        ".mjs",
        ".json",
        ".toml",
        ".yaml",
        ".yml",
        ".txt",
        ".html",
        ".sh",
        ".cfg",
        ".ini",
    }
)
SCANNED_NAMES = frozenset({"Makefile", "Dockerfile"})

# A reference may wrap: a line break, then the next line's comment marker (``#``, ``//``, ``*``).
BREAK = r"\n(?:[ \t]*(?:#|//|\*))?"
SPACE = rf"(?:[ \t]|{BREAK})*"
QUOTED = rf'"(?:[^"\n]|{BREAK})+"'
PAGE = r"(?<![\w-])docs/(?P<page>[\w-]+)\.md"
# ``docs/<page>.md, "<Heading>"``, optionally more headings: ``, "<A>", "<B>" and "<C>"``.
HEADING_REF = re.compile(
    rf"{PAGE},{SPACE}(?P<headings>{QUOTED}(?:{SPACE}(?:,|and|to|/){SPACE}{QUOTED})*)"
)
ANCHOR_REF = re.compile(rf"{PAGE}#(?P<anchor>[\w-]+)")
PAGE_REF = re.compile(rf"{PAGE}\b")
# A relative Markdown link to a page's anchor: ``[text](page.md#anchor)``.
MARKDOWN_LINK = re.compile(r"\]\((?P<target>[^)\s#]+\.md)#(?P<anchor>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
ATX_HEADING = re.compile(r"^(#{1,6})[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$")
FORMER_BRIEF = re.compile(r"\bSP" + r"EC\b")


def source_files() -> Iterator[Path]:
    """Every text file of the repository that code, docs or configuration live in."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder, name)
            if path.suffix in SCANNED_SUFFIXES or name in SCANNED_NAMES:
                yield path


@cache
def texts() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8", errors="replace") for path in source_files()}


def plain(heading: str) -> str:
    """A heading's text as a reader sees it: links reduced to their text, no code marks,
    whitespace collapsed."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return " ".join(text.replace("`", "").split())


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = plain(heading).lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


@cache
def headings(page: Path) -> tuple[list[str], set[str]]:
    """A Markdown page's headings (plain text) and their anchors, code blocks skipped."""
    found: list[str] = []
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else ATX_HEADING.match(line)
        if match is None:
            continue
        text = plain(match["text"])
        found.append(text)
        anchor = slug(text)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return found, anchors


def where(path: Path, text: str, offset: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}"


def heading_references() -> list[tuple[str, Path, str]]:
    """``(place, page, heading)`` of every quoted-heading reference into docs/; a heading that
    wraps is read without its line breaks and comment markers."""
    found = []
    for path, text in texts().items():
        for match in HEADING_REF.finditer(text):
            page = DOCS / f"{match['page']}.md"
            for quoted in re.findall(QUOTED, match["headings"]):
                heading = " ".join(re.sub(BREAK, " ", quoted[1:-1]).split())
                found.append((where(path, text, match.start()), page, heading))
    return found


def anchor_references() -> list[tuple[str, Path, str]]:
    """``(place, page, anchor)`` of every ``docs/<page>.md#anchor`` and relative Markdown link."""
    found = []
    for path, text in texts().items():
        for match in ANCHOR_REF.finditer(text):
            page = DOCS / f"{match['page']}.md"
            found.append((where(path, text, match.start()), page, match["anchor"]))
        if path.suffix == ".md":
            for match in MARKDOWN_LINK.finditer(text):
                if "://" in match["target"]:
                    continue
                page = (path.parent / match["target"]).resolve()
                found.append((where(path, text, match.start()), page, match["anchor"]))
    return found


def test_the_scan_sees_the_references_it_checks() -> None:
    """The scan reaches code, tests and docs, and finds references of each form in them (a
    check that found nothing could not fail)."""
    places = {place.split(":")[0] for place, _, _ in heading_references()}
    assert any(place.startswith("service/") for place in places)
    assert any(place.startswith("tests/") for place in places)
    assert any(page.name == "contract.md" for _, page, _ in heading_references())
    anchored = anchor_references()
    assert any(place.startswith("README.md") for place, _, _ in anchored)
    assert any(place.startswith("docs/") for place, _, _ in anchored)


def test_every_quoted_heading_reference_names_an_existing_heading() -> None:
    """``docs/<page>.md, "<Heading>"`` in a comment, docstring or page names a heading of that
    page, as written there (code marks aside)."""
    broken = []
    for place, page, heading in heading_references():
        if not page.is_file():
            broken.append(f"{place}: {page.relative_to(ROOT)} does not exist")
        elif heading not in headings(page)[0]:
            broken.append(f"{place}: {page.relative_to(ROOT)} has no heading {heading!r}")
    assert not broken, "\n".join(sorted(set(broken)))


def test_every_anchor_reference_names_an_existing_heading() -> None:
    """``docs/<page>.md#anchor`` and ``[text](page.md#anchor)`` land on a heading of that page."""
    broken = []
    for place, page, anchor in anchor_references():
        if not page.is_file():
            broken.append(f"{place}: {page} does not exist")
        elif anchor not in headings(page)[1]:
            broken.append(f"{place}: {page.relative_to(ROOT)} has no anchor #{anchor}")
    assert not broken, "\n".join(broken)


def test_every_named_docs_page_exists() -> None:
    """A ``docs/<page>.md`` named anywhere is a page of the repository."""
    missing = [
        f"{where(path, text, match.start())}: docs/{match['page']}.md"
        for path, text in texts().items()
        for match in PAGE_REF.finditer(text)
        if not (DOCS / f"{match['page']}.md").is_file()
    ]
    assert not missing, "\n".join(missing)


def test_no_reference_points_outside_the_repository_to_the_former_brief() -> None:
    """Rules are cited by their docs/ section; none by a section number of a document that is
    not in the repository."""
    stale = [
        where(path, text, match.start())
        for path, text in texts().items()
        for match in FORMER_BRIEF.finditer(text)
    ]
    assert not stale, "cite the docs/ section instead:\n" + "\n".join(stale)


def error_classes() -> dict[str, int]:
    """Every problem code of the service's error hierarchy (its base's ``INTERNAL`` included),
    with its HTTP status; classes that tests derive are not the service's."""
    found: dict[str, int] = {}
    pending: list[type[errors.ServiceError]] = [errors.ServiceError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("context_assembly."):
            found[cls.code] = cls.status
    return found


def test_the_contract_lists_every_error_code_with_its_status() -> None:
    """docs/contract.md's "Errors" table has one row per error class, with its status."""
    text = (DOCS / "contract.md").read_text(encoding="utf-8")
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(?P<code>[A-Z_]+)` \| (?P<status>\d{3}) \|", section, re.MULTILINE)
    assert rows, "no table in the Errors section"
    assert {code: int(status) for code, status in rows} == error_classes()
    assert len(rows) == len(error_classes())


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Cache plans: the `cache` object", "cache-plans-the-cache-object"),
        ("4.7 Shutdown", "47-shutdown"),
        ("`POST /v1/prepare`", "post-v1prepare"),
        ("Vercel AI SDK (TypeScript)", "vercel-ai-sdk-typescript"),
        ("See [the API](api.md) now", "see-the-api-now"),
    ],
)
def test_anchors_are_made_as_github_makes_them(heading: str, anchor: str) -> None:
    """The anchor of a heading: what a rendered page links to."""
    assert slug(heading) == anchor
