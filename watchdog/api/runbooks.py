"""`/runbooks`: the runbooks of this release, served by the watchdog, where every alert's runbook_url points.

The page is docs/runbooks.md rendered to HTML (api/markdown.py), one section and anchor per alert. The
rendering ships in the package (defaults/runbooks.html, written by scripts/render-runbooks.py; a test fails
while it differs from the doc), so the links work offline and match the installed version. The bundled
rules' relative `runbook_url` (`docs/runbooks.md#vllmdown`) resolves against the default `runbook_base_url`,
the external URL, so the same page is also served at `/docs/runbooks.md`. It loads nothing, runs no script.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from .. import __version__
from .markdown import render

RENDERED = "defaults/runbooks.html"  # in the package
_STYLE = (
    "body{font-family:sans-serif;margin:2em auto;max-width:60em;padding:0 1em;line-height:1.4}"
    "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}code{background:#f4f4f4}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
    "h2{border-top:1px solid #ddd;padding-top:.5em}"
)
# Nothing loads and no script runs; the one inline style is allowed by its hash.
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'",
    "X-Content-Type-Options": "nosniff",
}


def rendering(markdown: str) -> str:
    """What defaults/runbooks.html holds for this docs/runbooks.md."""
    return render(markdown, page="runbooks.md")


@cache
def page() -> bytes:
    """The page: the packaged rendering in a document that names the version."""
    body = resources.files("vllm_watchdog").joinpath(RENDERED).read_text(encoding="utf-8")
    title = f"vllm-watchdog {html.escape(__version__)} runbooks"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_STYLE}</style>"
        f"</head><body><p><small>{title}, served by the watchdog</small></p>\n{body}</body></html>"
    ).encode()


def runbooks_handler() -> Callable[[Request], Any]:
    """GET /runbooks (and /docs/runbooks.md): the page; anchors are the alert names in lower case."""

    async def runbooks(request: Request) -> Response:
        return HTMLResponse(page(), headers=HEADERS)

    return runbooks
