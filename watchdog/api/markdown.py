"""A small, safe Markdown-to-HTML rendering for the project's own docs (the runbooks the watchdog serves).

It knows what docs/runbooks.md uses and little more: ATX headings (each with GitHub's anchor, so
`docs/runbooks.md#vllmdown` lands on `## VLLMDown`), paragraphs, `-`/`*`/`1.` lists with indented
continuation lines, fenced code, pipe tables, block quotes, rules, and inline code, bold, emphasis and links.
Every text is HTML-escaped; no raw HTML passes. A link is kept when it is http(s) or an anchor on the page; a
link to the page itself (`runbooks.md#x`) becomes the anchor; any other relative link (a sibling doc, which
the watchdog does not serve) is shown as its text and its path under docs/. The output is one HTML fragment.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)")
_ITEM = re.compile(r"^([-*+]|\d{1,9}[.)])\s+(.*)$")
_RULE = re.compile(r"^(\*\s*){3,}$|^(-\s*){3,}$|^(_\s*){3,}$")
_TABLE_SEP = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_INLINE = re.compile(
    r"(?P<code>(?P<ticks>`+)(?P<codetext>.+?)(?P=ticks))"
    r"|(?P<link>\[(?P<linktext>[^\]]+)\]\((?P<url>[^)\s]+)\))"
    r"|(?P<strong>\*\*(?P<strongtext>.+?)\*\*)"
    r"|(?P<em>(?<![\w*])[*_](?P<emtext>[^*_\s](?:[^*_]*[^*_\s])?)[*_](?![\w*]))"
)


def slug(text: str) -> str:
    """GitHub's anchor for a heading: its plain text lowercased, punctuation dropped, spaces to hyphens."""
    plain = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")


def _e(text: str) -> str:
    return html.escape(text, quote=False)


def _link(text: str, url: str, page: str) -> str:
    inner = inline(text, page)
    if url.startswith("#") or url.startswith(page + "#"):
        return f'<a href="#{html.escape(url.partition("#")[2])}">{inner}</a>'
    if re.match(r"^https?://", url, flags=re.IGNORECASE):
        return f'<a href="{html.escape(url)}" rel="noreferrer">{inner}</a>'
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", url):  # javascript:, data:, ...: the text only
        return inner
    return f"{inner} (<code>docs/{_e(url)}</code>)"


