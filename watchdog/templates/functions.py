"""The function map: text/template's built-ins and Prometheus' template functions (v2.42)."""

from __future__ import annotations

from urllib.parse import urlsplit

from .builtins import BUILTINS, Func
from .promfuncs import PROMETHEUS

UNSUPPORTED = {
    name: "it needs a PromQL query at render time, which alert templates here do not run"
    for name in ("query", "first", "label", "value", "strvalue", "sortByLabel")
}
NAMES = frozenset({*BUILTINS, *PROMETHEUS, "externalURL", "pathPrefix"})


def function_map(external_url: str) -> dict[str, Func]:
    """All functions, with externalURL and pathPrefix bound to this render's URL."""
    path = urlsplit(external_url).path
    return {
        **BUILTINS,
        **PROMETHEUS,
        "externalURL": Func((), lambda: external_url),
        "pathPrefix": Func((), lambda: path),
    }
