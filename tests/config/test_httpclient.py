"""The http_config keys of targets, notifiers and the remote backend: Prometheus' validation rules, files read at
load with file:line errors, and secrets that never show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.tlsfiles import Pki
from vllm_watchdog.config.httpauth import ClientSettings
from vllm_watchdog.config.httpclient import Authorization, BasicAuth, HttpClientConfig, TlsConfig
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.redact import Redactor, config_secrets


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "watchdog.yml"
    path.write_text(text)
    return parse_config(text, str(path), env={} if env is None else env)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return [str(p).removeprefix(f"{tmp_path}/watchdog.yml:") for p in info.value.problems]


def target(**keys: Any) -> str:
    return "targets:\n  - " + json.dumps({"name": "t", "url": "https://127.0.0.1:8000", **keys}) + "\n"


def test_every_key_parses_into_frozen_settings_with_paths_relative_to_the_file(
    tmp_path: Path, pki: Pki
) -> None:
    (tmp_path / "token").write_text("  file-token-abcdef \n")
    (tmp_path / "pki").symlink_to(pki.dir)
    tls = {"ca_file": "pki/test-ca.pem", "cert_file": "pki/client.pem", "key_file": "pki/client.key"}
    tls |= {"server_name": "vllm.internal", "min_version": "TLS13", "insecure_skip_verify": False}
    cfg = load(tmp_path, target(tls_config=tls, bearer_token_file="token"))
    http = cfg.targets[0].http
    assert http.tls == TlsConfig(
        ca_file=f"{tmp_path}/pki/test-ca.pem",
        cert_file=f"{tmp_path}/pki/client.pem",
        key_file=f"{tmp_path}/pki/client.key",
        server_name="vllm.internal",
        min_version="TLS13",
    )
    assert http.authorization == Authorization(
        credentials_file=f"{tmp_path}/token", file_key="bearer_token_file"
    )  # legacy: a Bearer
    assert ClientSettings(http).authorization() == "Bearer file-token-abcdef"  # trimmed, as Prometheus
    assert load(tmp_path, target()).targets[0].http == HttpClientConfig()


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (
            {"basic_auth": {"username": "u", "password": "p4ssword-inline", "password_file": "pw"}},
            "4: targets[0].basic_auth.password_file: at most one of basic_auth password & password_file must be "
            "configured",
        ),
        (
            {
                "basic_auth": {"username": "u", "password": "p4ssword-inline"},
                "authorization": {"credentials": "x"},
            },
            "4: targets[0].authorization: at most one of basic_auth, authorization & bearer_token_file must be "
            "configured",
        ),
        (
            {"authorization": {"credentials": "secret-credentials", "credentials_file": "token"}},
            "4: targets[0].authorization.credentials_file: at most one of authorization credentials & "
            "credentials_file must be configured",
        ),
        (
            {"authorization": {"type": "Basic", "credentials": "secret-credentials"}},
            '4: targets[0].authorization.type: authorization type cannot be set to "basic", use "basic_auth" '
            "instead",
        ),
        (
            {"authorization": {"type": "Bearer"}},
            "4: targets[0].authorization: set credentials or credentials_file",
        ),
        (
            {"bearer_token_file": "missing-token"},
            "4: targets[0].bearer_token_file: bearer_token_file {dir}/missing-token cannot be read: No such file or "
            "directory",
        ),
        (
            {"bearer_token_file": "empty"},
            "4: targets[0].bearer_token_file: bearer_token_file {dir}/empty is empty",
        ),
        (
            {"tls_config": {"ca_file": "missing-ca.pem"}},
            "4: targets[0].tls_config.ca_file: ca_file {dir}/missing-ca.pem cannot be used: No such file or directory",
        ),
        (
            {"tls_config": {"ca_file": "token"}},
            "4: targets[0].tls_config.ca_file: ca_file {dir}/token cannot be used: no start line: cadata does not contain a certificate",
        ),
        (
            {"tls_config": {"cert_file": "{pki}/client.pem"}},
            "4: targets[0].tls_config.cert_file: needs key_file: a client certificate is configured without its key",
        ),
        (
            {"tls_config": {"key_file": "{pki}/client.key"}},
            "4: targets[0].tls_config.key_file: needs cert_file: a client key is configured without its "
            "certificate",
        ),
        (
            {"tls_config": {"cert_file": "{pki}/client.pem", "key_file": "{pki}/server.key"}},
            "4: targets[0].tls_config.key_file: cert_file {pki}/client.pem and key_file {pki}/server.key do not "
            "go together: key values mismatch",
        ),
        (
            {"tls_config": {"cert_file": "{pki}/client.pem", "key_file": "{pki}/test-ca.pem"}},
            "4: targets[0].tls_config.key_file: cert_file {pki}/client.pem and key_file {pki}/test-ca.pem do not "
            "go together: not a PEM certificate or private key",
        ),
        (
            {"tls_config": {"cert_file": "{pki}/client.pem", "key_file": "{pki}/client-encrypted.key"}},
            "4: targets[0].tls_config.key_file: key_file {pki}/client-encrypted.key is encrypted; give the watchdog "
            "an unencrypted key",
        ),
        (
            {"tls_config": {"min_version": "TLS9"}},
            "4: targets[0].tls_config.min_version: unknown TLS version 'TLS9' (known: TLS10, TLS11, TLS12, TLS13)",
        ),
    ],
)
def test_invalid_settings_are_reported_with_file_line_and_field(
    tmp_path: Path, pki: Pki, keys: dict[str, Any], expected: str
) -> None:
    (tmp_path / "empty").write_text("")
    (tmp_path / "token").write_text("t0ken-from-file")
    (tmp_path / "pw").write_text("p4ssword-from-file")
    text = "\n\n" + target(**json.loads(json.dumps(keys).replace("{pki}", str(pki.dir))))
    got = problems(tmp_path, text)
    assert got == [expected.format(dir=tmp_path, pki=pki.dir)]
    assert not any(s in "".join(got) for s in ("p4ssword", "secret-credentials", "t0ken-from-file"))


def test_notifiers_and_the_backend_take_the_same_keys_and_refuse_a_second_authorization(
    tmp_path: Path,
) -> None:
    notifier = {
        "type": "webhook",
        "url": "https://h/hook",
        "headers": {"Authorization": "Bearer abc-def-ghi"},
    }
    text = (
        "notifiers:\n  - " + json.dumps({**notifier, "authorization": {"credentials": "abc-def-ghi"}}) + "\n"
        "rule_backend:\n  prometheus: "
        + json.dumps({"url": "https://p", "verify_tls": False, "tls_config": {"insecure_skip_verify": True}})
        + "\n"
    )
    assert problems(tmp_path, text) == [
        "2: notifiers[0].authorization: conflicts with the Authorization header in headers: configure "
        "credentials once",
        "4: rule_backend.prometheus.verify_tls: set tls_config.insecure_skip_verify instead, next to the other TLS "
        "settings",
    ]
    cfg = load(tmp_path, "rule_backend:\n  prometheus: {url: 'https://p', verify_tls: false}\n")
    assert cfg.rule_backend is not None and cfg.rule_backend.http.tls == TlsConfig(insecure_skip_verify=True)
    basic = {"username": "am", "password": "alertmanager-password"}
    cfg = load(
        tmp_path,
        "notifiers:\n  - " + json.dumps({"type": "alertmanager", "url": "https://am", "basic_auth": basic}),
    )
    assert cfg.notifiers[0].http.basic_auth == BasicAuth("am", "alertmanager-password")


def test_secrets_inline_in_files_and_from_the_environment_are_masked_and_never_in_a_repr(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("token-held-in-a-file\n")
    (tmp_path / "pw").write_text("password-held-in-a-file\n")
    text = (
        target(basic_auth={"username": "scraper", "password": "${SCRAPE_PASSWORD}"})
        + "notifiers:\n  - "
        + json.dumps({"type": "webhook", "url": "https://h", "authorization": {"credentials_file": "token"}})
        + "\nrule_backend:\n  prometheus: "
        + json.dumps(
            {"url": "https://p", "authorization": {"type": "Token", "credentials": "inline-credentials"}}
        )
        + "\n"
    )
    cfg = load(tmp_path, text, env={"SCRAPE_PASSWORD": "password-from-the-env"})
    secrets = set(config_secrets(cfg))
    assert {"password-from-the-env", "token-held-in-a-file", "inline-credentials"} <= secrets
    shown = repr(cfg)
    assert not any(s in shown for s in secrets)
    line = "scrape failed: password-from-the-env token-held-in-a-file inline-credentials"
    assert Redactor.of(secrets).text(line) == "scrape failed: <redacted> <redacted> <redacted>"
    pw = load(tmp_path, target(basic_auth={"username": "u", "password_file": "pw"}))
    assert "password-held-in-a-file" in config_secrets(pw)