def inline(text: str, page: str = "runbooks.md") -> str:
    """One line's inline Markdown as escaped HTML; `page` is the file whose own links become anchors."""
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(_e(text[at : m.start()]))
        if m.group("code"):
            out.append(f"<code>{_e(m.group('codetext').strip())}</code>")
        elif m.group("link"):
            out.append(_link(m.group("linktext"), m.group("url"), page))
        elif m.group("strong"):
            out.append(f"<strong>{inline(m.group('strongtext'), page)}</strong>")
        else:
            out.append(f"<em>{inline(m.group('emtext'), page)}</em>")
        at = m.end()
    out.append(_e(text[at:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


class _Blocks:
    """The block parser: one pass over the lines, each block rendered as it ends."""

    def __init__(self, text: str, page: str) -> None:
        self.lines = text.replace("\r\n", "\n").split("\n")
        self.page = page
        self.at = 0
        self.out: list[str] = []
        self.anchors: dict[str, int] = {}

    def render(self) -> str:
        """The whole document as HTML."""
        starts: list[tuple[Callable[[str], bool], Callable[[], None]]] = [
            (lambda s: not s.strip(), self._blank),
            (lambda s: bool(_FENCE.match(s)), self._fence),
            (lambda s: bool(_HEADING.match(s)), self._heading),
            (lambda s: bool(_RULE.match(s.strip())), self._rule),
            (self._is_table, self._table),
            (lambda s: bool(_ITEM.match(s)), self._list),
            (lambda s: s.startswith(">"), self._quote),
        ]
        while self.at < len(self.lines):
            line = self.lines[self.at]
            next(fn for test, fn in [*starts, (lambda s: True, self._paragraph)] if test(line))()
        return "\n".join(self.out) + "\n"

    def _starts_block(self, line: str) -> bool:
        return bool(
            not line.strip()
            or _FENCE.match(line)
            or _HEADING.match(line)
            or _ITEM.match(line)
            or line.startswith(">")
            or self._is_table(line)
        )

    def _is_table(self, line: str) -> bool:
        nxt = self.lines[self.at + 1] if self.at + 1 < len(self.lines) else ""
        return line.lstrip().startswith("|") and bool(_TABLE_SEP.match(nxt.strip()))

    def _blank(self) -> None:
        self.at += 1

    def _rule(self) -> None:
        self.out.append("<hr>")
        self.at += 1

    def _fence(self) -> None:
        m = _FENCE.match(self.lines[self.at])
        assert m is not None
        fence, lang = m.group(1), m.group(2)
        self.at += 1
        body = []
        while self.at < len(self.lines) and not self.lines[self.at].startswith(fence):
            body.append(self.lines[self.at])
            self.at += 1
        self.at += 1  # the closing fence (or the end)
        cls = f' class="language-{lang}"' if lang else ""
        self.out.append(f"<pre><code{cls}>{_e(chr(10).join(body))}</code></pre>")

    def _heading(self) -> None:
        m = _HEADING.match(self.lines[self.at])
        assert m is not None
        level, text = len(m.group(1)), m.group(2)
        anchor = slug(text)
        seen = self.anchors.get(anchor, 0)
        self.anchors[anchor] = seen + 1
        anchor = f"{anchor}-{seen}" if seen else anchor
        self.out.append(f'<h{level} id="{html.escape(anchor)}">{inline(text, self.page)}</h{level}>')
        self.at += 1

    def _paragraph(self) -> None:
        body = [self.lines[self.at].strip()]
        self.at += 1
        while self.at < len(self.lines) and not self._starts_block(self.lines[self.at]):
            if _RULE.match(self.lines[self.at].strip()):
                break
            body.append(self.lines[self.at].strip())
            self.at += 1
        self.out.append(f"<p>{inline(' '.join(body), self.page)}</p>")

    def _quote(self) -> None:
        body = []
        while self.at < len(self.lines) and self.lines[self.at].startswith(">"):
            body.append(self.lines[self.at][1:].strip())
            self.at += 1
        self.out.append(f"<blockquote><p>{inline(' '.join(body), self.page)}</p></blockquote>")

    def _list(self) -> None:
        first = _ITEM.match(self.lines[self.at])
        assert first is not None
        ordered = first.group(1)[0].isdigit()
        items: list[list[str]] = []
        while self.at < len(self.lines):
            line = self.lines[self.at]
            m = _ITEM.match(line)
            if m and m.group(1)[0].isdigit() == ordered:
                items.append([m.group(2).strip()])
            elif line.startswith((" ", "\t")) and line.strip() and items:
                items[-1].append(line.strip())
            elif not line.strip() and self._list_goes_on(ordered):
                pass
            else:
                break
            self.at += 1
        tag = "ol" if ordered else "ul"
        rows = "".join(f"<li>{inline(' '.join(item), self.page)}</li>" for item in items)
        self.out.append(f"<{tag}>{rows}</{tag}>")

    def _list_goes_on(self, ordered: bool) -> bool:
        """After a blank line, whether the next line is another item of the same list."""
        nxt = self.lines[self.at + 1] if self.at + 1 < len(self.lines) else ""
        m = _ITEM.match(nxt)
        return bool(m and m.group(1)[0].isdigit() == ordered)

    def _table(self) -> None:
        head = _cells(self.lines[self.at])
        self.at += 2  # the header and its separator
        rows = []
        while self.at < len(self.lines) and self.lines[self.at].lstrip().startswith("|"):
            rows.append(_cells(self.lines[self.at]))
            self.at += 1
        cells = "".join(f"<th>{inline(c, self.page)}</th>" for c in head)
        parts = [f"<table><tr>{cells}</tr>"]
        for row in rows:
            padded = (row + [""] * len(head))[: len(head)]
            parts.append("<tr>" + "".join(f"<td>{inline(c, self.page)}</td>" for c in padded) + "</tr>")
        self.out.append("".join(parts) + "</table>")


def render(text: str, page: str = "runbooks.md") -> str:
    """A Markdown document as an HTML fragment; links to `page` itself become anchors on it."""
    return _Blocks(text, page).render()
