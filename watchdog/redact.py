"""Secret redaction for what the watchdog shows: its log lines and its own API's answers.

Two kinds of secret are masked. Known values: the ones the config holds (`api_token`, canary API keys,
secret notifier and rule-backend headers, URL passwords, secret-named `env` values and command-line flags,
gateway API keys), registered with `config_secrets`. And shapes that are secret whatever their value: the
value of a secret-named flag (`--api-key VALUE`, `--hf-token=VALUE`), variable or field (`HF_TOKEN=...`,
`"password": ...`), the password in a URL (`https://user:PASSWORD@host`) and a `Bearer`/`Basic` credential.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from .config.httpclient import HttpClientConfig
    from .config.model import Config

MASK = "<redacted>"
# Known values shorter than this are not masked by value (a 3-letter token would mask every "tok" in the
# output); their shapes still are.
MIN_SECRET_LENGTH = 8
# A name is secret when one of its dash/underscore-separated words is one of these (`--api-key`, `HF_TOKEN`,
# `x-api-key`, `proxy-authorization`), and not for near misses (`--tokenizer`, `max_tokens`, `spec_key`).
_SECRET_NAME = re.compile(
    r"(?:^|-)(?:token|secret|password|passwd|pwd|credentials?|api-?key|access-?key|private-?key|auth"
    r"|authorization|cookie|set-cookie)(?:$|-)"
)
_MAY_HAVE_SHAPE = re.compile(r"[\s=:@]")  # every shape below needs one of these
_CREDENTIAL = re.compile(r"\b(Bearer|Basic)(\s+)([A-Za-z0-9._~+/-]{8,}=*)")  # as HTTP spells them
_VALUE = re.compile(r"""[^\s&"',;}]+""")
# A value follows (and is not a flag); it is read whole only when it is masked, so that each is read once.
_VALUE_AHEAD = r"""(?=[^\s&"',;}-])"""
# Both shapes below start with a name (a URL scheme; a flag or field name) that must run to the end of a run
# of name characters, because what follows it (`://`; a separator) cannot begin with one. So every start
# inside one run meets the same end: each run is found once and its end examined once, and then only its
# first valid start is looked for. A single regex tries every start again up to the run's end, which is
# quadratic: a 50 kB `a.a.a…=` label value took 37 s.
_SCHEME_RUN = re.compile(r"(?<![a-zA-Z0-9+.-])[a-zA-Z0-9+.-]++(?=://)")
_SCHEME_START = re.compile(r"\b[a-zA-Z]")
_USERINFO = re.compile(r"://([^/?#@\s:\"']*)(?::([^/?#@\s\"']*))?@")
# `--name value` and `--name=value` (flags), `name=value` and `name: value` (assignments): the name decides.
# Only the name and separator are consumed (the value is looked ahead), so a name inside another's value, such
# as `token=` in `http://u:x@h/?token=...`, is still found.
_NAME_RUN = re.compile(r"(?<![\w.-])[\w.-]++")
_FLAG_START = re.compile(r"(?<![\w-])--?[A-Za-z]")
_FIELD_START = re.compile(r"(?<![\w-])[A-Za-z_]")
_EITHER_START = re.compile(r"(?<![\w-])(?:--?[A-Za-z]|[A-Za-z_])")
_FLAG_SEPARATOR = re.compile(rf"(?:\s+|=){_VALUE_AHEAD}")
_FIELD_SEPARATOR = re.compile(rf"""["']?\s*(?:=|:(?!//))\s*["']?{_VALUE_AHEAD}""")


@functools.lru_cache(maxsize=4096)  # field and flag names repeat in every row
def is_secret_name(name: str) -> bool:
    """Whether a flag, variable, header or field of this name holds a secret."""
    return _SECRET_NAME.search(name.lower().lstrip("-").replace("_", "-")) is not None


def _mask_urls(text: str) -> str:
    """`scheme://user:PASSWORD@` and `scheme://TOKEN@` masked, in linear time."""
    out, done, pos = [], 0, 0
    while (run := _SCHEME_RUN.search(text, pos)) is not None:
        colon = run.end()
        start = _SCHEME_START.search(text, run.start(), colon)
        tail = _USERINFO.match(text, colon) if start is not None else None
        pos = colon if tail is None else tail.end()
        if start is None or tail is None:
            continue
        scheme, user, password = text[start.start() : colon] + "://", tail.group(1), tail.group(2)
        if password is not None:
            masked = f"{scheme}{user}:{MASK}@"
        elif user:  # a lone user part is often a token (https://TOKEN@host)
            masked = f"{scheme}{MASK}@"
        else:
            continue
        out += [text[done : start.start()], masked]
        done = tail.end()
    return "".join(out) + text[done:] if out else text


def _assignments(text: str) -> Iterator[tuple[int, str, int]]:
    """(start, name, end of the separator) of each flag and assignment, left to right; a value follows."""
    pos = 0
    while (run := _NAME_RUN.search(text, pos)) is not None:
        end = run.end()
        flag, field = _FLAG_SEPARATOR.match(text, end), _FIELD_SEPARATOR.match(text, end)
        starts = _EITHER_START if flag and field else _FLAG_START if flag else _FIELD_START if field else None
        start = None if starts is None else starts.search(text, run.start(), end)
        separator = None if start is None else flag if text[start.start()] == "-" else field
        if start is None or separator is None:
            pos = end
            continue
        yield start.start(), text[start.start() : end], separator.end()
        pos = separator.end()


