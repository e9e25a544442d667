"""Go text/template as Prometheus expands alert labels and annotations (the subset rule files use).

Prometheus prefixes every template with `{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}
{{$externalURL := .ExternalURL}}{{$value := .Value}}` and runs it with `missingkey=zero` and its own
function map; `Template` does the same without the prefix text, so error positions refer to the rule's text.
"""

from __future__ import annotations

from collections.abc import Mapping

from .execute import Executor
from .functions import NAMES, UNSUPPORTED
from .govalues import AlertData
from .lexer import TemplateError
from .nodes import Node
from .parser import Parser

_PREDECLARED = ["$", "$labels", "$externalLabels", "$externalURL", "$value"]


class Template:
    """A template compiled once (at rule-load time) and rendered per alert."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._tree: list[Node] = Parser(text, NAMES, UNSUPPORTED, _PREDECLARED).parse()

    def render(
        self,
        labels: Mapping[str, str],
        value: float,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
    ) -> str:
        """Expand for one alert; raises TemplateError where Prometheus would report an expansion error."""
        data = AlertData(dict(labels), dict(external_labels or {}), external_url, float(value))
        return Executor(self.text, data, external_url).run(self._tree, data)


def check_template(text: str) -> str | None:
    """The compile error of a template, or None when it is fine."""
    try:
        Template(text)
    except TemplateError as e:
        return str(e)
    return None


__all__ = ["Template", "TemplateError", "check_template"]
