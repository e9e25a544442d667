"""`/graph`, where every alert's generatorURL points: a page with the expression and its value, not a 404."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.faultserver import FaultServer
from tests.support.watchdogproc import alerting_watchdog
from vllm_watchdog.api.graph import MAX_ROWS, render

ROOT = Path(__file__).resolve().parents[2]
RULES = """groups:
  - name: t
    rules:
      - alert: Probed
        expr: vllm_watchdog_health_up > 0
"""


def test_an_alerts_generator_url_opens_a_page_with_its_expression_and_value(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    base, proc, log, _ = alerting_watchdog(tmp_path, fault, cleanup, RULES)
    # The link the ruler gives the alert (tests/ruler/test_links.py checks its form): the external URL, here
    # the listen address's default.
    url = f"{base}/graph?g0.expr=vllm_watchdog_health_up+%3E+0&g0.tab=1"
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    assert resp.headers["content-security-policy"] == "default-src 'none'"
    assert "vllm_watchdog_health_up &gt; 0" in resp.text
    assert 'target="vllm-0"' in resp.text and "<td>1</td>" in resp.text
    bad = httpx.get(base + "/graph", params={"g0.expr": "rate(<script>"}, timeout=10)
    assert bad.status_code == 400 and "<script>" not in bad.text and "parse error" in bad.text
    assert proc.poll() is None, log.read_text()[-3000:]


def test_the_page_escapes_what_it_shows_and_caps_its_rows() -> None:
    result = [
        {"metric": {"__name__": "x", "l": f"<b>{i}</b>"}, "value": [0, "1"]} for i in range(MAX_ROWS + 5)
    ]
    page = render("x{l=~'<i>'}", 0.0, {"resultType": "vector", "result": result}, None).decode()
    assert "<b>" not in page and "<i>" not in page and "&lt;b&gt;0&lt;/b&gt;" in page
    assert f"{MAX_ROWS + 5} result(s) (the first {MAX_ROWS})" in page
    assert page.count("<tr>") == MAX_ROWS + 1  # the header row
    error = render("up", 0.0, None, "1:3: parse error: <oops>").decode()
    assert "&lt;oops&gt;" in error and "<oops>" not in error
