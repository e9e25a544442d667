"""The HTTP client keys of an entry, parsed into its `httpclient.HttpClientConfig`.

The keys sit inline in the entry they configure, as in a Prometheus `scrape_config`: `tls_config`,
`basic_auth`, `authorization` and the legacy `bearer_token_file`. The rules are those of prometheus/common's
`HTTPClientConfig.Validate` and `TLSConfig.Validate`: at most one of `basic_auth`, `authorization` and
`bearer_token_file`; inline and `_file` forms exclude each other; `authorization.type` defaults to `Bearer`
and may not be `Basic`; a client certificate needs its key and the reverse. Relative file paths are relative
to the file that names them. Every file is read at load (so `check` and a reload report a missing CA or an
unreadable key with file:line), and again at use when it changes (`httpauth.ClientSettings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .httpauth import TLS_VERSIONS, CredentialError, build_ssl_context, read_credential
from .httpclient import Authorization, BasicAuth, HttpClientConfig, TlsConfig
from .yamlnodes import Node

HTTP_CLIENT_KEYS = frozenset({"tls_config", "basic_auth", "authorization", "bearer_token_file"})
_TLS_KEYS = {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify", "min_version"}


def _path(node: Node) -> str | None:
    text = node.string()
    if text is None:
        return None
    path = Path(text).expanduser()
    base = Path(node.problems.file).parent
    return str(path if path.is_absolute() else base / path)


def _secret_file(node: Node, what: str) -> str | None:
    """A credential file's path, read once now so that a missing or empty one is reported at load."""
    path = _path(node)
    if path is None:
        return None
    try:
        value = read_credential(path, what)
    except CredentialError as exc:
        node.error(str(exc))
        return None
    if not value:
        node.error(f"{what} {path} is empty")
        return None
    node.problems.secrets.append(value)  # masked in every problem and log line, as inline secrets are
    return path


def _inline_secret(node: Node) -> str | None:
    value = node.string()
    if value is not None:
        node.problems.secrets.append(value)
    return value


def _exclusive(m: Mapping[str, Node], keys: tuple[str, ...], what: str) -> bool:
    present = [k for k in keys if k in m]
    if len(present) > 1:
        m[present[-1]].error(f"at most one of {what} must be configured")
        return False
    return True


def _tls(node: Node) -> TlsConfig:
    m = node.mapping(set(_TLS_KEYS))
    if m is None:
        return TlsConfig()
    files = {k: _path(m[k]) if k in m else None for k in ("ca_file", "cert_file", "key_file")}
    pair = "cert_file" in m, "key_file" in m
    if pair == (True, False):
        m["cert_file"].error("needs key_file: a client certificate is configured without its key")
    elif pair == (False, True):
        m["key_file"].error("needs cert_file: a client key is configured without its certificate")
    version = m["min_version"].string() if "min_version" in m else None
    if version is not None and version not in TLS_VERSIONS:
        m["min_version"].error(f"unknown TLS version {version!r} (known: {', '.join(TLS_VERSIONS)})")
        version = None
    skip = m["insecure_skip_verify"].boolean() if "insecure_skip_verify" in m else None
    tls = TlsConfig(
        ca_file=files["ca_file"],
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        server_name=m["server_name"].string() if "server_name" in m else None,
        insecure_skip_verify=bool(skip),
        min_version=version,
    )
    if (tls.cert_file is None) != (tls.key_file is None):
        return TlsConfig()
    if tls.cert_file is not None or tls.ca_file is not None:
        try:  # read now, so that `check` and a reload refuse a missing CA or a key that does not fit
            build_ssl_context(tls)
        except CredentialError as exc:
            m.get(exc.field, node).error(str(exc))
            return TlsConfig()
    return tls


def _basic_auth(node: Node) -> BasicAuth | None:
    m = node.mapping({"username", "password", "password_file"})
    if m is None:
        return None
    password = _inline_secret(m["password"]) if "password" in m else None  # masked even if refused below
    if not _exclusive(m, ("password", "password_file"), "basic_auth password & password_file"):
        return None
    username = m["username"].scalar() if "username" in m else None
    return BasicAuth(
        username=username or "",
        password=password,
        password_file=_secret_file(m["password_file"], "password_file") if "password_file" in m else None,
    )


def _authorization(node: Node) -> Authorization | None:
    m = node.mapping({"type", "credentials", "credentials_file"})
    if m is None:
        return None
    pair = ("credentials", "credentials_file")
    credentials = _inline_secret(m["credentials"]) if "credentials" in m else None
    if not _exclusive(m, pair, "authorization credentials & credentials_file"):
        return None
    kind = (m["type"].scalar() or "").strip() if "type" in m else ""
    if kind.lower() == "basic":
        m["type"].error('authorization type cannot be set to "basic", use "basic_auth" instead')
        return None
    if not any(k in m for k in pair):
        node.error("set credentials or credentials_file")
        return None
    return Authorization(
        type=kind or "Bearer",
        credentials=credentials,
        credentials_file=(
            _secret_file(m["credentials_file"], "credentials_file") if "credentials_file" in m else None
        ),
    )


def parse_http_client(m: Mapping[str, Node], node: Node, headers: Mapping[str, str]) -> HttpClientConfig:
    """The HTTP client keys of one entry (`m`, its mapping); `headers` are its raw headers, if it has any."""
    auth_keys = ("basic_auth", "authorization", "bearer_token_file")
    present = [k for k in auth_keys if k in m]
    if len(present) > 1:
        m[present[-1]].error(
            "at most one of basic_auth, authorization & bearer_token_file must be configured"
        )
        for key, parse in (("basic_auth", _basic_auth), ("authorization", _authorization)):
            if key in m:
                parse(m[key])  # for their own problems, and so that their secrets are masked
    elif present and any(k.lower() == "authorization" for k in headers):
        m[present[0]].error("conflicts with the Authorization header in headers: configure credentials once")
    tls = _tls(m["tls_config"]) if "tls_config" in m else TlsConfig()
    if len(present) != 1:
        return HttpClientConfig(tls=tls)
    if "basic_auth" in m:
        return HttpClientConfig(tls=tls, basic_auth=_basic_auth(m["basic_auth"]))
    if "authorization" in m:
        return HttpClientConfig(tls=tls, authorization=_authorization(m["authorization"]))
    path = _secret_file(m["bearer_token_file"], "bearer_token_file")
    legacy = Authorization(credentials_file=path, file_key="bearer_token_file") if path else None
    return HttpClientConfig(tls=tls, authorization=legacy)
