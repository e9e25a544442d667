"""HTTP client settings in Prometheus' `http_config` shape, for targets, notifiers and the remote backend.

The settings only: `httpkeys` parses them from the keys of an entry, `httpauth` turns them into an SSLContext
and an Authorization header at use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..redact import secret


@dataclass(frozen=True)
class TlsConfig:
    """What the client trusts and presents over https (Prometheus' `tls_config`)."""

    ca_file: str | None = None  # None: the system's trust store
    cert_file: str | None = None  # a client certificate, for servers that require one (mTLS)
    key_file: str | None = None
    server_name: str | None = None  # the name sent (SNI) and verified, instead of the URL's host
    insecure_skip_verify: bool = False
    min_version: str | None = None  # TLS10, TLS11, TLS12 or TLS13

    @property
    def custom(self) -> bool:
        """Whether anything differs from the default (system trust store, verification on)."""
        return self != TlsConfig()


@dataclass(frozen=True)
class BasicAuth:
    """HTTP basic authentication; the password inline or in a file."""

    username: str = ""
    password: str | None = field(default=None, repr=False, metadata=secret())
    password_file: str | None = None


@dataclass(frozen=True)
class Authorization:
    """An `Authorization: <type> <credentials>` header; the credentials inline or in a file."""

    type: str = "Bearer"
    credentials: str | None = field(default=None, repr=False, metadata=secret())
    credentials_file: str | None = None
    file_key: str = "credentials_file"  # the key that named the file (bearer_token_file), for messages


@dataclass(frozen=True)
class HttpClientConfig:
    """How one endpoint is reached: TLS settings and at most one kind of credentials."""

    tls: TlsConfig = field(default_factory=TlsConfig)
    basic_auth: BasicAuth | None = None
    authorization: Authorization | None = None  # `bearer_token_file` becomes one of type Bearer

    @property
    def authenticates(self) -> bool:
        """Whether requests carry credentials from these settings."""
        return self.basic_auth is not None or self.authorization is not None
