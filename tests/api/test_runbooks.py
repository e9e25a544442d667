"""`/runbooks`: the watchdog serves docs/runbooks.md, so every alert's runbook_url opens its section offline."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urldefrag

import httpx
import yaml

from tests.support.faultserver import FaultServer
from tests.support.watchdogproc import alerting_watchdog
from vllm_watchdog.actions.pipeline import selfalerts
from vllm_watchdog.api.markdown import render, slug
from vllm_watchdog.api.runbooks import rendering
from vllm_watchdog.fleet import alerts as fleetalerts

ROOT = Path(__file__).resolve().parents[2]
RULES = """groups:
  - name: t
    rules:
      - alert: Probed
        expr: vllm_watchdog_health_up > 0
        annotations: {runbook_url: "docs/runbooks.md#vllmdown"}
"""


def _bundled_links() -> dict[str, str]:
    """alertname -> runbook_url of every bundled rule."""
    out = {}
    for path in sorted((ROOT / "rules").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out |= {r["alert"]: r["annotations"]["runbook_url"] for r in group["rules"] if "alert" in r}
    return out


OWN = {
    selfalerts.BUDGET,
    selfalerts.CRASH_LOOP,
    selfalerts.ROLLED_BACK,
    selfalerts.FAILED,
    fleetalerts.UNREACHABLE,
    fleetalerts.CORRELATED,
}


def test_the_committed_rendering_is_what_the_renderer_writes() -> None:
    committed = (ROOT / "watchdog" / "defaults" / "runbooks.html").read_text(encoding="utf-8")
    fresh = rendering((ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8"))
    assert committed == fresh, "run: python scripts/render-runbooks.py"


def test_every_alerts_runbook_url_opens_its_section_on_the_daemons_page(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    base, proc, log, alerts = alerting_watchdog(
        tmp_path, fault, cleanup, RULES, "vllm.rules.yml", "gateway.rules.yml"
    )
    probed = next(a for a in alerts["data"]["alerts"] if a["labels"]["alertname"] == "Probed")
    link = probed["annotations"]["runbook_url"]
    assert link == f"{base}/docs/runbooks.md#vllmdown"  # the default base: the watchdog itself
    page, anchor = urldefrag(link)
    resp = httpx.get(page, timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    assert resp.headers["content-security-policy"].startswith("default-src 'none'; style-src 'sha256-")
    assert "script" not in resp.headers["content-security-policy"]
    ids = set(re.findall(r'\bid="([^"]+)"', resp.text))
    assert anchor in ids
    for name, url in _bundled_links().items():
        assert url.startswith("docs/runbooks.md#"), name
        assert urldefrag(url)[1] in ids, f"{name}: {url} has no section on the served page"
    assert {name.lower() for name in OWN} <= ids, "the watchdog's own alerts need runbook sections"
    assert httpx.get(base + "/runbooks", timeout=10).text == resp.text
    assert proc.poll() is None, log.read_text()[-3000:]


def test_headings_get_githubs_anchors() -> None:
    assert slug("VLLMDown") == "vllmdown"
    assert slug("`external_url` and `runbook_base_url`") == "external_url-and-runbook_base_url"
    html = render("# A\n\n## A\n")
    assert '<h1 id="a">A</h1>' in html and '<h2 id="a-1">A</h2>' in html


def test_everything_is_escaped_and_only_safe_links_are_kept() -> None:
    doc = (
        "## <script>alert(1)</script>\n\n"
        "Text <img src=x onerror=alert(1)> and `<b>code</b>` and **bold <i>**.\n\n"
        '[bad](javascript:alert(1)) [ok](https://example.org/a?b=1&c="2") [self](runbooks.md#x) '
        "[here](#y) [doc](actions.md#z)\n\n"
        "```sh\necho '<tag>' && exit\n```\n\n"
        "| a | b |\n|---|---|\n| <u>1</u> | `2 \\| 3` |\n\n"
        "- one\n  continued <x>\n- two\n\n1. first\n2. second\n"
    )
    html = render(doc)
    assert "<script>" not in html and "<img" not in html and "<i>" not in html and "<u>" not in html
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html and "<strong>bold &lt;i&gt;</strong>" in html
    assert "javascript" not in html and "bad" in html
    assert '<a href="https://example.org/a?b=1&amp;c=&quot;2&quot;" rel="noreferrer">ok</a>' in html
    assert '<a href="#x">self</a>' in html and '<a href="#y">here</a>' in html
    assert "doc (<code>docs/actions.md#z</code>)" in html
    assert "<pre><code class=\"language-sh\">echo '&lt;tag&gt;' &amp;&amp; exit</code></pre>" in html
    assert (
        "<th>a</th><th>b</th>" in html and "<td>&lt;u&gt;1&lt;/u&gt;</td><td><code>2 | 3</code></td>" in html
    )
    assert "<ul><li>one continued &lt;x&gt;</li><li>two</li></ul>" in html
    assert "<ol><li>first</li><li>second</li></ol>" in html