def _mask_assignments(text: str) -> str:
    out, done = [], 0
    for start, name, end in _assignments(text):
        if start < done or not is_secret_name(name):
            continue
        found = _VALUE.match(text, end)  # read only now, and once: values can be long
        value = found.group() if found else ""
        if value == MASK:
            continue
        if value in ("Bearer", "Basic"):  # `Authorization: Bearer X`: the credential rule masks X
            continue
        out += [text[done:end], MASK]
        done = end + len(value)
    return "".join(out) + text[done:] if out else text


@dataclass(frozen=True)
class Redactor:
    """Masks known secret values and secret shapes in text and in JSON-like data."""

    secrets: tuple[str, ...] = ()  # longest first, so that a secret containing another is masked whole

    @classmethod
    def of(cls, values: Iterable[str]) -> Redactor:
        """A redactor for these known values (short ones are left to the shape rules)."""
        kept = {v for v in values if len(v) >= MIN_SECRET_LENGTH}
        return cls(tuple(sorted(kept, key=lambda v: (-len(v), v))))

    def text(self, text: str) -> str:
        """`text` with every known secret and every secret shape masked."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        if not _MAY_HAVE_SHAPE.search(text):
            return text
        if "@" in text:
            text = _mask_urls(text)
        text = _CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
        return _mask_assignments(text)

    def argv(self, args: Sequence[str]) -> list[str]:
        """A command line with the value of every secret-named flag masked (`--api-key X`, `--api-key=X`)."""
        out: list[str] = []
        hide_next = False
        for arg in args:
            if hide_next and not arg.startswith("-"):
                out.append(MASK)
                hide_next = False
                continue
            hide_next = False
            name, eq, _ = arg.partition("=")
            if arg.startswith("-") and is_secret_name(name):
                if eq:
                    out.append(f"{name}={MASK}")
                    continue
                hide_next = True
            out.append(self.text(arg))
        return out

    def value(self, data: Any) -> Any:
        """JSON-like data with secrets masked: secret-named fields whole, strings and command lines within."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, Mapping):
            out: dict[Any, Any] = {}
            for key, item in data.items():
                name = self.text(key) if isinstance(key, str) else key
                secret = isinstance(key, str) and is_secret_name(key)
                out[name] = MASK if secret and isinstance(item, str) and item else self.value(item)
            return out
        if isinstance(data, (list, tuple)):
            if data and all(isinstance(a, str) for a in data):
                return self.argv(data)
            return [self.value(item) for item in data]
        return data

    def bytes(self, body: bytes) -> bytes:
        """A text body (such as /metrics) with the known secrets masked."""
        for secret in self.secrets:
            raw = secret.encode()
            if raw in body:
                body = body.replace(raw, MASK.encode())
        return body


def _url_password(url: str | None) -> list[str]:
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [p for p in (parts.password, parts.username if parts.password is None else None) if p]
    return [*found, *(unquote(p) for p in found)]


def _header_values(headers: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    for name, value in headers.items():
        if is_secret_name(name):
            out.append(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.lower() in ("bearer", "basic", "token"):
                out.append(credential.strip())
    return out


def _argv_values(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(args[i + 1])
    return out


def _client_secrets(http: HttpClientConfig) -> list[str]:
    """Inline basic-auth passwords and authorization credentials (those in files are in env_secrets)."""
    basic, auth = http.basic_auth, http.authorization
    return [v for v in (basic and basic.password, auth and auth.credentials) if v]


def config_secrets(config: Config) -> tuple[str, ...]:
    """Every secret value the config holds, for `Redactor.of`."""
    values: list[str] = list(config.env_secrets)
    if config.api_token:
        values.append(config.api_token)
    # A discovery's template holds the canary key and credentials of every target it finds.
    templates = [sd.target for sd in config.file_sd_configs] + [sd.target for sd in config.docker_sd_configs]
    for t in (*config.targets, *templates):
        if t.canary.api_key:
            values.append(t.canary.api_key)
        values += _url_password(t.url) + _client_secrets(t.http)
        values += [v for k, v in t.env.items() if is_secret_name(k)]
        values += _argv_values(t.command)
    for n in config.notifiers:
        values += _header_values(n.headers) + _url_password(n.url) + _client_secrets(n.http)
    if (b := config.rule_backend) is not None:
        values += _header_values(b.headers) + _url_password(b.url) + _client_secrets(b.http)
    values += _url_password(config.gpus.dcgm_url)
    if config.gateway is not None:
        values += list(config.gateway.priority.api_keys)
    return tuple(v for v in values if v)


class ConfigRedactors:
    """The redactor of the live config, rebuilt only when a reload brings a new config object."""

    def __init__(self) -> None:
        self._config: object = None
        self._redactor = Redactor()

    def get(self, config: Config) -> Redactor:
        """The redactor for `config`."""
        if config is not self._config:
            self._config, self._redactor = config, Redactor.of(config_secrets(config))
        return self._redactor
