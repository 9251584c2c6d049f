"""The breakdown's HTML against the prepare answer it shows: every budget term with its figure
and a bar of its share, one row per block and per source, in the answer's order and with its
figures (read with the standard library's HTML parser)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from api_support import AppFactory, basic_request

# The budget terms the page shows, with the answer's field for each (written out here, not
# taken from the module under test).
TERMS = (
    ("instructions", "instructions_tokens"),
    ("legacy data + date", "legacy_data_tokens"),
    ("tools", "tools_tokens"),
    ("history", "history_tokens"),
    ("input", "input_tokens"),
    ("selected data", "data_tokens"),
    ("response reserve", "response_reserve"),
    ("reasoning reserve", "reasoning_reserve_tokens"),
)


class Tables(HTMLParser):
    """The cells of each ``<table id=...>``, row by row, and each bar's width by row."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.bars: dict[str, list[str]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table":
            self._table = found.get("id") or ""
            self.tables[self._table] = []
            self.bars[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag == "span" and found.get("class") == "bar" and self._table is not None:
            self.bars[self._table].append(found.get("style") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._table is not None and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _request() -> dict[str, Any]:
    body = basic_request()
    blocks = body["contributions"][0]["blocks"]
    blocks += [
        {"id": f"entry-{i}", "text": f"Entry {i}. " * (40 * i + 1), "priority": i} for i in range(6)
    ]
    body["assembly"] = {"layout": "stable-prefix", "max_data_tokens": 300}
    return body


def test_the_html_tables_carry_the_answers_figures(make_client: AppFactory) -> None:
    client = make_client()
    prep = client.post("/v1/prepare", json=_request()).json()
    page = client.get(
        f"/v1/preparations/{prep['preparation_id']}/breakdown", headers={"Accept": "text/html"}
    ).text
    parsed = Tables()
    parsed.feed(page)
    budget = prep["budget"]
    rows = parsed.tables["budget"][1:]  # after the heading row
    assert [row[:2] for row in rows] == [[label, str(budget[key])] for label, key in TERMS]
    widths = [400 * budget[key] / budget["capacity"] for _, key in TERMS]
    assert parsed.bars["budget"] == [f"width:{w:.1f}px" for w in widths]
    blocks = prep["selection"]["blocks"]
    assert {b["status"] for b in blocks} >= {"selected", "omitted"}  # the page shows both kinds
    assert [row[:5] for row in parsed.tables["blocks"][1:]] == [
        [
            f"{b['source']}/{b['id']}",
            b["status"],
            b["reason"],
            str(b["tokens"]),
            str(b["full_tokens"]),
        ]
        for b in blocks
    ]
    sources = prep["selection"]["sources"]
    assert [row[:3] + row[4:5] for row in parsed.tables["sources"][1:]] == [
        [s["source"], s["kind"], s["status"], str(s["block_count"])] for s in sources
    ]
    assert "Entry 3." not in page  # the record has no block text to show
