"""Redaction runs in linear time: adversarial values a target can export (runs of name characters that each
could start a name) are masked exactly as before, and complete. The outputs are asserted, not the time: a
quadratic redactor would not finish these within the suite's timeout (a 50 kB one took 37 s)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass

import pytest

from vllm_watchdog.config.model import parse_config
from vllm_watchdog.redact import (
    MASK,
    SECRET,
    Extract,
    Redactor,
    config_secrets,
    is_secret_name,
    secret,
    secret_flags,
    secret_headers,
    secret_keys,
    secret_named,
    url_password,
    whole,
)

SIZE = 200_000
RUN = "a." * (SIZE // 2)  # every `a` follows a `.`: each one could start a scheme, a flag or a field name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (RUN + "=", RUN + "="),  # a field name with no value
        (RUN + "=x", RUN + "=x"),  # a field, but not a secret-named one
        (RUN + "-token=hunter2-value", RUN + f"-token={MASK}"),  # the last word names a secret
        (RUN + "@", RUN + "@"),
        (RUN + "://user:hunter2-value@host", RUN + f"://user:{MASK}@host"),
        (RUN + "://hunter2-token@host", RUN + f"://{MASK}@host"),
        ("-a." * (SIZE // 3) + " v", "-a." * (SIZE // 3) + " v"),  # a flag of no secret name
        ("--api-key." + RUN + " hunter2-value", "--api-key." + RUN + " hunter2-value"),
        ("--api-key " + RUN, f"--api-key {MASK}"),
        ("a " * (SIZE // 2), "a " * (SIZE // 2)),
        ("a=" * (SIZE // 2), "a=" * (SIZE // 2)),
        (": " * (SIZE // 2), ": " * (SIZE // 2)),
    ],
    ids=lambda v: repr(v[-24:]),
)
def test_adversarial_values_of_200_kb_are_masked_as_before(value: str, expected: str) -> None:
    assert Redactor().text(value) == expected


def test_a_label_set_with_an_adversarial_value_is_redacted_whole() -> None:
    labels = {"__name__": "vllm:x", "model": RUN + "=", "url": RUN + "://u:hunter2-value@h"}
    out = Redactor.of(["hunter2-value"]).value(labels)
    assert out == {"__name__": "vllm:x", "model": RUN + "=", "url": RUN + f"://u:{MASK}@h"}


def test_shapes_in_ordinary_text_are_unchanged() -> None:
    red = Redactor()
    assert red.text("x.token=abc") == "x.token=abc"  # `x.token` is the name, and it is not secret-named
    assert red.text("a.--api-key=abcd efg") == f"a.--api-key={MASK} efg"  # a flag after a dot starts anew
    assert red.text("see https://u:p4ss@h/?token=zz and HF_TOKEN: q") == (
        f"see https://u:{MASK}@h/?token={MASK} and HF_TOKEN: {MASK}"
    )
    assert red.text("git+ssh://tok@h") == f"git+ssh://{MASK}@h"
    assert red.text("_http://u:p@h") == "_http://u:p@h"  # no word boundary: not a URL scheme


# --- declared secrets ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Endpoint:
    url: str = field(default="", metadata=secret(url_password))
    headers: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_headers))
    token: str = field(default="", metadata=secret())
    note: str = "not-a-secret-at-all"


@dataclass(frozen=True)
class _ByKind:
    kind: str
    url: str = field(default="", metadata=secret(url_password))

    def secret_fields(self) -> Mapping[str, Extract]:
        return {"url": whole} if self.kind == "path-secret" else {}


@dataclass(frozen=True)
class _Section:
    endpoints: tuple[_Endpoint, ...] = ()
    by_name: Mapping[str, _ByKind] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_keys))
    env: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_named))
    argv: tuple[str, ...] = field(default=(), metadata=secret(secret_flags))


def test_config_secrets_walks_the_declarations_through_nested_sections() -> None:
    section = _Section(
        endpoints=(
            _Endpoint(
                "https://u:url-password-1@h", {"Authorization": "Bearer header-token-1"}, "field-token-1"
            ),
        ),
        by_name={
            "a": _ByKind("path-secret", "https://h/services/path-secret-1"),
            "b": _ByKind("other", "https://h/services/not-secret-1"),
        },
        keys={"api-key-as-a-key-1": "batch"},
        env={"HF_TOKEN": "env-token-1", "HOME": "/root"},
        argv=("vllm", "--api-key", "flag-key-1", "--model", "m"),
    )
    assert set(config_secrets(section)) == {
        "url-password-1",
        "Bearer header-token-1",
        "header-token-1",
        "field-token-1",
        "https://h/services/path-secret-1",  # its section's own declaration, by its kind
        "api-key-as-a-key-1",
        "env-token-1",
        "flag-key-1",
    }


def _fields(value: object, path: str = "config") -> Iterator[tuple[str, str, bool]]:
    """(path, field name, declared) of every field the config holds that is not a section itself."""
    if is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "secret_fields", None)
        declared = own() if callable(own) else {}
        for f in fields(value):
            item = getattr(value, f.name)
            if item is not None and not is_dataclass(item):  # a section (basic_auth) declares its own
                yield f"{path}.{f.name}", f.name, f.name in declared or SECRET in f.metadata
            yield from _fields(item, f"{path}.{f.name}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _fields(item, f"{path}[{key}]")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _fields(item, f"{path}[{i}]")


RICH_CONFIG = """
api_token: api-token-0123
targets:
  - name: a
    url: "http://u:url-password-0123@127.0.0.1:8000"
    canary: {api_key: canary-key-0123}
    command: [vllm, serve, "--api-key=flag-key-0123"]
    env: {HF_TOKEN: env-token-0123}
    basic_auth: {username: w, password: basic-password-0123}
gpus: {dcgm_url: "http://u:dcgm-password-0123@127.0.0.1:9400/metrics"}
rule_backend:
  prometheus: {url: "http://127.0.0.1:9090", headers: {X-Api-Key: backend-key-0123}}
notifiers:
  - {type: webhook, url: "http://127.0.0.1:1/", headers: {Authorization: "Bearer header-token-0123"}}
  - {type: alertmanager, url: "https://127.0.0.1:2/", authorization: {credentials: am-token-0123}}
gateway: {priority: {api_keys: {client-key-0123: batch}}}
fleet:
  endpoints: ["http://127.0.0.1:2379"]
  basic_auth: {username: w, password: etcd-basic-0123}
"""


# URLs that are not secret in any part: the watchdog's own address, which every alert carries to its receivers.
PUBLIC = frozenset({"external_url", "runbook_base_url"})


def test_every_secret_looking_field_of_the_config_is_declared() -> None:
    """A section that adds a secret-named field, or a URL, declares it, or redaction would not know it."""
    cfg = parse_config(RICH_CONFIG, "c.yml", env={})
    undeclared = [
        path
        for path, name, declared in _fields(cfg)
        if not declared
        and name not in PUBLIC
        and not name.endswith("_file")  # a path to a secret, not the secret
        and (is_secret_name(name) or name == "url" or name.endswith("_url") or name == "endpoints")
    ]
    assert undeclared == []
    known = set(config_secrets(cfg))
    assert set(re.findall(r"[a-z][a-z-]*-0123", RICH_CONFIG)) <= known
