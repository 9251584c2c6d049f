"""The breakdown's HTML against the prepare answer it shows: the window as a stacked bar of every
budget term, the free window and the reserves (each small term still visible), a row per part
with its figure and share, the remaining tokens, one row per block with its dependencies and per
source, in the answer's order and with its figures (read with the standard library's HTML
parser)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from api_support import AppFactory, basic_request

# The parts of the window the page shows in frame order, with the answer's field for each
# (written out here, not taken from the module under test); "free window" is what the selected
# data left of the remaining tokens.
PARTS = (
    ("instructions", "instructions_tokens"),
    ("legacy data + date", "legacy_data_tokens"),
    ("tools", "tools_tokens"),
    ("history", "history_tokens"),
    ("input", "input_tokens"),
    ("selected data", "data_tokens"),
    ("free window", None),
    ("response reserve", "response_reserve"),
    ("reasoning reserve", "reasoning_reserve_tokens"),
)


def _parts(budget: dict[str, int]) -> list[tuple[str, int]]:
    free = budget["remaining_tokens"] - budget["data_tokens"]
    return [(label, budget[key] if key else free) for label, key in PARTS]


def _share(tokens: int, capacity: int) -> str:
    share = 100 * tokens / capacity
    if share == 0:
        return "0%"
    return f"{share:.2f}%" if share < 1 else f"{share:.1f}%"


class Tables(HTMLParser):
    """The cells of each ``<table id=...>``, row by row, each bar's style by table, and the
    stacked window's segments (style and title)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.bars: dict[str, list[str]] = {}
        self.segments: list[tuple[str, str]] = []
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
        elif tag == "span" and found.get("class") == "seg":
            self.segments.append((found.get("style") or "", found.get("title") or ""))

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
        {
            "id": f"entry-{i}",
            "text": f"Entry {i}. " * (40 * i + 1),
            "priority": i,
            # every other entry needs the one before it and the receipt
            "dependencies": [f"memory/entry-{i - 1}", "memory/receipt"] if i % 2 else [],
        }
        for i in range(6)
    ]
    # The default window of gpt-4o-mini (128,000 tokens): the input terms are a few tokens each.
    body["assembly"] = {"layout": "stable-prefix", "max_data_tokens": 300}
    body["response_reserve"] = 1000
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
    capacity = budget["capacity"]
    parts = _parts(budget)
    assert sum(tokens for _, tokens in parts) == capacity  # the parts fill the window
    rows = parsed.tables["budget"][1:]  # after the heading row
    assert rows == [
        [label, str(tokens), _share(tokens, capacity), ""] for label, tokens in parts
    ] + [
        [
            "remaining tokens (for data, after the input terms and the reserves)",
            str(budget["remaining_tokens"]),
            _share(budget["remaining_tokens"], capacity),
            "",
        ],
        ["capacity", str(capacity), "100%", ""],
    ]
    # A bar per part: its share of 400 px, but never under 4 px when the part is not empty.
    widths = [max(4.0, 400 * t / capacity) if t else 0.0 for _, t in parts]
    assert [bar.split(";")[0] for bar in parsed.bars["budget"]] == [
        f"width:{w:.1f}px" for w in widths
    ]
    # The stacked window: every non-empty part in frame order, sized by its tokens.
    shown = [(label, t) for label, t in parts if t > 0]
    assert [style.split(";")[0] for style, _ in parsed.segments] == [
        f"flex:{t} 1 0" for _, t in shown
    ]
    assert [title for _, title in parsed.segments] == [
        f"{label}: {t} tokens, {_share(t, capacity)}" for label, t in shown
    ]
    small = [label for label, t in shown if t < capacity / 400]  # under a pixel if proportional
    assert {"instructions", "input", "history"} <= set(small)
    assert "min-width:4px" in page  # ... which the stylesheet keeps visible
    blocks = prep["selection"]["blocks"]
    assert {b["status"] for b in blocks} >= {"selected", "omitted"}  # the page shows both kinds
    assert any(b["dependencies"] for b in blocks)
    assert [row[:5] + row[8:] for row in parsed.tables["blocks"][1:]] == [
        [
            f"{b['source']}/{b['id']}",
            b["status"],
            b["reason"],
            str(b["tokens"]),
            str(b["full_tokens"]),
            ", ".join(b["dependencies"]),
        ]
        for b in blocks
    ]
    sources = prep["selection"]["sources"]
    assert [row[:3] + row[4:5] for row in parsed.tables["sources"][1:]] == [
        [s["source"], s["kind"], s["status"], str(s["block_count"])] for s in sources
    ]
    assert "Entry 3." not in page  # the record has no block text to show


MARKS = "ILTHUDFRQ"  # one per part of PARTS, in order


def test_the_text_view_shows_the_window_the_remaining_tokens_and_the_dependencies(
    make_client: AppFactory,
) -> None:
    client = make_client()
    prep = client.post("/v1/prepare", json=_request()).json()
    text = client.get(f"/v1/preparations/{prep['preparation_id']}/breakdown").text
    lines = text.splitlines()
    budget = prep["budget"]
    parts = _parts(budget)
    window = next(ln for ln in lines if ln.startswith("  window ["))
    bar = window[window.index("[") + 1 : window.index("]")]
    assert len(bar) == 60 and window.endswith(f"] {budget['capacity']}")
    # Every non-empty part has at least one mark, in frame order; empty parts none.
    assert "".join(dict.fromkeys(bar)) == "".join(
        mark for mark, (_, t) in zip(MARKS, parts, strict=True) if t > 0
    )
    for mark, (label, tokens) in zip(MARKS, parts, strict=True):
        assert f"  {mark} {label:<20} {tokens:>9}  {_share(tokens, budget['capacity']):>7}" in lines
    assert any(
        ln.split()[:3] == ["remaining", "tokens", str(budget["remaining_tokens"])] for ln in lines
    )
    for block in prep["selection"]["blocks"]:
        line = next(ln for ln in lines if ln.split()[5:6] == [f"{block['source']}/{block['id']}"])
        needs = ", ".join(block["dependencies"])
        assert line.endswith(f"  <- {needs}") if needs else "<-" not in line
