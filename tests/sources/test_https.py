"""Targets over https and with credentials: a real TLS server on loopback, a CA made for the test (tests/support/
tlsfiles.py), and the monitor's scrapes, health probes and canaries as the daemon runs them."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.faultserver import FaultServer
from tests.support.tlsfiles import Pki
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck
from vllm_watchdog.config.httpauth import ClientSettings
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.sources.httpget import HttpGet
from vllm_watchdog.sources.monitor import Monitor, MonitorOptions, client_for

pytestmark = pytest.mark.anyio
METRICS = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n"
T = 1_700_000_000.0


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[Callable[..., FaultServer]]:
    """Starts vLLM-like servers over TLS (server_context's arguments); stops them after the test."""
    servers: list[FaultServer] = []

    def start(**kw: Any) -> FaultServer:
        server = FaultServer(tls=pki.server_context(**kw))
        server.vllm_like(METRICS)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def config_of(tmp_path: Path, url: str, **keys: Any) -> Config:
    """A config with one target at `url` and these client keys, written as a file (relative paths work)."""
    target = {"name": "t", "url": url, "canary": keys.pop("canary", False), **keys}
    path = tmp_path / "watchdog.yml"
    path.write_text(f"global: {{scrape_interval: 10s}}\ntargets:\n  - {json.dumps(target)}\n")
    return parse_config(path.read_text(), str(path))


@pytest.fixture
async def monitors() -> AsyncIterator[Callable[[Config], Monitor]]:
    made: list[Monitor] = []

    def make(config: Config) -> Monitor:
        made.append(Monitor(config, MonitorOptions(client_factory=client_for, keep_all=True)))
        return made[-1]

    yield make
    for mon in made:
        await mon.aclose()


async def scrape(mon: Monitor, times: int = 1) -> Any:
    for i in range(times):
        await mon.scrape("t", T + i)
    return mon.targets["t"].scrape.status


async def test_a_target_over_https_with_its_ca_is_scraped_on_one_kept_connection(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server()
    mon = monitors(config_of(tmp_path, server.url, tls_config={"ca_file": str(pki.ca)}))
    status = await scrape(mon, 3)
    assert status.up, status.last_error
    assert status.samples == 1
    assert len(server.peers) == 3 and len(set(server.peers)) == 1  # keep-alive: one handshake, three GETs
    assert (await mon.targets["t"].health.probe(T)).ok


async def test_a_target_signed_by_another_ca_fails_with_a_clear_error(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server()
    mon = monitors(config_of(tmp_path, server.url, tls_config={"ca_file": str(pki.other_ca)}))
    status = await scrape(mon)
    assert not status.up
    assert status.last_error.startswith("ConnectError: TLS certificate verification failed: ")
    assert "issuer certificate" in status.last_error
    health = await mon.targets["t"].health.probe(T)
    assert not health.ok and "certificate verification failed" in (health.last_error or "")
    assert server.requests == []


async def test_without_settings_the_system_trust_store_refuses_the_test_ca(
    tls_server: Callable[..., FaultServer],
) -> None:
    server = tls_server()
    http = HttpGet(server.url + "/metrics", {}, 1 << 20)
    with pytest.raises(Exception, match="certificate verification failed"):
        await http.get()


async def test_mtls_a_server_that_requires_a_client_certificate(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server(require_client_cert=True)
    without = monitors(config_of(tmp_path, server.url, tls_config={"ca_file": str(pki.ca)}))
    status = await scrape(without)
    assert not status.up
    # The server refuses after the TLS 1.3 handshake: its alert, or the close, reaches the client first.
    assert status.last_error in (
        "RemoteProtocolError: TLS: tlsv13 alert certificate required",
        "RemoteProtocolError: server disconnected without sending a response",
    )
    tls = {"ca_file": "pki/test-ca.pem", "cert_file": "pki/client.pem", "key_file": "pki/client.key"}
    (tmp_path / "pki").symlink_to(pki.dir)  # relative paths are relative to the config file
    with_cert = monitors(config_of(tmp_path, server.url, tls_config=tls))
    status = await scrape(with_cert, 2)
    assert status.up, status.last_error
    assert server.client_certs == ["client", "client"]


async def test_server_name_is_sent_and_verified_instead_of_the_urls_host(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server(named=True)  # a certificate for vllm.internal, served on 127.0.0.1
    plain = monitors(config_of(tmp_path, server.url, tls_config={"ca_file": str(pki.ca)}))
    assert "certificate verification failed" in (await scrape(plain)).last_error
    tls = {"ca_file": str(pki.ca), "server_name": "vllm.internal"}
    named = monitors(config_of(tmp_path, server.url, tls_config=tls, canary=True))
    assert (await scrape(named)).up
    await named.probe_canary("t", T)  # the canary's httpx client uses the same context
    assert named.targets["t"].canary is not None and named.targets["t"].canary.status.ok


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_basic_auth_from_a_file_is_checked_by_the_server_and_read_again_when_it_changes(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server()
    (tmp_path / "password").write_text("first-password\n")
    auth = {"username": "scraper", "password_file": "password"}
    mon = monitors(config_of(tmp_path, server.url, tls_config={"ca_file": str(pki.ca)}, basic_auth=auth))
    server.set("/metrics", METRICS, authorization=basic("scraper", "first-password"))
    assert (await scrape(mon)).up
    (tmp_path / "password").write_text("second-password-longer\n")  # rotated: no reload
    status = await scrape(mon)
    assert not status.up and "HTTP status 401" in status.last_error
    server.set("/metrics", METRICS, authorization=basic("scraper", "second-password-longer"))
    assert (await scrape(mon)).up
    assert len(set(server.peers)) == 1  # new credentials, same connection
    (tmp_path / "password").unlink()
    status = await scrape(mon)
    assert not status.up
    assert (
        status.last_error
        == f"no credentials: password_file {tmp_path}/password cannot be read: No such file or directory"
    )


async def test_bearer_tokens_inline_and_from_the_legacy_file_reach_every_probe(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server()
    for path in ("/metrics", "/health", "/v1/models", "/v1/completions"):
        server.replies[path].authorization = "Bearer inline-token-1234"
    tls = {"ca_file": str(pki.ca)}
    auth = {"credentials": "inline-token-1234"}
    mon = monitors(config_of(tmp_path, server.url, tls_config=tls, authorization=auth, canary=True))
    assert (await scrape(mon)).up
    assert (await mon.targets["t"].health.probe(T)).ok
    await mon.probe_canary("t", T)
    assert mon.targets["t"].canary is not None and mon.targets["t"].canary.status.ok
    assert {p for p, a in server.authorizations if a == "Bearer inline-token-1234"} == {
        "/metrics",
        "/health",
        "/v1/models",
        "/v1/completions",
    }
    (tmp_path / "token").write_text("file-token-5678")
    server.set("/metrics", METRICS, authorization="Bearer file-token-5678")
    legacy = monitors(config_of(tmp_path, server.url, tls_config=tls, bearer_token_file="token"))
    assert (await scrape(legacy)).up


async def test_credentials_go_over_plain_http_too_and_tls_settings_alone_cost_it_nothing(
    tmp_path: Path, pki: Pki, fault: FaultServer, monitors: Callable[[Config], Monitor]
) -> None:
    fault.set("/metrics", METRICS, authorization="Token abc-123-xyz")
    auth = {"type": "Token", "credentials": "abc-123-xyz"}
    assert (await scrape(monitors(config_of(tmp_path, fault.url, authorization=auth)))).up
    cfg = config_of(tmp_path, fault.url, tls_config={"ca_file": str(pki.ca)})
    http = HttpGet(fault.url + "/metrics", {}, 1 << 20, settings=ClientSettings(cfg.targets[0].http))
    assert http._settings is None  # no header to compute and no TLS to set up: the plain path, unchanged


async def test_a_rotated_ca_file_is_read_again_for_new_connections_without_a_reload(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer], monitors: Callable[[Config], Monitor]
) -> None:
    server = tls_server()
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.other_ca.read_bytes())  # the wrong CA first
    mon = monitors(config_of(tmp_path, server.url, tls_config={"ca_file": "ca.pem"}, canary=True))
    await mon.probe_canary("t", T)
    rt = mon.targets["t"]
    assert rt.canary is not None and not rt.canary.status.ok
    assert "certificate verification failed" in (await scrape(mon)).last_error
    ca.write_bytes(pki.ca.read_bytes())  # rotated in place
    assert (await scrape(mon)).up
    await mon.probe_canary("t", T + 5)
    assert rt.canary.status.ok  # the canary's httpx client was rebuilt with the new context


async def test_the_readiness_check_after_a_restart_uses_the_targets_tls_and_credentials(
    tmp_path: Path, pki: Pki, tls_server: Callable[..., FaultServer]
) -> None:
    server = tls_server()
    for path in ("/health", "/v1/models", "/v1/completions"):
        server.replies[path].authorization = basic("ops", "ready-password")
    auth = {"username": "ops", "password": "ready-password"}
    cfg = config_of(tmp_path, server.url, tls_config={"ca_file": str(pki.ca)}, basic_auth=auth)
    shared = client_for()  # the system's trust store and no credentials: of no use for this target
    try:
        assert await ReadyCheck(shared, poll=0.01).wait(cfg.targets[0], 10.0) == (True, "")
    finally:
        await shared.aclose()
    # /ready first (vLLM's readiness endpoint where it has one; 404 here), with the same TLS and credentials
    assert {p for p, a in server.authorizations} == {"/ready", "/health", "/v1/models", "/v1/completions"}
    assert {a for p, a in server.authorizations} == {basic("ops", "ready-password")}
