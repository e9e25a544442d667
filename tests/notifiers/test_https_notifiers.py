"""Notifiers over https with their own CA, client certificate and credentials, against a real TLS receiver on
loopback that checks them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.faultserver import FaultServer
from tests.support.tlsfiles import Pki
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.notifiers.hub import HubOptions, NotificationHub

pytestmark = pytest.mark.anyio
T = 1_700_000_000.0
ALERT = OutgoingAlert({"alertname": "VLLMDown", "severity": "critical"}, {}, "firing", T, T + 60, 1.0)


@pytest.fixture
def receiver(pki: Pki) -> Iterator[FaultServer]:
    """A webhook receiver over TLS that wants our client certificate."""
    server = FaultServer(tls=pki.server_context(require_client_cert=True))
    yield server
    server.close()


def notifiers(tmp_path: Path, *entries: dict[str, Any]) -> Any:
    path = tmp_path / "watchdog.yml"
    path.write_text("notifiers:\n" + "".join(f"  - {json.dumps(e)}\n" for e in entries))
    return parse_config(path.read_text(), str(path), env={}).notifiers


async def deliver(tmp_path: Path, *entries: dict[str, Any]) -> dict[str, Any]:
    shared = httpx.AsyncClient(trust_env=False)  # the system's trust store: it knows nothing of the test CA
    hub = NotificationHub(notifiers(tmp_path, *entries), HubOptions(shared))
    try:
        hub.alerts([ALERT], T)
        await hub.deliver(T)
        return {name: (s.sent, s.failed, s.last_error) for name, s in hub.stats().items()}
    finally:
        await hub.aclose()
        await shared.aclose()


async def test_a_webhook_over_https_with_mtls_and_basic_auth_is_delivered(
    tmp_path: Path, pki: Pki, receiver: FaultServer
) -> None:
    receiver.set("/hook", b"", authorization="Basic b25jYWxsOmhvb2stcGFzc3dvcmQ=")  # oncall:hook-password
    (tmp_path / "password").write_text("hook-password\n")
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    good = {"type": "webhook", "name": "good", "url": receiver.url + "/hook", "tls_config": tls}
    good["basic_auth"] = {"username": "oncall", "password_file": "password"}
    wrong = {**good, "name": "wrong", "basic_auth": {"username": "oncall", "password": "not-the-password"}}
    no_ca = {
        **good,
        "name": "no-ca",
        "tls_config": {"cert_file": tls["cert_file"], "key_file": tls["key_file"]},
    }
    stats = await deliver(tmp_path, good, wrong, no_ca)
    assert stats["good"] == (1, 0, "")
    assert stats["wrong"][:2] == (0, 1) and stats["wrong"][2].startswith("HTTP 401")  # refused for good
    sent, failed, error = stats["no-ca"]
    assert (sent, failed) == (0, 0) and "CERTIFICATE_VERIFY_FAILED" in error  # retried later
    posts = [(p, a) for (m, p, _), (_, a) in zip(receiver.requests, receiver.authorizations, strict=True)]
    assert sorted(posts) == [
        ("/hook", "Basic b25jYWxsOm5vdC10aGUtcGFzc3dvcmQ="),
        ("/hook", "Basic b25jYWxsOmhvb2stcGFzc3dvcmQ="),
    ]
    assert receiver.client_certs == ["client", "client"]


async def test_an_alertmanager_with_a_bearer_token_file_that_is_gone_is_retried(
    tmp_path: Path, pki: Pki, receiver: FaultServer
) -> None:
    receiver.set("/api/v2/alerts", b"", authorization="Bearer am-token-1234")
    (tmp_path / "token").write_text("am-token-1234")
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    am = {
        "type": "alertmanager",
        "name": "am",
        "url": receiver.url,
        "tls_config": tls,
        "bearer_token_file": "token",
    }
    entries = notifiers(tmp_path, am)
    (tmp_path / "token").unlink()
    shared = httpx.AsyncClient(trust_env=False)
    hub = NotificationHub(entries, HubOptions(shared))
    try:
        hub.alerts([ALERT], T)
        await hub.deliver(T)
        stats = hub.stats()["am"]
        assert (stats.sent, stats.failed, stats.queued) == (0, 0, 1)
        assert (
            stats.last_error
            == f"bearer_token_file {tmp_path}/token cannot be read: No such file or directory"
        )
        (tmp_path / "token").write_text("am-token-1234\n")
        await hub.deliver(T + 3600)
        assert (hub.stats()["am"].sent, hub.stats()["am"].queued) == (1, 0)
    finally:
        await hub.aclose()
        await shared.aclose()
    assert receiver.authorizations == [("/api/v2/alerts", "Bearer am-token-1234")]
