"""A notifier kind is one module: a test-only kind, registered here, is parsed, delivered and redacted with
no other change. Its URL is a secret in its path (as a Slack webhook's is), which no shape rule would find:
only its declaration masks it, in the log, in `check`'s output and in the API's answers."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from vllm_watchdog import logs
from vllm_watchdog.api.app import ApiOptions, build_app
from vllm_watchdog.cli import main
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.config.yamlnodes import Node
from vllm_watchdog.exitcodes import EXIT_CONFIG
from vllm_watchdog.notifiers import registry
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.notifiers.config import KINDS, NotifierKind
from vllm_watchdog.notifiers.hub import HubOptions, NotificationHub
from vllm_watchdog.notifiers.notifier import Receiver
from vllm_watchdog.redact import MASK, config_secrets, secret, secret_headers, whole

SECRET_PATH = "T0001/B0002/xoxb-path-is-the-secret"
URL = f"https://hooks.pager.test/services/{SECRET_PATH}"
ROUTING_KEY = "routing-key-0123456789"  # an own key of the kind, declared secret by its options
T = 1_700_000_000.0


@dataclass(frozen=True)
class PagerOptions:
    """The pager kind's own keys."""

    routing_key: str = field(default="", metadata=secret())


def _pager_options(m: Mapping[str, Node]) -> PagerOptions:
    return PagerOptions(routing_key=(m["routing_key"].string() or "") if "routing_key" in m else "")


class Pager:
    """The sender: one POST per batch, the alert names and the routing key."""

    type = "pager"
    takes_events = False

    def identity(self, alert: OutgoingAlert) -> str | None:
        return None

    def url(self, receiver: Receiver) -> str:
        return receiver.url

    def headers(self, receiver: Receiver) -> Mapping[str, str]:
        return receiver.headers

    def alerts_body(self, alerts: Sequence[OutgoingAlert], receiver: Receiver) -> Any:
        key = receiver.options.routing_key
        return {"routing_key": key, "pages": [a.labels["alertname"] for a in alerts]}

    def event_body(self, event: Mapping[str, Any], receiver: Receiver) -> Any:
        raise ValueError("pagers take no action events")


PAGER_KIND = NotifierKind(
    "pager",
    keys=frozenset({"routing_key"}),
    secret_fields={"url": whole, "headers": secret_headers},  # the whole URL is the secret
    options=_pager_options,
)


@pytest.fixture
def pager(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The pager kind registered: its config side and its sender."""
    monkeypatch.setitem(KINDS, "pager", PAGER_KIND)
    registry.register(Pager())
    try:
        yield
    finally:
        registry.unregister("pager")


def _config(tmp_path: Path, url: str = URL) -> Path:
    path = tmp_path / "watchdog.yml"
    entry = {"type": "pager", "name": "oncall", "url": url, "routing_key": ROUTING_KEY}
    path.write_text(f"notifiers: [{json.dumps(entry)}]\n")
    return path


def _load(tmp_path: Path) -> Config:
    path = _config(tmp_path)
    return parse_config(path.read_text(), str(path), env={})


@pytest.mark.anyio
@pytest.mark.usefixtures("pager")
async def test_a_registered_kind_is_parsed_and_delivered(tmp_path: Path) -> None:
    cfg = _load(tmp_path)
    (notifier,) = cfg.notifiers
    assert (notifier.type, notifier.url, notifier.options) == ("pager", URL, PagerOptions(ROUTING_KEY))
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        hub = NotificationHub(cfg.notifiers, HubOptions(client, clock=lambda: T))
        hub.alerts([OutgoingAlert({"alertname": "Down"}, {}, "firing", T, T + 60, 1.0)], T)
        await hub.deliver(T)
        assert hub.stats()["oncall"].sent == 1
        await hub.aclose()
    (request,) = seen
    assert str(request.url) == URL
    assert json.loads(request.content) == {"routing_key": ROUTING_KEY, "pages": ["Down"]}


@pytest.mark.usefixtures("pager")
def test_its_declared_secrets_are_known_to_redaction(tmp_path: Path) -> None:
    assert {URL, ROUTING_KEY} <= set(config_secrets(_load(tmp_path)))


@pytest.mark.usefixtures("pager")
def test_its_declared_secrets_are_masked_in_the_log(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    stream = io.StringIO()
    try:
        logs.setup("info", stream=stream, fmt="json")
        logs.use_secrets(config_secrets(_load(tmp_path)))
        log = logging.getLogger("vllm_watchdog.test.pager")
        log.warning("notifier unreachable", extra={"error": f"POST {URL} failed", "key": ROUTING_KEY})
    finally:
        logs.use_secrets([])
        root.handlers[:] = saved
    text = stream.getvalue()
    assert SECRET_PATH not in text and ROUTING_KEY not in text
    assert MASK in text


@pytest.mark.usefixtures("pager")
def test_its_declared_secret_is_masked_in_check_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, url=URL.replace("https://", "ftp://"))  # refused: the problem quotes the URL
    assert main(["check", str(path)]) == EXIT_CONFIG
    out = capsys.readouterr()
    assert "must be an http(s) URL" in out.err + out.out
    assert SECRET_PATH not in out.err + out.out


@pytest.mark.anyio
@pytest.mark.usefixtures("pager")
async def test_its_declared_secrets_are_masked_in_api_answers(tmp_path: Path) -> None:
    registry_ = CollectorRegistry()
    gauge = Gauge(
        "test_notifier_info", "A label that happens to hold the URL.", ["url", "key"], registry=registry_
    )
    gauge.labels(URL, ROUTING_KEY).set(1)
    unused: Any = None
    app = build_app(
        ApiOptions(
            monitor=SimpleNamespace(config=_load(tmp_path)),
            evaluation=unused,
            remediator=unused,
            registry=registry_,
            reload=unused,
            healthy=unused,
            gateway=unused,
        )
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as client:
        body = (await client.get("/metrics")).text
    assert "test_notifier_info" in body
    assert SECRET_PATH not in body and ROUTING_KEY not in body


def test_every_kind_has_its_config_side_and_its_sender() -> None:
    assert set(KINDS) == set(registry.known()) == {"alertmanager", "webhook"}
