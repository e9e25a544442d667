"""JSON answers of the own API: they cannot fail on text that was stored before bodies were checked
(`jsontext` parses and checks what comes in)."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from ..jsontext import printable


class JSONAnswer(JSONResponse):
    """A JSON response that encodes a stored lone surrogate as U+FFFD instead of failing with a 500."""

    def render(self, content: Any) -> bytes:
        """UTF-8 JSON, as Starlette writes it; with U+FFFD for what UTF-8 cannot hold."""
        try:
            return super().render(content)
        except UnicodeEncodeError:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            return printable(text).encode("utf-8")
