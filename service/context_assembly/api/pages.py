"""The shell of the service's HTML pages (the breakdown and the timeline): one stylesheet, no
scripts, no external resources, and the escaping of what callers name. Each page is sent with
``POLICY`` as its Content-Security-Policy, so that a browser runs no script and loads nothing
for it even if something a caller named got past the escaping.

The pages are read on phones as well as on wide screens: nothing may be wider than the viewport
at 360 px. Text wraps anywhere when it must (ids and hashes have no spaces), every table sits
in a container that scrolls sideways on its own, and charts take the width they are given.
"""

from __future__ import annotations

from html import escape
from typing import Final

POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""The Content-Security-Policy of the pages: no script, no request of any kind (images, fonts,
frames, connections), forms and embedding refused; only their own styles, which are inline (the
``<style>`` element and the ``style`` attributes of bars and swatches)."""

STYLE = """
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%;text-size-adjust:100%}
body{font:15px/1.45 system-ui,sans-serif;color:#222;margin:0 auto;padding:1rem;max-width:72rem;
overflow-wrap:anywhere}
h1{font-size:1.35rem;margin:.2rem 0 .6rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
p,dl,ul{max-width:100%}
a{color:#0a58ca}
.scroll{max-width:100%;overflow-x:auto;margin:.6rem 0}
table{border-collapse:collapse}
td,th{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left;vertical-align:top;
overflow-wrap:normal}
th{font-weight:600;background:#f6f8fa}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}td.n{white-space:nowrap}
tr.sum td{border-top:2px solid #999;font-weight:600}
code,.id{font-family:ui-monospace,monospace;font-size:.92em;overflow-wrap:anywhere}
td .id,td.nw{white-space:nowrap}
.sw{display:inline-block;width:.8rem;height:.8rem;vertical-align:middle;margin-right:.35rem;
border-radius:2px}
.note{background:#fff8c5;padding:.4rem .8rem;border-radius:4px}
dl.facts{display:grid;grid-template-columns:minmax(7rem,max-content) minmax(0,1fr);
gap:.3rem 1rem;margin:.6rem 0}
dl.facts dt{font-weight:600}dl.facts dd{margin:0}
dl.facts ul{margin:0;padding-left:1.1rem}
h1 .id{font-size:.8em}
@media (max-width:40rem){body{padding:.6rem}dl.facts{grid-template-columns:minmax(0,1fr)}
dl.facts dd{margin:0 0 .4rem .8rem}
table.cards,table.cards tbody,table.cards tr,table.cards td{display:block;width:100%}
table.cards tr:first-child{display:none}
table.cards tr{border-bottom:1px solid #bbb;padding:.3rem 0}
table.cards td{border:0;padding:.05rem .3rem;text-align:left;white-space:normal}
table.cards td .id{white-space:normal;overflow-wrap:anywhere}
table.cards td::before{content:attr(data-label) ": ";font-weight:600;color:#555}
table.cards td:empty{display:none}}
"""
"""The stylesheet both pages share; a page adds its own rules after it. A table of class
``cards`` (its first row the headings, each cell with ``data-label``) shows each row as a card
of labelled lines on a narrow screen."""


def shown(text: str) -> str:
    """``text`` with every character ``str.isprintable`` refuses (controls, format characters
    such as bidi overrides, line and paragraph separators) written as its escape, ``\\n`` or
    ``\\u202e``: a source or block id is the caller's to choose, and must not start a line of
    its own, move the terminal's cursor or reorder what is shown around it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def e(text: str) -> str:
    """``text`` for HTML: ``shown`` and escaped."""
    return escape(shown(text))


def cell(label: str, content: str, cls: str = "") -> str:
    """A table cell of a ``cards`` table: ``content`` is HTML, ``label`` its column's heading."""
    attrs = f' class="{cls}"' if cls else ""
    return f'<td data-label="{escape(label)}"{attrs}>{content}</td>'


def count(value: int | None) -> str:
    """A count, or "-" when the provider did not report it (never Python's "None")."""
    return "-" if value is None else str(value)


def usd(value: float | None) -> str:
    """A cost in USD as exactly as it is kept (to 1e-9), without trailing zeros: ``0.063312``,
    ``0``; "-" when there is none."""
    if value is None:
        return "-"
    return f"{value:.9f}".rstrip("0").rstrip(".")


def duration(seconds: float) -> str:
    """A span of time in words a reader takes in at once: ``45 s``, ``5 min 10 s``,
    ``12 min``, ``1 h 5 min``."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 10 and rest:  # "5 min 10 s": a lifetime of 5 minutes is not yet "5 min"
        return f"{minutes} min {rest} s"
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h" if hours % 24 else f"{hours // 24} d"


def page(title: str, style: str, body: str) -> str:
    """A whole HTML document: ``title`` (escaped here), the shared stylesheet followed by the
    page's own ``style``, and ``body`` (already HTML)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)}</title>
<style>{STYLE}{style}</style></head><body>
{body}
</body></html>
"""
