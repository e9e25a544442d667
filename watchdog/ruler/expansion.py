"""Expanding an alerting rule's label and annotation templates for each alert, remembered between evaluations.

A template's output depends only on the series' labels, the sample value, the external labels and URL (no
template function reads the time or the store), so an alert that comes back with the same labels, and the
same value where the template may read it, gets last evaluation's text. Failed expansions are never kept:
they are logged again each time, as Prometheus does.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Mapping

from ..store import Labels
from ..templates import Template, TemplateError

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"\$\w*(?:\.\w+)*|\d+(?:\.\d+)?|\w+|\S")


def _actions(text: str) -> Iterator[str]:
    """What stands between each `{{` and the first `}}` after it, left to right. Found with str.find, in
    linear time: a regex `{{(.*?)}}` scans to the end of the text from every `{{` that no `}}` follows (a rule
    file can hold 8 MB of them; 40 kB took 34 s)."""
    at = 0
    while (start := text.find("{{", at)) >= 0 and (end := text.find("}}", start + 2)) >= 0:
        yield text[start + 2 : end]
        at = end + 2


def reads_value(text: str) -> bool:
    """Whether a template may read the alert's value: `$value`, or the data root through `$` or the cursor."""
    for action in _actions(text):
        if any(c in action for c in "\"'`/"):  # a string or a comment could hide the closing delimiter
            return True
        for token in _TOKEN.findall(action):
            if token[0] == "." or token == "$" or token.startswith(("$.", "$value")):
                return True
    return False


class Expander:
    """A template compiled once; expansion errors render as Prometheus renders them."""

    def __init__(self, text: str, rule_name: str) -> None:
        self.text = text
        self.rule_name = rule_name
        self.template: Template | None = None
        self.error: str | None = None
        if "{{" in text:
            try:
                self.template = Template(text)
            except TemplateError as exc:
                self.error = str(exc)
        self.reads_value = reads_value(text)
        self._last: dict[Labels, tuple[float, str]] = {}
        self._now: dict[Labels, tuple[float, str]] = {}

    def expand(self, labels: Mapping[str, str], value: float, external: Mapping[str, str], url: str) -> str:
        """The text with $labels, $value, $externalLabels and $externalURL filled in."""
        return self._render(labels, value, external, url)[0]

    def expand_for(
        self, key: Labels, labels: Mapping[str, str], value: float, external: Mapping[str, str], url: str
    ) -> str:
        """expand() for the series `key`, reusing the text of the last evaluation where it cannot differ."""
        if self.template is None:
            return self.expand(labels, value, external, url)
        hit = self._now.get(key) or self._last.get(key)
        if hit is not None and (not self.reads_value or _same(hit[0], value)):
            self._now[key] = hit
            return hit[1]
        text, ok = self._render(labels, value, external, url)
        if ok:
            self._now[key] = (value, text)
        return text

    def next_evaluation(self) -> None:
        """Keep only what this evaluation expanded for the next one."""
        self._last, self._now = self._now, {}

    def forget(self) -> None:
        """Drop every remembered text (the external labels or URL changed)."""
        self._last, self._now = {}, {}

    def _render(
        self, labels: Mapping[str, str], value: float, external: Mapping[str, str], url: str
    ) -> tuple[str, bool]:
        if self.template is None and self.error is None:
            return self.text, True
        error = self.error
        if self.template is not None:
            try:
                return self.template.render(labels, value, external_labels=external, external_url=url), True
            except TemplateError as exc:
                error = str(exc)
            except Exception as exc:  # a template engine bug must not fail the rule; Prometheus never does
                error = f"{type(exc).__name__}: {exc}"
        log.warning("expanding alert template failed", extra={"alert": self.rule_name, "err": error})
        return f"<error expanding template: {error}>", False


def _same(a: float, b: float) -> bool:
    # Bit for bit: 0.0 and -0.0 print differently, and NaN never matches (it is expanded again).
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
