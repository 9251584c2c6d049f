"""Reading the breakdown and timeline pages in tests: the standard library's HTML parser collects
tables (cell texts row by row), the cache section's facts, links, the stylesheet, the element
each table sits in, and the chart's SVG elements with their attributes; and a conversation of
Anthropic turns against the in-process app."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from api_support import FakeWall

MODEL = "claude-sonnet-4-5"  # minimum cacheable prefix 1,024 in the registry data
INSTRUCTIONS = "You are a careful assistant. " * 200  # about 1,200 tokens: above the minimum


def tool(name: str, words: int = 200) -> dict[str, Any]:
    return {
        "name": name,
        "description": " ".join(f"{name}-word{i}" for i in range(words)),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }


def turn_body(scope: dict[str, str], **fields: Any) -> dict[str, Any]:
    """An Anthropic turn with cache breakpoints, two tools and long instructions."""
    base: dict[str, Any] = {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "tools": [tool("search"), tool("fetch")],
        "history": [],
        "input": [{"role": "user", "content": "What now?"}],
        "assembly": {"layout": "stable-prefix"},
        "render": "anthropic",
        "cache": {"breakpoints": True},
        "scope": scope,
    }
    base.update(fields)
    return {key: value for key, value in base.items() if value is not None}


def new_scope() -> dict[str, str]:
    return {"task_id": f"view-{secrets.token_hex(4)}"}


def ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def prepare(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    return ok(client.post("/v1/prepare", json=body))


def report(client: Any, prep_id: str, cached: int, report_id: str = "r1") -> dict[str, Any]:
    """A usage report of the main call with ``cached`` tokens read from the cache."""
    usage = {"input_tokens": 100, "cache_read_input_tokens": cached, "output_tokens": 5}
    payload = {"report_id": report_id, "provider": "anthropic", "usage": usage}
    return ok(client.post(f"/v1/preparations/{prep_id}/usage", json=payload))


def next_history(body: dict[str, Any], number: int) -> dict[str, Any]:
    """The next turn's body: the previous exchange appended to the history."""
    exchange = [
        {"role": "user", "content": f"question {number}"},
        {"role": "assistant", "content": f"answer {number}"},
    ]
    return {**body, "history": [*body["history"], *exchange]}


def converse(client: Any, wall: FakeWall, body: dict[str, Any], turns: int) -> list[str]:
    """``turns`` turns a minute apart, each appending the previous exchange; the ids."""
    ids = []
    for number in range(turns):
        ids.append(prepare(client, body)["preparation_id"])
        wall.now += 60
        body = next_history(body, number)
    return ids


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None
    text: list[str] = field(default_factory=list)

    def cls(self) -> set[str]:
        return set(self.attrs.get("class", "").split())


class Page(HTMLParser):
    """Every element with its attributes and parent, and the text inside it."""

    VOID = frozenset({"meta", "br", "input", "img", "link", "path", "line"})

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        parent = self._open[-1] if self._open else None
        element = Element(tag, {k: v or "" for k, v in attrs}, parent)
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        parent = self._open[-1] if self._open else None
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}, parent))

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index].tag == tag:
                del self._open[index:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text.append(data)

    # ------------------------------------------------------------------ queries

    def by_id(self, ident: str) -> Element:
        return next(e for e in self.elements if e.attrs.get("id") == ident)

    def inside(self, outer: Element, tag: str) -> list[Element]:
        """The ``tag`` elements within ``outer``, in document order."""
        found = []
        for element in self.elements:
            node = element.parent
            while node is not None and node is not outer:
                node = node.parent
            if node is outer and element.tag == tag:
                found.append(element)
        return found

    def text(self, element: Element) -> str:
        return " ".join("".join(element.text).split())

    def table(self, ident: str) -> list[list[str]]:
        """The cell texts of ``<table id=ident>``, row by row (the heading row first)."""
        table = self.by_id(ident)
        rows = []
        for row in self.inside(table, "tr"):
            cells = [c for c in self.elements if c.parent is row and c.tag in ("td", "th")]
            rows.append([self.text(c) for c in cells])
        return rows

    def facts(self, ident: str) -> dict[str, str]:
        """The ``<dt>``/``<dd>`` pairs of ``<dl id=ident>``; a ``<dd>`` holding a list is its
        items' texts joined by " | "."""
        names = self.inside(self.by_id(ident), "dt")
        values = self.inside(self.by_id(ident), "dd")
        found = {}
        for name, value in zip(names, values, strict=True):
            items = self.inside(value, "li")
            said = " | ".join(self.text(i) for i in items) if items else self.text(value)
            found[self.text(name)] = said
        return found

    def style(self) -> str:
        return "".join("".join(e.text) for e in self.elements if e.tag == "style")
