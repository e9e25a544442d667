"""The remote rule backend over https: its CA, client certificate, server name and credentials, against a real
TLS server on loopback that checks them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.faultserver import FaultServer
from tests.support.tlsfiles import Pki
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.promql.remote import PrometheusBackend, backend_for
from vllm_watchdog.promql.values import QueryError, Sample

T = 1_700_000_000.5
ANSWER = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {}, "value": [T, "1"]}]},
}


@pytest.fixture
def prometheus(pki: Pki) -> Iterator[FaultServer]:
    """A Prometheus stand-in over TLS, for the name vllm.internal only, that wants our client certificate."""
    server = FaultServer(tls=pki.server_context(named=True, require_client_cert=True))
    server.set("/api/v1/query", ANSWER, authorization="Bearer backend-token-42")
    yield server
    server.close()


def backend(tmp_path: Path, **keys: Any) -> PrometheusBackend:
    path = tmp_path / "watchdog.yml"
    path.write_text("rule_backend:\n  prometheus: " + json.dumps({"timeout": "5s", **keys}) + "\n")
    cfg = parse_config(path.read_text(), str(path), env={})
    assert cfg.rule_backend is not None
    return backend_for(cfg.rule_backend)


def test_queries_go_over_mtls_with_a_server_name_and_a_token_read_from_its_file(
    tmp_path: Path, pki: Pki, prometheus: FaultServer
) -> None:
    (tmp_path / "token").write_text("backend-token-42\n")
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    tls["server_name"] = "vllm.internal"
    remote = backend(
        tmp_path, url=prometheus.url, tls_config=tls, authorization={"credentials_file": "token"}
    )
    try:
        assert remote.query("up", T) == [Sample((), 1.0, 1_700_000_000_500)]
        assert remote.query("up", T) == [Sample((), 1.0, 1_700_000_000_500)]
        (tmp_path / "token").write_text("rotated-token-43\n")
        with pytest.raises(QueryError, match="HTTP 401"):
            remote.query("up", T)
        (tmp_path / "token").unlink()
        with pytest.raises(QueryError, match=r"credentials_file .*/token cannot be read: No such file"):
            remote.query("up", T)
    finally:
        remote.close()
    assert len(set(prometheus.peers)) == 1  # one kept-alive connection
    assert prometheus.client_certs == ["client"] * 3
    assert [a for _, a in prometheus.authorizations] == ["Bearer backend-token-42"] * 2 + [
        "Bearer rotated-token-43"
    ]


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")  # urllib3's, for insecure_skip_verify
def test_a_wrong_ca_or_no_server_name_fail_with_the_backend_named_and_insecure_skips_both(
    tmp_path: Path, pki: Pki, prometheus: FaultServer
) -> None:
    client = {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    auth = {"credentials": "backend-token-42"}
    for tls in (
        {**client, "ca_file": str(pki.other_ca), "server_name": "vllm.internal"},
        {**client, "ca_file": str(pki.ca)},
    ):
        remote = backend(tmp_path, url=prometheus.url, tls_config=tls, authorization=auth)
        try:
            with pytest.raises(
                QueryError, match=rf"^{prometheus.url}: cannot query: .*certificate verify failed"
            ):
                remote.query("up", T)
        finally:
            remote.close()
    assert prometheus.requests == []
    insecure = {**client, "insecure_skip_verify": True}  # unknown CA and another name: not even looked at
    remote = backend(tmp_path, url=prometheus.url, tls_config=insecure, authorization=auth)
    try:
        assert remote.query("up", T) == [Sample((), 1.0, 1_700_000_000_500)]
    finally:
        remote.close()
